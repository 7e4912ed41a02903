// The Context panel: first what an analyst asks ("did it see my constraint, my preference,
// which data?"): the task state, the memory facts and the data the last request carried, each
// linking to its message or card; then the numbers of that request (tokens per region, the
// window, the cache) and the summary it carried.

import { api } from "./api.js";
import { acting, h, num, when } from "./dom.js";
import { revealSeq } from "./history.js";

const enc = encodeURIComponent;
const SUMMARY_STATES = {
  off: "off", none: "none yet (nothing has left the window)", ok: "ok", stale: "stale", failed: "failed",
};
const SOURCES = { user: "pinned by you", model: "noted from your words", summary: "from the summary" };
const PLUMBING = new Set(["remember", "forget", "note_constraint", "drop_constraint", "load_skill", "compact", "read_tool_result"]);

function inWindow(seq, ranges) {
  return (ranges || []).some(([a, b]) => seq >= a && seq <= b);
}

// A link that scrolls the chat to record `seq` (its message or card) and marks it.
function seqLink(app, seq, text) {
  return h("a", { href: "#", class: "ctx-goto", dataset: { seq: String(seq) }, onclick: (e) => {
    e.preventDefault();
    if (app.thread) revealSeq(app.conv, app.thread.id, seq);
  } }, text);
}

// The thread's task state (the user's goal and constraints, always sent) and its summary state.
async function taskStateSection(app, rerender) {
  const url = `/api/threads/${enc(app.thread.id)}/task-state`;
  let data;
  try {
    data = await api("GET", url);
  } catch (e) {
    return [h("p", { class: "error" }, e.message)];
  }
  const act = acting(rerender);
  const s = data.summary;
  const state = h("p", { id: "ctx-summary-state", class: s.state === "failed" ? "warn-text" : "muted", dataset: { state: s.state } },
    `Summary state: ${SUMMARY_STATES[s.state] || s.state}${s.reason ? ` — ${s.reason}` : ""}`,
    s.dropped_unsummarised_through_seq ? `. Records up to #${s.dropped_unsummarised_through_seq} left the request unsummarised (the model was told).` : "");
  const active = data.task_state.items.filter((i) => i.status === "active");
  const list = active.length
    ? h("ul", { id: "ctx-task-state" }, ...active.map((i) => h("li", { dataset: { item: i.id } },
      i.kind === "goal" ? h("strong", {}, "Goal: ") : null, i.text, " ",
      h("span", { class: "muted" }, "(", i.user_seq ? seqLink(app, i.user_seq, SOURCES[i.source] || i.source) : SOURCES[i.source] || i.source, ")"),
      " ", h("button", { type: "button", class: "unpin", onclick: () => act(() => api("DELETE", `${url}/${enc(i.id)}`)) }, "Remove"))))
    : h("p", { class: "muted", id: "ctx-task-state" }, "No goal or constraint recorded for this chat yet.");
  const input = h("input", { type: "text", id: "ctx-task-input", placeholder: "e.g. exclude holidays", maxlength: 500 });
  const kind = h("select", { id: "ctx-task-kind" }, h("option", { value: "constraint" }, "constraint"), h("option", { value: "goal" }, "goal"));
  const form = h("form", { class: "task-form", onsubmit: (e) => {
    e.preventDefault();
    if (input.value.trim()) act(() => api("POST", url, { text: input.value, kind: kind.value }));
  } }, input, " ", kind, " ", h("button", { type: "submit" }, "Pin"));
  return [h("h3", {}, "Task state (always sent to the model)"), list, form, state];
}

function memorySection(app, m) {
  const open = h("a", { href: "#", id: "ctx-open-memory", onclick: (e) => {
    e.preventDefault();
    app.showPanel("memory");
  } }, "Open Memory");
  const facts = m ? m.memory_detail || [] : [];
  const body = facts.length
    ? h("ul", { id: "ctx-memory" }, ...facts.map((f) => h("li", { dataset: { fact: f.id } }, f.text,
      h("span", { class: "muted" }, ` (${f.kind || "?"}, ${f.status})`))))
    : h("p", { class: "muted", id: "ctx-memory" }, m ? "No memory facts were sent with the last request." : "No model request yet.");
  return [h("h3", {}, "Memory it was given ", h("small", {}, open)), body];
}

