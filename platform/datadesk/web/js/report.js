// The report page of a thread (issue 32): pin a chart, a table (or the grid's current view) or a
// paragraph of an answer from the chat; the page (#t=<tid>&view=report) shows the pinned items in
// order with the title and the analyst's notes, to reorder, annotate, unpin, print (browser PDF)
// and export (GET /api/threads/{tid}/report?format=html|md). `renderReport(root, report, opts)`
// draws a report from its JSON, editable or read-only (a shared view can use it).

import { api } from "./api.js";
import { $, h, num, promptDialog, setHtml, toast } from "./dom.js";
import { currentView } from "./grid.js";
import { vegaChart } from "./charts.js";

const enc = encodeURIComponent;
const SVG_NS = "http://www.w3.org/2000/svg";
// 24x24 outline paths (stroke in the text colour: reads in both themes, never an emoji)
const ICONS = {
  pin: ["M6 3h9l3 3v15H6z", "M12 10v6", "M9 13h6"], // a page with a plus: "add to the report"
  up: ["M12 19V5", "M6 11l6-6 6 6"],
  down: ["M12 5v14", "M6 13l6 6 6-6"],
  remove: ["M6 6l12 12", "M18 6L6 18"],
};

function svgIcon(name) {
  const svg = document.createElementNS(SVG_NS, "svg");
  for (const [k, v] of Object.entries({ viewBox: "0 0 24 24", width: "16", height: "16", fill: "none", stroke: "currentColor",
    "stroke-width": "2", "stroke-linecap": "round", "stroke-linejoin": "round", "aria-hidden": "true" })) svg.setAttribute(k, v);
  svg.classList.add("icon", `icon-report-${name}`);
  for (const d of ICONS[name]) {
    const p = document.createElementNS(SVG_NS, "path");
    p.setAttribute("d", d);
    svg.append(p);
  }
  return svg;
}

