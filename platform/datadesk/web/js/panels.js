// Side panels: the thread's artifacts, the memory panel and the context inspector.

import { api } from "./api.js";
import { IMAGE_FORMATS, REPORT_FORMATS } from "./chat.js";
import { bytes, confirmDialog, h, num, promptDialog, relative, toast, when } from "./dom.js";
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
    h("div", { class: "artifact-name" }, name, a.title ? null : h("span", { class: "muted" }, ` ${a.id}`)),
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
  const act = async (fn) => {
    try {
      await fn();
    } catch (e) {
      toast(e.message);
    }
    await rerender();
  };
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

// ---- context inspector -------------------------------------------------------------------
const SUMMARY_STATES = {
  off: "off", none: "none yet (nothing has left the window)", ok: "ok", stale: "stale", failed: "failed",
};

// The thread's task state (the user's goal and constraints, always sent) and its summary state.
async function taskStateSection(app, rerender) {
  const url = `/api/threads/${enc(app.thread.id)}/task-state`;
  let data;
  try {
    data = await api("GET", url);
  } catch (e) {
    return [h("p", { class: "error" }, e.message)];
  }
  const act = async (fn) => {
    try {
      await fn();
    } catch (e) {
      toast(e.message);
    }
    await rerender();
  };
  const s = data.summary;
  const state = h("p", { id: "ctx-summary-state", class: s.state === "failed" ? "warn-text" : "muted", dataset: { state: s.state } },
    `Summary state: ${SUMMARY_STATES[s.state] || s.state}${s.reason ? ` — ${s.reason}` : ""}`,
    s.dropped_unsummarised_through_seq ? `. Records up to #${s.dropped_unsummarised_through_seq} left the request unsummarised (the model was told).` : "");
  const active = data.task_state.items.filter((i) => i.status === "active");
  const list = active.length
    ? h("ul", { id: "ctx-task-state" }, ...active.map((i) => h("li", { dataset: { item: i.id } },
      i.kind === "goal" ? h("strong", {}, "Goal: ") : null, i.text,
      h("span", { class: "muted" }, ` (${{ user: "pinned by you", model: "noted from your words", summary: "from the summary" }[i.source] || i.source})`),
      " ", h("button", { type: "button", class: "unpin", onclick: () => act(() => api("DELETE", `${url}/${enc(i.id)}`)) }, "Remove"))))
    : h("p", { class: "muted", id: "ctx-task-state" }, "No goal or constraint recorded for this chat yet.");
  const input = h("input", { type: "text", id: "ctx-task-input", placeholder: "e.g. exclude holidays", maxlength: 500 });
  const kind = h("select", { id: "ctx-task-kind" }, h("option", { value: "constraint" }, "constraint"), h("option", { value: "goal" }, "goal"));
  const form = h("form", { class: "task-form", onsubmit: (e) => {
    e.preventDefault();
    if (input.value.trim()) act(() => api("POST", url, { text: input.value, kind: kind.value }));
  } }, input, " ", kind, " ", h("button", { type: "submit" }, "Pin"));
  return [h("h3", {}, "Task state (always sent to the model)"), state, list, form];
}

function row(label, value, id) {
  return h("tr", {}, h("th", { scope: "row" }, label), h("td", id ? { id } : {}, value));
}

function ranges(list) {
  return (list || []).map(([a, b]) => (a === b ? `${a}` : `${a}–${b}`)).join(", ") || "none";
}