// The tool results (queries, code, uploads) inside the last request's window, from the chat's cards.
function dataSection(app, m) {
  const items = [];
  for (const wrap of app.conv.root.querySelectorAll(".tool-wrap[data-seq]")) {
    const seq = Number(wrap.dataset.seq);
    const card = wrap.querySelector(".tool-card");
    const tool = card ? card.dataset.tool : "";
    if (!m || !tool || PLUMBING.has(tool) || !inWindow(seq, m.included)) continue;
    const what = (card.querySelector(".tool-section pre") || {}).textContent || "";
    const status = (card.querySelector(".tool-status") || {}).textContent || "";
    items.push(h("li", { dataset: { seq: String(seq) } }, seqLink(app, seq, tool),
      what ? h("code", { class: "ctx-data-what" }, ` ${what.split("\n")[0].slice(0, 90)}`) : null,
      status ? h("span", { class: "muted" }, ` · ${status}`) : null));
  }
  for (const wrap of app.conv.root.querySelectorAll(".msg.upload[data-seq]")) {
    const seq = Number(wrap.dataset.seq);
    const name = (wrap.querySelector("strong") || wrap).textContent.trim().slice(0, 80);
    if (m && inWindow(seq, m.included)) items.push(h("li", {}, seqLink(app, seq, "upload"), ` ${name}`));
  }
  if (m && m.images && m.images.length) items.push(h("li", {}, `images sent: ${m.images.join(", ")}`));
  const body = items.length ? h("ul", { id: "ctx-data" }, ...items)
    : h("p", { class: "muted", id: "ctx-data" }, m ? "No query, code or upload result was in the last request." : "No model request yet.");
  return [h("h3", {}, "Data it saw"), body];
}

function row(label, value, id) {
  return h("tr", {}, h("th", { scope: "row" }, label), h("td", id ? { id } : {}, value));
}

function ranges(list) {
  return (list || []).map(([a, b]) => (a === b ? `${a}` : `${a}–${b}`)).join(", ") || "none";
}

// The numbers of the last request: overview and tokens per region.
function requestSection(m) {
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
  return [h("h3", { id: "ctx-request" }, "The last request"),
    h("p", { class: "muted" }, `${when(m.ts)}, step ${m.step} of turn ${m.turn_id}.`), overview,
    h("h3", {}, "Tokens per region"), regions];
}

function summarySection(m) {
  const out = [h("h3", {}, "Summary")];
  if (!m.summary_detail) {
    out.push(h("p", { class: "muted", id: "ctx-summary" }, "No summary in this request (the whole thread fit the window, or none was made yet)."));
    return out;
  }
  const s = m.summary_detail;
  const dl = h("dl", { class: "summary", id: "ctx-summary" });
  dl.append(h("dt", {}, "covers"), h("dd", { id: "ctx-summary-covers" }, `records 1–${s.covers_through_seq}`));
  if (s.goal) dl.append(h("dt", {}, "goal"), h("dd", {}, s.goal));
  for (const key of ["active_constraints", "decisions", "data_refs", "open_items", "next_steps"]) {
    if (s[key] && s[key].length) dl.append(h("dt", {}, key.replace(/_/g, " ")), h("dd", {}, h("ul", {}, ...s[key].map((x) => h("li", {}, x)))));
  }
  if (s.state) dl.append(h("dt", {}, "state"), h("dd", {}, s.state));
  out.push(dl);
  return out;
}

export async function contextPanel(body, app) {
  if (!app.thread) {
    body.replaceChildren(h("p", { class: "muted" }, "Open a chat to inspect what the model saw."));
    return;
  }
  let m = null;
  try {
    m = await api("GET", `/api/threads/${enc(app.thread.id)}/context`);
  } catch (e) {
    if (e.status !== 404) {
      body.replaceChildren(h("p", { class: "error" }, e.message));
      return;
    }
  }
  const out = [h("section", { class: "ctx-analyst", id: "ctx-analyst" },
    ...await taskStateSection(app, () => contextPanel(body, app)), ...memorySection(app, m), ...dataSection(app, m))];
  if (m) out.push(h("section", { class: "ctx-numbers" }, ...requestSection(m), ...summarySection(m)));
  else out.push(h("p", { class: "muted" }, "No model request in this chat yet."));
  body.replaceChildren(...out);
}
