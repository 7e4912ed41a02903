// The grid as an explorer (issue 32): a column's profile (GET /api/artifacts/{id}/profile), a
// group-by (GET .../groups), "Chart this view" (GET .../chart-step, run as a python step the model
// sees) and "Ask about this view" (a question in the composer carrying the view's definition).

import { api } from "./api.js";
import { h, num } from "./dom.js";

const enc = encodeURIComponent;
const SVG = "http://www.w3.org/2000/svg";
export const TRUNCATE = ["hour", "day", "week", "month", "year"];
const isDate = (c) => /^(DATE|TIMESTAMP)/.test(c.type);

function svg(tag, attrs = {}, ...kids) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  el.append(...kids);
  return el;
}

function short(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "number") return Number.isInteger(v) ? num(v) : v.toLocaleString(undefined, { maximumFractionDigits: 3 });
  return String(v);
}

// bars of a histogram; a click on a bar calls pick(bin)
function histogram(bins, pick) {
  const W = 300, H = 90;
  const top = Math.max(1, ...bins.map((b) => b.count));
  const w = W / bins.length;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "profile-hist", role: "img",
    "aria-label": `Histogram, ${bins.length} bins` });
  bins.forEach((b, i) => {
    const bh = Math.max(b.count ? 1 : 0, (b.count / top) * (H - 4));
    const bar = svg("rect", { x: i * w + 0.5, y: H - bh, width: Math.max(1, w - 1), height: bh, class: "bar", tabindex: "0" },
      svg("title", {}, `${short(b.low)} – ${short(b.high)}: ${num(b.count)} rows`));
    bar.addEventListener("click", () => pick(b));
    bar.addEventListener("keydown", (e) => { if (e.key === "Enter") pick(b); });
    chart.append(bar);
  });
  return chart;
}

