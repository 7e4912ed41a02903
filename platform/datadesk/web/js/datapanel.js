// The "Data" panel: the workspace's sources -> tables -> columns (descriptions, comments, row
// estimates, state), MCP servers, a "Sample" of a table's rows and "Ask about this table", which
// puts a question naming the source and table in the composer. Also the empty chat's "your data".

import { api } from "./api.js";
import { $, h, num } from "./dom.js";

const enc = encodeURIComponent;

function catalogUrl(app) {
  const ws = app.thread && app.thread.workspace;
  return `/api/workspace/catalog${ws ? `?workspace=${enc(ws)}` : ""}`;
}

const qualified = (t) => (t.schema && t.schema !== "main" ? `${t.schema}.${t.name}` : t.name);

export async function dataPanel(body, app) {
  const cat = await api("GET", catalogUrl(app));
  // an edit of workspace.toml that could not be applied: what is shown is the last good config
  const out = cat.config_error ? [h("p", { class: "error config-error" },
    `The workspace config has an error; the last good config is still in use: ${cat.config_error}`)] : [];
  if (!cat.sources.length && !cat.mcp.length) {
    body.replaceChildren(...out, h("p", { class: "muted" }, "No data you may query in this workspace."));
    return;
  }
  for (const src of cat.sources) out.push(sourceBlock(src, app));
  if (cat.mcp.length) {
    out.push(h("h3", {}, "Tool servers (MCP)"));
    const ul = h("ul", { class: "artifact-list" });
    for (const m of cat.mcp) {
      ul.append(h("li", { class: "artifact", dataset: { mcp: m.name } },
        h("div", { class: "artifact-name" }, m.name, h("span", { class: "muted" }, ` ${m.state}`)),
        m.reason ? h("div", { class: "warn-text" }, m.reason) : "",
        h("div", { class: "muted" }, m.tools.length ? m.tools.join(", ") : "no tools offered now")));
    }
    out.push(ul);
  }
  body.replaceChildren(...out);
}

function sourceBlock(src, app) {
  const head = h("h3", { dataset: { source: src.name } }, src.name,
    h("span", { class: "muted" }, ` ${src.dialect || src.kind || ""} · ${src.state}`));
  const parts = [head];
  if (src.description) parts.push(h("p", { class: "muted" }, src.description));
  if (src.reason) parts.push(h("p", { class: "warn-text" }, src.reason));
  const ul = h("ul", { class: "artifact-list" });
  for (const t of src.tables) ul.append(tableItem(src, t, app));
  if (!src.tables.length && !src.reason) parts.push(h("p", { class: "muted" }, "No tables."));
  parts.push(ul);
  return h("section", { class: "data-source", dataset: { source: src.name } }, ...parts);
}

function tableItem(src, t, app) {
  const facts = [t.kind];
  if (t.row_estimate !== null && t.row_estimate !== undefined) facts.push(`~${num(t.row_estimate)} rows`);
  const cols = h("ul", { class: "muted" }, ...t.columns.map((c) =>
    h("li", {}, h("code", {}, c.name), ` ${c.type}`, c.comment ? ` — ${c.comment}` : "")));
  const details = h("details", {}, h("summary", {}, `${t.columns.length} columns`), cols);
  const sample = h("div", { class: "data-sample" });
  const li = h("li", { class: "artifact", dataset: { table: qualified(t), source: src.name } },
    h("div", { class: "artifact-name" }, qualified(t), h("span", { class: "muted" }, ` ${facts.join(" · ")}`)),
    t.comment ? h("div", {}, t.comment) : "", details,
    h("div", { class: "links" },
      h("button", { type: "button", class: "sample", onclick: (e) => showSample(src, t, sample, e.target) }, "Sample"),
      " ",
      h("button", { type: "button", class: "ask", onclick: () => askAbout(src, t, app) }, "Ask about this table")),
    sample);
  return li;
}

async function showSample(src, t, into, button) {
  button.disabled = true;
  try {
    const s = await api("POST", "/api/workspace/catalog/sample", { source: src.name, table: qualified(t) });
    const table = h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ...s.columns.map((c) => h("th", {}, c)))),
      h("tbody", {}, ...s.rows.map((r) => h("tr", {}, ...r.map((v) => h("td", {}, v === null ? "" : String(v)))))));
    into.replaceChildren(h("div", { class: "muted" }, `${s.row_count} rows`), h("div", { class: "table-scroll" }, table));
  } catch (e) {
    into.replaceChildren(h("p", { class: "error" }, e.message));
  } finally {
    button.disabled = false;
  }
}

export function askAbout(src, t, app) {
  const where = src.name === "warehouse" ? "the warehouse" : `source ${src.name}`;
  const input = $("#input");
  input.value = `About the table ${qualified(t)} in ${where}: `;
  input.focus();
  if (app.closePanel) app.closePanel();
}

// The empty chat: a short summary of the data with a link that opens the panel.
export async function yourData(root, app, openPanel) {
  let cat;
  try {
    cat = await api("GET", catalogUrl(app));
  } catch {
    return; // the plain hint stays
  }
  const empty = root.children.length === 1 && root.firstElementChild.classList.contains("empty");
  if (!empty || (!cat.sources.length && !cat.mcp.length)) return; // a message came meanwhile
  const tables = cat.sources.reduce((n, s) => n + s.tables.length, 0);
  const names = cat.sources.map((s) => s.name).join(", ");
  const link = h("a", { href: "#", class: "open-data", onclick: (e) => { e.preventDefault(); openPanel(); } }, "See your data");
  root.replaceChildren(h("div", { class: "empty your-data" },
    h("p", {}, "Ask a question about your data to start."),
    h("p", { class: "muted" }, `Your data: ${cat.sources.length} source${cat.sources.length === 1 ? "" : "s"} (${names}) with ${tables} tables`
      + (cat.mcp.length ? `, ${cat.mcp.length} tool servers` : "") + ". "), link));
}
