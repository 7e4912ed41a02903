// Older records of the open thread: "Load earlier" pages them in above what is shown
// (GET /api/threads/{tid}?before=<oldest shown seq>), and revealSeq opens the thread at one record.

import { api } from "./api.js";
import { h } from "./dom.js";

const PAGE = 200; // records per "Load earlier"
const MAX_PAGES = 100; // revealSeq gives up past this many pages

// Mark the elements a record just added at the end of `root` with its seq (they are the last
// children without one).
export function tagSeq(root, seq) {
  for (let el = root.lastElementChild; el && !el.dataset.seq; el = el.previousElementSibling) {
    if (!el.classList.contains("load-earlier")) el.dataset.seq = String(seq);
  }
}

function oldestSeq(root) {
  const first = root.querySelector("[data-seq]");
  return first ? Number(first.dataset.seq) : null;
}

// The "Load earlier" button at the top of the thread (when the log has older records).
export function earlierButton(conv, tid) {
  const btn = h("button", { type: "button", class: "load-earlier" }, "Load earlier messages");
  btn.addEventListener("click", () => loadEarlier(conv, tid).catch((e) => {
    btn.disabled = false;
    btn.textContent = `Load earlier messages (failed: ${e.message})`;
  }));
  return btn;
}

// Draw the page of records older than the oldest shown, above it, keeping the scroll position.
export async function loadEarlier(conv, tid) {
  const root = conv.root;
  const btn = root.querySelector(".load-earlier");
  const before = oldestSeq(root);
  if (!btn || before === null) return false;
  btn.disabled = true;
  btn.textContent = "Loading…";
  const d = await api("GET", `/api/threads/${encodeURIComponent(tid)}?limit=${PAGE}&before=${before}`);
  const holder = h("div", {});
  const scroll = conv.scroll;
  const height = root.scrollHeight;
  const top = root.scrollTop;
  conv.root = holder; // the conversation draws into the holder, then the holder moves in on top
  conv.scroll = () => {};
  try {
    for (const rec of d.records) {
      conv.renderRecord(rec);
      tagSeq(holder, rec.seq);
    }
  } finally {
    conv.root = root;
    conv.scroll = scroll;
    conv.bubble = null;
  }
  btn.after(...holder.childNodes);
  if (d.has_more) {
    btn.disabled = false;
    btn.textContent = "Load earlier messages";
  } else {
    btn.replaceWith(h("p", { class: "muted thread-start" }, "Start of the chat."));
  }
  root.scrollTop = top + (root.scrollHeight - height);
  return true;
}

// Scroll the open thread to record `seq` (loading earlier pages as needed) and mark it briefly.
export async function revealSeq(conv, tid, seq) {
  const root = conv.root;
  for (let page = 0; page <= MAX_PAGES; page += 1) {
    const oldest = oldestSeq(root);
    const el = oldest !== null && oldest <= seq ? nearest(root, seq) : null;
    if (el) {
      el.scrollIntoView({ block: "center" });
      for (const x of root.querySelectorAll(".search-hit")) x.classList.remove("search-hit");
      for (const x of root.querySelectorAll(`[data-seq="${el.dataset.seq}"]`)) x.classList.add("search-hit");
      return el;
    }
    if (oldest === null || !(await loadEarlier(conv, tid))) return null;
  }
  return null;
}

// The first element of record `seq`, or of the nearest record before it (a tool result is
// drawn in the card of its call).
function nearest(root, seq) {
  let best = null;
  for (const el of root.querySelectorAll("[data-seq]")) {
    const s = Number(el.dataset.seq);
    if (s > seq) break;
    if (!best || s > Number(best.dataset.seq)) best = el;
  }
  return best;
}
