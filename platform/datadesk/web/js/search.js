// The chat list: threads grouped by date (today, last 7 days, older) and search across them
// (GET /api/search): hits are grouped by thread (its title once, its matches under it); each
// match shows its snippet as rendered text (the server strips Markdown and JSON syntax) and
// opens the thread at the matching record.

import { api } from "./api.js";
import { $, h } from "./dom.js";
import { refreshBadge } from "./refresh.js";

const DAY_MS = 86_400_000;
const TYPE_DELAY_MS = 200; // search once typing pauses

function startOfToday() {
  const d = new Date();
  d.setHours(0, 0, 0, 0);
  return d.getTime();
}

// "Today", "Last 7 days" or "Older" for a thread updated at `ts` (seconds).
export function dateGroup(ts, today = startOfToday()) {
  const ms = ts * 1000;
  if (ms >= today) return "Today";
  if (ms >= today - 6 * DAY_MS) return "Last 7 days";
  return "Older";
}

function shortWhen(ts, group) {
  const d = new Date(ts * 1000);
  if (group === "Today") return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  if (group === "Last 7 days") return d.toLocaleDateString([], { weekday: "short" });
  return d.toLocaleDateString([], { year: "numeric", month: "short", day: "numeric" });
}

// Draw `threads` (newest first) into the list `ul`, under date headings; `open(tid)` opens one.
export function renderThreadList(ul, threads, currentId, open) {
  const items = [];
  let group = null;
  const today = startOfToday();
  for (const t of threads) {
    const g = dateGroup(t.updated, today);
    if (g !== group) {
      group = g;
      items.push(h("li", { class: "thread-group", role: "presentation" }, g));
    }
    const when = new Date(t.updated * 1000);
    items.push(h("li", { class: t.id === currentId ? "active" : "" },
      h("button", { type: "button", class: "thread-link", dataset: { thread: t.id }, title: `${t.title} · ${when.toLocaleString()}`,
        onclick: () => open(t.id) },
      h("span", { class: "thread-title" }, t.title),
      t.running ? h("span", { class: "badge" }, "running") : null,
      refreshBadge(t.refreshed), // refresh.js: "refreshed 07:30, 2 changes"
      h("time", { class: "thread-when", datetime: when.toISOString() }, shortWhen(t.updated, g)))));
  }
  ul.replaceChildren(...items);
  if (!threads.length) ul.append(h("li", { class: "muted" }, "No chats yet."));
}

// A snippet with its matched words in <mark> (text nodes only: the snippet is never HTML).
function snippetNode(text, spans) {
  const out = h("span", { class: "hit-snippet" });
  let pos = 0;
  for (const [s, e] of spans || []) {
    if (s < pos || e > text.length) continue;
    out.append(text.slice(pos, s), h("mark", {}, text.slice(s, e)));
    pos = e;
  }
  out.append(text.slice(pos));
  return out;
}

// Hits (best first) grouped by thread, the threads in the order of their best hit.
export function groupByThread(results) {
  const groups = new Map();
  for (const r of results) {
    if (!groups.has(r.thread)) groups.set(r.thread, { thread: r.thread, title: r.title, hits: [] });
    groups.get(r.thread).hits.push(r);
  }
  return [...groups.values()];
}

// One thread of the results: its title once, its matches under it (each opens the thread there).
function threadHits(g, openAt) {
  return h("li", { class: "search-thread", dataset: { thread: g.thread } },
    h("div", { class: "hit-title", title: g.title }, g.title),
    h("ul", { class: "search-thread-hits" }, ...g.hits.map((r) => h("li", {},
      h("button", { type: "button", class: "search-hit-link", dataset: { thread: r.thread, seq: String(r.seq) },
        onclick: () => openAt(r.thread, r.seq) },
      h("span", { class: "hit-meta muted" }, r.seq === 0 ? "title" : `${r.role} · ${new Date(r.ts * 1000).toLocaleDateString()}`),
      snippetNode(r.snippet, r.highlights))))));
}

// Wire the search box: results replace the chat list while there is a query.
export function initSearch(app, openAt) {
  const input = $("#thread-search");
  const results = $("#search-results");
  const list = $("#thread-list");
  if (!input || !results || input.dataset.wired) return;
  input.dataset.wired = "1";
  let timer = null;
  let asked = 0;

  const clear = () => {
    results.hidden = true;
    results.replaceChildren();
    list.hidden = false;
  };

  const run = async () => {
    const q = input.value.trim();
    if (!q) return clear();
    const mine = ++asked;
    let body;
    try {
      body = await api("GET", `/api/search?q=${encodeURIComponent(q)}&limit=30`);
    } catch (e) {
      if (mine !== asked) return;
      results.replaceChildren(h("li", { class: "error search-error", role: "alert" }, e.message));
      results.hidden = false;
      list.hidden = true;
      return;
    }
    if (mine !== asked) return; // a newer query is on its way
    const items = groupByThread(body.results).map((g) => threadHits(g, openAt));
    results.replaceChildren(...(items.length ? items : [h("li", { class: "muted" }, `Nothing found for “${q}”.`)]));
    results.hidden = false;
    list.hidden = true;
  };

  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(run, TYPE_DELAY_MS);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Escape") {
      input.value = "";
      clear();
    } else if (e.key === "Enter") {
      e.preventDefault();
      clearTimeout(timer);
      run();
    }
  });
  app.search = { run, clear };
}