// The profile of `column` over the FULL artifact, drawn into `box`; clicking a bar or a top value
// adds a filter through grid.addFilter.
export async function showProfile(grid, column, box) {
  box.hidden = false;
  box.replaceChildren(h("p", { class: "muted" }, `Profiling ${column}…`));
  let p;
  try {
    p = await api("GET", `/api/artifacts/${enc(grid.aid)}/profile?column=${enc(column)}`);
  } catch (e) {
    box.replaceChildren(h("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  const close = h("button", { type: "button", class: "icon-btn", "aria-label": "Close the profile" }, "✕");
  close.addEventListener("click", () => { box.hidden = true; grid.profiled = null; });
  const stat = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
  const stats = h("dl", { class: "profile-stats" }, ...stat("rows", num(p.rows)), ...stat("nulls", num(p.nulls)),
    ...stat("distinct", num(p.distinct)));
  if ("min" in p) stats.append(...stat("min", short(p.min)), ...stat("max", short(p.max)));
  if ("mean" in p) stats.append(...stat("mean", short(p.mean)));
  const kids = [h("div", { class: "profile-head" }, h("h3", {}, column), h("span", { class: "muted" }, p.type.toLowerCase()), close), stats];
  if (p.histogram) {
    kids.push(histogram(p.histogram, (b) => grid.addFilter({ column, op: "between", value: [String(b.low), String(b.high)] })),
      h("p", { class: "muted small" }, "Click a bar to filter to its range."));
  }
  if (p.top) {
    const list = h("ol", { class: "profile-top" }, ...p.top.map((t) => {
      const b = h("button", { type: "button", class: "linkish" }, show(t.value));
      b.addEventListener("click", () => grid.addFilter({ column, op: "=", value: String(t.value) }));
      return h("li", {}, b, " ", h("span", { class: "muted" }, num(t.count)));
    }));
    kids.push(list);
    if (p.top_other) kids.push(h("p", { class: "muted small" }, `${num(p.top_other)} rows have other values`));
  }
  box.replaceChildren(...kids);
  box.dataset.column = column;
}

function show(v) {
  return v === null ? "null" : typeof v === "boolean" ? String(v) : String(v);
}

// The group-by form: one key (a time column may be truncated) and count / sum / mean.
export function groupForm(grid) {
  const by = h("select", { id: "grid-group-by", "aria-label": "Group by" });
  const sum = h("select", { id: "grid-group-sum", "aria-label": "Sum of" });
  const mean = h("select", { id: "grid-group-mean", "aria-label": "Mean of" });
  const form = h("form", { class: "grid-filter grid-group", id: "grid-group-form" }, h("span", { class: "muted" }, "Group by"),
    by, h("span", { class: "muted" }, "sum"), sum, h("span", { class: "muted" }, "mean"), mean, h("button", { type: "submit" }, "Group"));
  form.fill = (cols) => {
    if (by.options.length) return;
    for (const c of cols) {
      by.append(h("option", { value: c.name }, c.name));
      if (isDate(c)) for (const t of TRUNCATE) by.append(h("option", { value: `${c.name}:${t}` }, `${c.name} by ${t}`));
    }
    const nums = cols.filter((c) => c.kind === "number");
    for (const sel of [sum, mean]) sel.replaceChildren(h("option", { value: "" }, "—"), ...nums.map((c) => h("option", { value: c.name }, c.name)));
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const aggs = ["count"];
    if (sum.value) aggs.push(`sum:${sum.value}`);
    if (mean.value) aggs.push(`mean:${mean.value}`);
    grid.setGroup({ by: [by.value], aggs });
  });
  return form;
}

export function groupQuery(group, q = new URLSearchParams()) {
  for (const b of group.by) q.append("by", b);
  for (const a of group.aggs) q.append("agg", a);
  if (group.sort) q.append("sort", group.sort);
  return q;
}

export function fetchGroups(grid) {
  const q = groupQuery(grid.view.group);
  if (grid.view.filters.length) q.set("filter", JSON.stringify(grid.view.filters));
  q.set("limit", "1000");
  return api("GET", `/api/artifacts/${enc(grid.aid)}/groups?${q}`);
}

// The view in words and as data (what "Ask about this view" carries).
export function viewDefinition(grid) {
  const v = grid.view;
  const def = { artifact: grid.aid, filters: v.filters };
  if (v.group) Object.assign(def, { group_by: v.group.by, aggregates: v.group.aggs });
  if (v.sort.length) def.sort = v.sort.map((s) => `${s.column}:${s.desc ? "desc" : "asc"}`);
  return def;
}

export function describeFilter(f) {
  if (f.op === "between") return `${f.column} between ${f.value[0]} and ${f.value[1]}`;
  if (f.op === "in") return `${f.column} in ${f.value.join(", ")}`;
  return `${f.column} ${f.op}${f.value !== undefined ? ` ${f.value}` : ""}`;
}

export function askText(grid) {
  const v = grid.view;
  const parts = [v.filters.length ? v.filters.map(describeFilter).join("; ") : "all rows"];
  if (v.group) parts.push(`grouped by ${v.group.by.join(", ")} (${v.group.aggs.join(", ")})`);
  if (v.sort.length) parts.push(`sorted by ${v.sort.map((s) => `${s.column} ${s.desc ? "desc" : "asc"}`).join(", ")}`);
  const about = grid.question ? ` (from “${grid.question}”)` : "";
  return `About this view of table ${grid.aid}${about}: ${parts.join(" · ")}.\n` +
    `View: ${JSON.stringify(viewDefinition(grid))}\n\n`;
}

// "Ask about this view": the question starts in the composer, the grid closes.
export function askAboutView(grid) {
  const input = document.querySelector("#input");
  if (!input) return;
  input.value = askText(grid) + input.value;
  grid.dlg.close();
  input.dispatchEvent(new Event("input", { bubbles: true }));
  input.focus();
  input.setSelectionRange(input.value.length, input.value.length);
}

// "Chart this view": the server writes the python step for the view, it runs as the user's step.
export async function chartView(grid) {
  const q = grid.view.group ? groupQuery(grid.view.group) : new URLSearchParams();
  if (grid.view.filters.length) q.set("filter", JSON.stringify(grid.view.filters));
  if (!grid.view.group && grid.profiled) q.set("column", grid.profiled);
  const step = await api("GET", `/api/artifacts/${enc(grid.aid)}/chart-step?${q}`);
  const app = window.datadesk; // the app object (app.js): its conversation and open thread
  if (!app || !app.conv || !app.thread || app.thread.id !== step.thread) {
    throw new Error("Open the chat this table belongs to, then chart the view from there.");
  }
  grid.dlg.close();
  const { runStep } = await import("./steps.js");
  await runStep(app.conv, step.thread, { tool: step.tool, arguments: step.arguments });
}
