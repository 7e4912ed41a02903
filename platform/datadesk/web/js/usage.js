// Tokens and cost, discreetly: a small line after each turn ("1,234 tokens in · 56 out ·
// $0.0012") and the thread's total beside its title, from GET /api/threads/{tid}/usage (the
// usage the model's replies recorded, priced by the `llm.prices` setting; no price: tokens only).

import { api } from "./api.js";
import { $, h, num } from "./dom.js";

export function money(cost, currency) {
  if (cost === null || cost === undefined || !currency) return null;
  return new Intl.NumberFormat("en-US", { style: "currency", currency, maximumSignificantDigits: 3 }).format(cost);
}

function figure(u) {
  const parts = [`${num(u.prompt_tokens)} tokens in`];
  if (u.cached_tokens) parts.push(`${num(u.cached_tokens)} cached`);
  parts.push(`${num(u.completion_tokens)} out`);
  const cost = money(u.cost, u.currency);
  if (cost) parts.push(cost);
  return parts.join(" · ");
}

function why(u) {
  const models = (u.models || []).join(", ") || "the model";
  return u.priced ? `${u.requests} model request${u.requests === 1 ? "" : "s"} (${models})`
    : `${u.requests} model request${u.requests === 1 ? "" : "s"} (${models}); no cost: set [llm.prices."${(u.models || [])[0] || "model"}"] in datadesk.toml`;
}

// The last element drawn for a turn's records (seqs first..last), or null.
function lastOf(root, turn) {
  let found = null;
  for (const el of root.querySelectorAll(":scope > [data-seq]")) {
    const s = Number(el.dataset.seq);
    if (s >= turn.first_seq && s <= turn.last_seq) found = el;
  }
  return found;
}

// Put each turn's figure after its records, and the thread's total beside the title.
export async function showUsage(conv, tid) {
  let u;
  try {
    u = await api("GET", `/api/threads/${encodeURIComponent(tid)}/usage`);
  } catch {
    return; // the figures are a courtesy: the chat works without them
  }
  if (!conv.app || !conv.app.thread || conv.app.thread.id !== tid) return;
  const root = conv.root;
  root.querySelectorAll(".turn-usage").forEach((el) => el.remove());
  u.turns.forEach((t, i) => {
    const el = h("div", { class: "turn-usage muted", dataset: { turn: t.turn_id }, title: why(t) }, figure(t));
    const after = lastOf(root, t);
    if (after) after.after(el);
    else if (i === u.turns.length - 1) root.append(el); // the turn just drawn live (not tagged yet)
  });
  let total = $("#thread-usage");
  if (!total) {
    total = h("span", { id: "thread-usage", class: "thread-usage muted" });
    $("#thread-title").after(total);
  }
  total.textContent = u.total.requests ? figure(u.total) : "";
  total.title = u.total.requests ? `This chat so far, earlier branches included: ${why(u.total)}` : "";
}
