// The upload card: what an uploaded file became (each sheet of a workbook its own artifact, the
// sheets skipped), how a CSV/TSV was read (the guessed dialect, what was left out), and a small
// form to read it again with other options (POST .../artifacts/{id}/reimport, app.reimport).

import { h, num } from "./dom.js";
import { gridButton } from "./grid.js";

const DELIMITERS = [[",", "comma ,"], [";", "semicolon ;"], ["\t", "tab"], ["|", "pipe |"]];
const DECIMALS = [[".", "point ."], [",", "comma ,"]];
const THOUSANDS = [["", "none"], [".", "point ."], [",", "comma ,"], [" ", "space"]];
const ENCODINGS = [["utf-8", "UTF-8"], ["utf-8-sig", "UTF-8 with BOM"], ["utf-16", "UTF-16"],
  ["utf-16-le", "UTF-16 LE"], ["utf-16-be", "UTF-16 BE"], ["cp1252", "Windows-1252"],
  ["iso-8859-1", "Latin-1"], ["iso-8859-15", "Latin-9"]];

function label(options, value) {
  const found = options.find(([v]) => v === value);
  return found ? found[1] : String(value);
}

// "semicolon ; · decimal comma , · thousands point . · header on line 4 · Windows-1252"
export function describeReading(r) {
  if (r.sheet !== undefined) {
    const parts = [`sheet ${r.sheet}`];
    if (r.header_row > 1) parts.push(`header on row ${r.header_row}`);
    if (r.merged_header) parts.push("two header rows joined");
    return parts.join(" · ");
  }
  const parts = [label(DELIMITERS, r.delimiter), `decimal ${label(DECIMALS, r.decimal)}`];
  if (r.thousands) parts.push(`thousands ${label(THOUSANDS, r.thousands)}`);
  parts.push(r.header_row ? `header on line ${r.header_row}` : "no header row");
  parts.push(label(ENCODINGS, r.encoding));
  return parts.join(" · ");
}

function select(name, options, value) {
  return h("select", { name }, options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)));
}

// What was left out of the rows, in words.
function leftOut(r) {
  const out = [];
  const skipped = (r.skipped || []).filter((s) => s && s.trim());
  if (skipped.length) out.push(h("p", { class: "muted" }, `Skipped above the header: ${skipped.join(" / ")}`));
  if (r.totals) {
    const totals = Array.isArray(r.totals) ? r.totals.filter((v) => v !== null).join(" | ") : r.totals;
    out.push(h("p", { class: "muted" }, `A totals line was left out: ${totals}`));
  }
  return out;
}

function reimportForm(app, a) {
  const r = a.reading;
  const error = h("span", { class: "reimport-error", role: "alert" });
  const button = h("button", { type: "submit" }, "Re-import");
  const form = h("form", { class: "reimport" },
    h("label", {}, "Delimiter ", select("delimiter", DELIMITERS, r.delimiter)),
    h("label", {}, "Decimal ", select("decimal", DECIMALS, r.decimal)),
    h("label", {}, "Thousands ", select("thousands", THOUSANDS, r.thousands || "")),
    h("label", { title: "The line of the header (1 = the first line; 0 = no header row)" }, "Header row ",
      h("input", { type: "number", name: "header_row", min: 0, step: 1, value: r.header_row, class: "header-row" })),
    h("label", {}, "Encoding ", select("encoding", ENCODINGS, r.encoding)),
    button, error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const body = {
      delimiter: f.get("delimiter"), decimal: f.get("decimal"), thousands: f.get("thousands"),
      header_row: Number(f.get("header_row")), encoding: f.get("encoding"),
    };
    error.textContent = "";
    button.disabled = true;
    button.textContent = "Re-importing…";
    try {
      await app.reimport(a.id, body);
    } catch (err) {
      error.textContent = err.message;
    } finally {
      button.disabled = false;
      button.textContent = "Re-import";
    }
  });
  return form;
}

// Whether a reading is worth a line: a CSV's always (its guess), a sheet's when something was skipped.
function worthSaying(r) {
  if (r.sheet === undefined) return true;
  return r.header_row > 1 || r.merged_header || (r.skipped || []).length > 0 || !!r.totals;
}

// How one artifact of the upload was read: the guess, what was left out, and the form.
function readingBox(app, a) {
  const r = a.reading;
  const box = h("details", { class: "reading" },
    h("summary", {}, `${r.chosen ? "Read with your options" : "Read as"}: ${describeReading(r)}`), leftOut(r));
  if (a.can_reimport) box.append(reimportForm(app, a));
  return box;
}

// The card of an upload: `ids` its artifacts (a workbook: one per sheet), `skipped` the sheets
// left out ("Notes (empty)").
export function uploadCard(app, artifacts, filename, ids, skipped = []) {
  const first = artifacts.get(ids[0]) || {};
  const el = h("div", { class: "msg user upload" }, "Uploaded ", h("strong", {}, filename || "a file"));
  const several = ids.length > 1 || (first.origin && first.origin.sheet);
  if (!several) {
    el.append(ids[0] ? h("span", { class: "muted" }, ` (artifact ${ids[0]}) `) : null,
      first.format === "parquet" ? gridButton(ids[0], filename) : null,
      first.reading ? readingBox(app, first) : null);
    return el;
  }
  const list = h("ul", { class: "upload-sheets" });
  for (const aid of ids) {
    const a = artifacts.get(aid) || {};
    const sheet = a.origin && a.origin.sheet;
    const size = a.rows !== null && a.rows !== undefined
      ? ` · ${num(a.rows)} row${a.rows === 1 ? "" : "s"} × ${a.columns} column${a.columns === 1 ? "" : "s"}` : "";
    list.append(h("li", {}, sheet ? h("strong", {}, sheet) : null, h("span", { class: "muted" }, ` artifact ${aid}${size} `),
      a.format === "parquet" ? gridButton(aid, a.name || filename) : null,
      a.reading && worthSaying(a.reading) ? readingBox(app, a) : null));
  }
  el.append(list);
  if (skipped && skipped.length) el.append(h("p", { class: "muted" }, `Sheets skipped: ${skipped.join(", ")}`));
  return el;
}
