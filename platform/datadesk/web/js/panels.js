// Side panels: the thread's artifacts and the memory panel (the context inspector: context.js).

import { api } from "./api.js";
import { IMAGE_FORMATS, REPORT_FORMATS } from "./chat.js";
import { acting, bytes, confirmDialog, h, num, promptDialog, relative, when } from "./dom.js";
import { GRID_FORMATS, gridButton } from "./grid.js";
import { chartThumb } from "./charts.js";

const enc = encodeURIComponent;

// ---- artifacts ---------------------------------------------------------------------------
export async function artifactsPanel(body, app) {
  if (!app.thread) {
    body.replaceChildren(h("p", { class: "muted" }, "Open a chat to see its artifacts."));
    return;
  }
  const list = await api("GET", `/api/threads/${enc(app.thread.id)}/artifacts`);
  if (!list.length) {
    body.replaceChildren(h("p", { class: "muted" }, "No tables, charts or files in this chat yet."));
    return;
  }
  const groups = { table: [], chart: [], file: [] };
  for (const a of list) {
    if (a.variant_of) continue; // a figure's dark-theme rendering: shown with the figure
    const kind = a.format === "parquet" ? "table" : isChart(a) ? "chart" : "file";
    groups[kind].push(a);
  }
  const out = [];
  for (const [kind, items] of Object.entries(groups)) {
    if (!items.length) continue;
    out.push(h("h3", {}, { table: "Tables", chart: "Charts", file: "Files" }[kind]));
    const ul = h("ul", { class: "artifact-list" });
    for (const a of items.sort((x, y) => y.created - x.created)) ul.append(artifactItem(a, app));
    out.push(ul);
  }
  body.replaceChildren(...out);
}

const isChart = (a) => IMAGE_FORMATS.has(a.format) || a.format === "vega-lite";

function artifactItem(a, app) {
  const name = a.title || a.origin.filename || (a.origin.tool ? `${a.origin.tool} result`
    : a.origin.source === "python" && isChart(a) ? "chart" : a.origin.source === "upload" ? "upload" : a.kind);
  const facts = [a.format === "vega-lite" ? "interactive chart" : a.format, bytes(a.bytes)];
  if (a.rows !== null && a.rows !== undefined) facts.push(`${num(a.rows)} rows`);
  if (a.status === "partial") facts.push(a.partial_by === "source" ? "partial (by the source)" : "partial");
  const li = h("li", { class: `artifact ${a.status}`, dataset: { artifact: a.id } },
    // a chart by its title (with its file's name when it is one), anything else with its id
    h("div", { class: "artifact-name" }, name, h("span", { class: "muted" }, ` ${a.title ? a.origin.filename || "" : a.id}`)),
    h("div", { class: "muted" }, facts.join(" · ")));
  if (isChart(a) && a.status !== "expired") li.prepend(chartThumb(a));
  if (a.status === "expired") {
    li.append(h("div", { class: "warn-text" }, `expired ${relative(a.expired_at)}`));
    if (a.can_requery) {
      li.append(h("button", { type: "button", class: "requery", onclick: (e) => app.requery(a.id, e.target) }, "Re-run query"));
    }
    return li;
  }
  li.append(h("div", { class: "muted" }, a.expires_at ? `expires ${relative(a.expires_at)} if unused` : "kept until the chat is cleared"));
  const dl = `/api/artifacts/${enc(a.id)}/download`;
  const links = h("div", { class: "links" }, h("a", { href: dl, download: "" }, "Download"));
  if (a.format === "parquet") links.append(" · ", h("a", { href: `${dl}?format=csv`, download: "" }, "CSV"));
  if (GRID_FORMATS.has(a.format)) links.append(" ", gridButton(a.id, name));
  if (REPORT_FORMATS.has(a.format) || IMAGE_FORMATS.has(a.format)) {
    links.append(" · ", h("a", { href: `/api/artifacts/${enc(a.id)}/view`, target: "_blank", rel: "noopener" }, "Open"));
  }
  li.append(links);
  return li;
}

// ---- memory ------------------------------------------------------------------------------
const STATUS_TITLES = {
  active: "Active: the assistant uses these",
  candidate: "Candidates: confirm or reject",
  conflict: "Conflicts: pick which one holds",
  superseded: "Superseded",
  forgotten: "Forgotten",
};