export async function contextPanel(body, app) {
  if (!app.thread) {
    body.replaceChildren(h("p", { class: "muted" }, "Open a chat to inspect what the model saw."));
    return;
  }
  let m;
  try {
    m = await api("GET", `/api/threads/${enc(app.thread.id)}/context`);
  } catch (e) {
    body.replaceChildren(h("p", { class: "muted" }, e.status === 404 ? "No model request in this chat yet." : e.message));
    return;
  }
  const usage = m.usage || {};
  const regions = h("table", { class: "kv regions", id: "ctx-regions" },
    h("thead", {}, h("tr", {}, h("th", {}, "region"), h("th", {}, "tokens (est.)"))),
    h("tbody", {}, ...Object.entries(m.regions).map(([k, v]) => h("tr", { dataset: { region: k } }, h("th", { scope: "row" }, k),
      h("td", { id: `ctx-region-${k}` }, num(v))))));
  const overview = h("table", { class: "kv", id: "ctx-overview" }, h("tbody", {},
    row("model · profile", `${m.model} · ${m.profile}`),
    row("request (estimated)", `${num(m.estimated_tokens)} tokens of ${num(m.limit_tokens)} (${Math.round(m.level * 100)}%, ${m.water})`, "ctx-estimated"),
    row("budget", `${num(m.budget_tokens)} tokens`, "ctx-budget"),
    row("prompt tokens (provider)", usage.prompt_tokens !== undefined ? num(usage.prompt_tokens) : "not reported", "ctx-prompt"),
    row("cached tokens", usage.cached_tokens !== undefined ? num(usage.cached_tokens) : "not reported", "ctx-cached"),
    row("cache ratio", m.cache_ratio !== undefined && m.cache_ratio !== null ? `${Math.round(m.cache_ratio * 1000) / 10}%` : "n/a", "ctx-cache-ratio"),
    row("messages", num(m.messages), "ctx-messages"),
    row("records in the window", ranges(m.included), "ctx-included"),
    row("trimmed (left the window)", m.trimmed_through_seq ? `records 1–${m.trimmed_through_seq}` : "nothing", "ctx-trimmed"),
    row("tool results compacted to stubs", m.compacted && m.compacted.length ? m.compacted.join(", ") : "none", "ctx-compacted"),
    row("tool results capped", m.capped && m.capped.length ? m.capped.join(", ") : "none", "ctx-capped"),
    row("images sent", m.images && m.images.length ? m.images.join(", ") : "none", "ctx-images"),
    row("tools offered", (m.tools || []).join(", "), "ctx-tools"),
    m.gap_through_seq ? row("gap", `records up to ${m.gap_through_seq} left the window before a summary covered them`, "ctx-gap") : null,
  ));
  const out = [h("p", { class: "muted" }, `Last request: ${when(m.ts)}, step ${m.step} of turn ${m.turn_id}.`), overview,
    h("h3", {}, "Tokens per region"), regions];
  out.push(h("h3", {}, "Summary"));
  if (m.summary_detail) {
    const s = m.summary_detail;
    const dl = h("dl", { class: "summary", id: "ctx-summary" });
    dl.append(h("dt", {}, "covers"), h("dd", { id: "ctx-summary-covers" }, `records 1–${s.covers_through_seq}`));
    if (s.goal) dl.append(h("dt", {}, "goal"), h("dd", {}, s.goal));
    for (const key of ["active_constraints", "decisions", "data_refs", "open_items", "next_steps"]) {
      if (s[key] && s[key].length) dl.append(h("dt", {}, key.replace(/_/g, " ")), h("dd", {}, h("ul", {}, ...s[key].map((x) => h("li", {}, x)))));
    }
    if (s.state) dl.append(h("dt", {}, "state"), h("dd", {}, s.state));
    out.push(dl);
  } else {
    out.push(h("p", { class: "muted", id: "ctx-summary" }, "No summary in this request (the whole thread fit the window, or none was made yet)."));
  }
  out.push(...await taskStateSection(app, () => contextPanel(body, app)));
  out.push(h("h3", {}, "Memory injected"));
  if (m.memory_detail && m.memory_detail.length) {
    out.push(h("ul", { id: "ctx-memory" }, ...m.memory_detail.map((f) => h("li", { dataset: { fact: f.id } }, f.text,
      h("span", { class: "muted" }, ` (${f.kind || "?"}, ${f.status})`)))));
  } else {
    out.push(h("p", { class: "muted", id: "ctx-memory" }, "No memory facts were injected."));
  }
  body.replaceChildren(...out);
}