function when(ts) {
  return new Date(ts * 1000).toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

function markText(m) {
  if (m.stale) return `Written before the refresh at ${when(m.at)}: its figures may be out of date.`;
  if (!m.changed) return `Refreshed at ${when(m.at)}: unchanged.`;
  return `Updated by refresh at ${when(m.at)}: ${m.changes.join("; ")}.`;
}

// ---- pinning from the chat ---------------------------------------------------------------
async function pin(app, body, what) {
  if (!app.thread) return;
  try {
    const r = await api("POST", `/api/threads/${enc(app.thread.id)}/report/items`, body);
    toast(`Pinned ${what} to the report (${r.report.items.length} item${r.report.items.length === 1 ? "" : "s"}).`, "info");
  } catch (e) {
    toast(e.message);
  }
}

function pinButton(label, title, onclick) {
  return h("button", { type: "button", class: "report-pin", title, "aria-label": title,
    onclick: (e) => { e.stopPropagation(); onclick(); } }, svgIcon("pin"), h("span", { class: "report-pin-text" }, label));
}

const ARTIFACT_SRC = /^\/api\/artifacts\/([A-Za-z0-9_-]{1,64})\/view$/;

// the answer's top-level blocks, as the server counts them (threads/report/pins.py answer_blocks)
function blocksOf(bubble) {
  return [...bubble.children].filter((el) => !el.matches("p.error, button, .report-pin, [data-ui]"));
}

function decorate(app, root) {
  for (const img of root.querySelectorAll("img.chart:not([data-pinnable])")) {
    const m = ARTIFACT_SRC.exec(new URL(img.src, location.href).pathname);
    if (!m) continue;
    img.dataset.pinnable = "1";
    img.after(pinButton("Pin chart", "Pin this chart to the report", () => pin(app, { kind: "chart", artifact: m[1] }, "the chart")));
  }
  for (const fig of root.querySelectorAll("figure.vl-chart[data-artifact]:not([data-pinnable])")) {
    if (fig.closest(".report-page")) continue; // a chart already on the report page
    fig.dataset.pinnable = "1";
    const aid = fig.dataset.artifact;
    fig.after(pinButton("Pin chart", "Pin this chart to the report", () => pin(app, { kind: "chart", artifact: aid }, "the chart")));
  }
  for (const box of root.querySelectorAll(".tool-notice.info[data-artifact]:not([data-pinnable])")) {
    box.dataset.pinnable = "1";
    if (!box.querySelector(".open-grid")) continue; // a table (Parquet) result: the grid reads it
    const aid = box.dataset.artifact;
    box.append(" ", pinButton("Pin table", "Pin this table to the report", () => pin(app, { kind: "table", artifact: aid }, "the table")));
  }
  for (const bubble of root.querySelectorAll(".msg.assistant[data-seq]:not([data-pinnable])")) {
    bubble.dataset.pinnable = "1";
    const seq = Number(bubble.dataset.seq);
    blocksOf(bubble).forEach((block, i) => {
      block.classList.add("report-pinnable");
      const btn = pinButton("Pin", "Pin this paragraph to the report",
        () => pin(app, { kind: "paragraph", seq, paragraph: i }, "the paragraph"));
      btn.classList.add("report-pin-block");
      if (block.matches("table, ul, ol, hr")) block.before(btn); // elements that cannot hold a button
      else block.append(btn);
    });
  }
}

// the grid's "Pin view": the open table with its current sort and filters
function gridPin(app, dlg) {
  const head = dlg.querySelector(".grid-head");
  if (!head || head.querySelector(".report-pin")) return;
  const btn = pinButton("Pin view", "Pin this table view (its sort and filters) to the report", () => {
    const v = currentView();
    if (!v) return;
    if (v.grouped) return toast("A grouped view cannot be pinned yet: remove the group-by to pin the rows.");
    const view = { sort: v.sort };
    if (v.filters.length) view.filter = JSON.stringify(v.filters);
    pin(app, { kind: "table", artifact: v.artifact, view }, "the table view");
  });
  btn.id = "grid-pin";
  const close = head.querySelector("#grid-close");
  if (close) close.before(btn);
  else head.append(btn);
}

// ---- the report page ---------------------------------------------------------------------
function tableOf(t) {
  const numeric = t.columns.map((c) => c.kind === "number");
  const cls = (i) => (numeric[i] ? "num" : null);
  const shown = t.data.length;
  const parts = [shown < t.rows ? `${num(shown)} of ${num(t.rows)} rows` : `${num(t.rows)} rows`];
  if (t.filters && t.filters.length) parts.push(`filtered: ${t.filters.map((f) => `${f.column} ${f.op} ${f.value ?? ""}`.trim()).join(", ")}`);
  if (t.sort && t.sort.length) parts.push(`sorted by ${t.sort.map((s) => `${s.column} ${s.desc ? "desc" : "asc"}`).join(", ")}`);
  return h("div", { class: "report-table" }, h("table", {},
    h("thead", {}, h("tr", {}, t.columns.map((c, i) => h("th", { scope: "col", class: cls(i) }, c.name)))),
    h("tbody", {}, t.data.map((row) => h("tr", {}, row.map((v, i) => h("td", { class: cls(i) },
      v === null ? "" : typeof v === "number" ? num(v) : String(v))))))),
  h("p", { class: "muted report-caption" }, parts.join(" · ")));
}

function itemBody(item) {
  if (item.missing) return h("p", { class: "notice warn" }, item.missing);
  if (item.kind === "chart" && item.format === "vega-lite") return vegaChart(item.artifact, item.title); // drawn interactively
  if (item.kind === "chart") return h("img", { class: "report-chart", src: `/api/artifacts/${enc(item.artifact)}/view`, alt: item.label || "chart" });
  if (item.kind === "table" && item.table) return tableOf(item.table);
  const div = h("div", { class: "report-text markdown" });
  setHtml(div, item.html || "");
  return div;
}

function noteBox(item, opts) {
  const shown = h("p", { class: "report-note-text" }, item.note || "");
  shown.hidden = !item.note;
  if (!opts.editable) return shown;
  const area = h("textarea", { class: "report-note-input", rows: "2", maxlength: "2000", placeholder: "Add a note for readers…",
    "aria-label": `Note on item ${item.label || item.kind}` });
  area.value = item.note || "";
  area.addEventListener("change", async () => {
    try {
      await api("PATCH", `/api/threads/${enc(opts.tid)}/report/items/${enc(item.id)}`, { note: area.value });
      shown.textContent = area.value;
      shown.hidden = !area.value;
      toast("Note saved.", "info");
    } catch (e) {
      toast(e.message);
    }
  });
  return h("div", { class: "report-note" }, area, shown);
}

function itemTools(report, i, opts) {
  const item = report.items[i];
  const ids = report.items.map((x) => x.id);
  const move = (d) => async () => {
    const order = ids.slice();
    [order[i], order[i + d]] = [order[i + d], order[i]];
    opts.redraw(await api("PUT", `/api/threads/${enc(opts.tid)}/report/order`, { order }));
  };
  const tool = (name, label, fn, disabled) => h("button", { type: "button", class: `icon-btn report-${name}`, title: label,
    "aria-label": label, disabled: !!disabled, onclick: () => fn().catch((e) => toast(e.message)) }, svgIcon(name));
  return h("span", { class: "report-item-tools" },
    tool("up", "Move up", move(-1), i === 0), tool("down", "Move down", move(1), i === ids.length - 1),
    tool("remove", "Unpin", async () => opts.redraw(await api("DELETE", `/api/threads/${enc(opts.tid)}/report/items/${enc(item.id)}`))));
}

// Draw `report` (GET .../report) into `root`; opts: {editable, tid, redraw(report)}.
export function renderReport(root, report, opts = {}) {
  const meta = [`${report.items.length} item${report.items.length === 1 ? "" : "s"}`];
  if (report.refreshed) meta.push(`last refreshed ${when(report.refreshed.at)}`);
  const title = h("h1", { class: "report-title" }, report.title);
  const head = h("header", { class: "report-head" }, title, h("p", { class: "muted" }, meta.join(" · ")));
  if (opts.editable) {
    head.append(h("button", { type: "button", class: "report-rename", onclick: async () => {
      const t = await promptDialog("Title of the report", report.title);
      if (t === null) return;
      try {
        opts.redraw(await api("PUT", `/api/threads/${enc(opts.tid)}/report`, { title: t }));
      } catch (e) {
        toast(e.message);
      }
    } }, "Rename"));
  }
  const list = h("ol", { class: "report-items" }, report.items.map((item, i) => h("li", { class: `report-item ${item.kind}`, dataset: { pin: item.id } },
    h("div", { class: "report-item-head" }, h("h2", {}, `${i + 1}. ${item.label || item.kind}`), opts.editable ? itemTools(report, i, opts) : null),
    item.mark ? h("p", { class: `report-mark ${item.mark.changed ? "" : "same"}`, role: "note" }, markText(item.mark)) : null,
    itemBody(item), noteBox(item, opts))));
  const empty = report.items.length ? null : h("p", { class: "report-empty muted" },
    "Nothing is pinned yet. In the chat, use “Pin chart”, “Pin table” (or “Pin view” in the grid) and the pin beside a paragraph of an answer.");
  root.replaceChildren(h("article", { class: "report-page" }, head, empty, list));
}

function toolbar(app, tid) {
  const base = `/api/threads/${enc(tid)}/report?format=`;
  return h("div", { class: "report-toolbar", role: "toolbar", "aria-label": "Report" },
    h("button", { type: "button", id: "report-back", onclick: () => { wanted = null; location.hash = `t=${tid}`; } }, "← Back to the chat"),
    h("span", { class: "spacer" }),
    h("button", { type: "button", id: "report-print", title: "Print, or save as PDF from the print dialog", onclick: () => window.print() }, "Print / PDF"),
    h("a", { id: "report-export-html", class: "button", href: `${base}html`, target: "_blank", rel: "noopener" }, "HTML"),
    h("a", { id: "report-export-md", class: "button", href: `${base}md`, download: "" }, "Markdown"));
}

async function showReport(app, tid) {
  const view = $("#report-view");
  const page = h("div", { class: "report-body" });
  view.replaceChildren(toolbar(app, tid), page);
  view.hidden = false;
  document.body.classList.add("report-open");
  const redraw = (report) => renderReport(page, report, { editable: true, tid, redraw });
  try {
    redraw(await api("GET", `/api/threads/${enc(tid)}/report`));
  } catch (e) {
    page.replaceChildren(h("p", { class: "notice error" }, e.message));
  }
}

function hideReport() {
  const view = $("#report-view");
  if (view) view.hidden = true;
  document.body.classList.remove("report-open");
}

// The report shows while the hash asks for it (#t=<tid>&view=report). Opening a thread sets
// the hash to #t=<tid> (app.js): for the thread whose report was asked for, that keeps the
// report (restored in place); "Back to the chat" or another thread leaves it.
let wanted = null; // the thread whose report is asked for
let retry = null;

function route(app, tries = 0) {
  clearTimeout(retry);
  const q = new URLSearchParams(location.hash.slice(1));
  const t = q.get("t");
  if (q.get("view") === "report" && t) wanted = t;
  else if (t !== wanted) wanted = null;
  if (!wanted) return hideReport();
  if (app.thread && app.thread.id === wanted) {
    if (q.get("view") !== "report") history.replaceState(null, "", `#t=${enc(wanted)}&view=report`);
    return showReport(app, wanted);
  }
  if (tries < 150) retry = setTimeout(() => route(app, tries + 1), 100); // the thread is still opening
}

export function initReport(app) {
  const btn = $("#open-report");
  if (!btn || btn.dataset.wired) return;
  btn.dataset.wired = "1";
  btn.addEventListener("click", () => { if (app.thread) location.hash = `t=${app.thread.id}&view=report`; });
  const list = $("#thread-list");
  if (list) list.addEventListener("click", () => { wanted = null; }, true); // a thread picked: its chat
  route(app);
  window.addEventListener("hashchange", () => route(app));
  const messages = $("#messages");
  new MutationObserver(() => decorate(app, messages)).observe(messages, { childList: true, subtree: true });
  new MutationObserver(() => { const dlg = $("#grid-dialog"); if (dlg) gridPin(app, dlg); })
    .observe(document.body, { childList: true });
}