export async function memoryPanel(body, app) {
  let data;
  try {
    data = await api("GET", "/api/memory");
  } catch (e) {
    body.replaceChildren(h("p", { class: "error" }, e.message));
    return;
  }
  const rerender = () => memoryPanel(body, app);
  const act = acting(rerender);
  const toggle = h("input", { type: "checkbox", id: "memory-switch", checked: data.enabled });
  toggle.addEventListener("change", () => act(() => api("PUT", "/api/memory/settings", { enabled: toggle.checked })));
  const out = [
    h("label", { class: "switch" }, toggle, " Use my memory in this workspace"),
    h("p", { class: "muted" }, data.enabled
      ? `Stable preferences and facts the assistant keeps across chats (up to ${data.limits.max_active} active).`
      : "Memory is off for you: nothing is injected or saved. You can still review and delete what is stored."),
  ];
  let any = false;
  for (const status of Object.keys(STATUS_TITLES)) {
    const facts = data.facts[status] || [];
    if (!facts.length) continue;
    any = true;
    const ul = h("ul", { class: "fact-list" });
    for (const f of facts) ul.append(factItem(f, act));
    out.push(h("section", { class: `facts ${status}`, dataset: { status } }, h("h3", {}, STATUS_TITLES[status]), ul));
  }
  if (!any) out.push(h("p", { class: "muted", id: "memory-empty" }, "Nothing remembered yet."));
  else {
    out.push(h("button", {
      type: "button", class: "danger", id: "memory-delete-all",
      onclick: async () => {
        if (await confirmDialog("Delete all memory?", "Every fact in this workspace is deleted for good, with its history. Chats are not touched.", "Delete all")) {
          act(() => api("DELETE", "/api/memory"));
        }
      },
    }, "Delete all memory"));
  }
  body.replaceChildren(...out);
}

function factItem(f, act) {
  const src = f.provenance || {};
  const meta = [f.kind, f.scope === "workspace" ? "this workspace" : f.scope.replace(/^project:/, "project "),
    `from ${src.source || "user"}${src.thread ? ` in thread ${src.thread}` : ""}${src.after_tool_output ? " (after tool output)" : ""}`,
    when(f.updated || f.created)];
  const li = h("li", { class: "fact", dataset: { fact: f.id } },
    h("div", { class: "fact-text" }, f.text),
    h("div", { class: "muted" }, meta.join(" · ")),
    f.reason ? h("div", { class: "muted" }, f.reason) : null,
    f.conflicts_with_text ? h("div", { class: "muted conflicts-with" }, `contradicts: “${f.conflicts_with_text}”`) : null);
  const buttons = h("div", { class: "fact-actions" });
  if (f.status === "candidate") {
    buttons.append(h("button", { type: "button", class: "confirm", onclick: () => act(() => api("POST", `/api/memory/${enc(f.id)}/confirm`)) }, "Confirm"));
  }
  if (f.status === "conflict") {
    buttons.append(
      h("button", { type: "button", class: "keep-new", onclick: () => act(() => api("POST", `/api/memory/${enc(f.id)}/resolve`, { keep: "new" })) }, "Keep this"),
      h("button", { type: "button", class: "keep-old", onclick: () => act(() => api("POST", `/api/memory/${enc(f.id)}/resolve`, { keep: "old" })) }, "Keep the old one"),
      h("button", { type: "button", class: "keep-both", onclick: () => act(() => api("POST", `/api/memory/${enc(f.id)}/resolve`, { keep: "both" })) }, "Keep both"),
    );
  }
  if (f.status === "active" || f.status === "candidate") {
    buttons.append(h("button", {
      type: "button", class: "edit",
      onclick: async () => {
        const text = await promptDialog("Edit this fact", f.text);
        if (text !== null && text.trim() && text !== f.text) act(() => api("POST", `/api/memory/${enc(f.id)}/edit`, { text }));
      },
    }, "Edit"));
  }
  buttons.append(h("button", {
    type: "button", class: "danger delete-fact",
    onclick: async () => {
      const label = f.status === "candidate" ? "Reject" : "Delete";
      if (await confirmDialog(`${label} this fact?`, `“${f.text}” is deleted for good, with its history.`, label)) {
        act(() => api("DELETE", `/api/memory/${enc(f.id)}`));
      }
    },
  }, f.status === "candidate" ? "Reject" : "Delete"));
  li.append(buttons);
  return li;
}
