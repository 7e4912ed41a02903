// A saved memory or constraint as one small chip ("Memory updated", linking to the Memory
// panel; "Constraint noted", linking to the Context panel) instead of a plumbing card per call
// (`remember done`, `note_constraint done`). The calls' cards stay in the page, hidden, so the
// conversation's bookkeeping (running, finished, cancelled) is the same as for any card; calls
// that follow each other share one chip.

import { h } from "./dom.js";
import { icon } from "./icons.js";

const MEMORY = new Set(["remember", "forget"]);
const TASK_STATE = new Set(["note_constraint", "drop_constraint"]);
export const CHIP_TOOLS = new Set([...MEMORY, ...TASK_STATE]);

// The chip for a new call's card `el` of tool `name`: the chip just before (calls that follow
// each other), or a new one the caller appends.
export function chipFor(conv, el, name) {
  const last = conv.root.lastElementChild;
  const wrap = last && last.classList.contains("memory-chip-wrap") ? last : newChip(conv.app);
  el.hidden = true;
  wrap.querySelector(".memory-calls").append(el);
  wrap.dataset.tools = [...new Set([...(wrap.dataset.tools || "").split(" ").filter(Boolean), name])].join(" ");
  updateChip(wrap);
  return wrap;
}

function newChip(app) {
  const link = h("a", { href: "#", class: "memory-chip", onclick: (e) => {
    e.preventDefault();
    const wrap = e.currentTarget.closest(".memory-chip-wrap");
    const memory = (wrap.dataset.tools || "").split(" ").some((t) => MEMORY.has(t));
    if (app && app.showPanel) app.showPanel(memory ? "memory" : "context");
  } }, icon("memory"), h("span", { class: "memory-chip-text" }));
  return h("div", { class: "memory-chip-wrap", role: "status" }, link, h("div", { class: "memory-calls", hidden: true }));
}

// The chip's words from its calls: running, all done, or what failed.
export function updateChip(wrap) {
  const cards = [...wrap.querySelectorAll(".memory-calls .tool-card")];
  const tools = (wrap.dataset.tools || "").split(" ");
  const memory = tools.some((t) => MEMORY.has(t));
  const failed = cards.filter((c) => c.classList.contains("failed"));
  const running = cards.some((c) => c.classList.contains("running") || !c.dataset.state);
  const chip = wrap.querySelector(".memory-chip");
  let text;
  if (failed.length) text = `${memory ? "Memory" : "Constraint"} not saved: ${failed[0].querySelector(".tool-result")?.textContent.trim().slice(0, 120) || failed[0].dataset.state}`;
  else if (running) text = memory ? "Updating memory…" : "Noting a constraint…";
  else text = memory ? "Memory updated" : "Constraint noted";
  chip.classList.toggle("failed", failed.length > 0);
  chip.querySelector(".memory-chip-text").textContent = text;
  chip.title = cards.map((c) => c.querySelector(".tool-result")?.textContent.trim()).filter(Boolean).join("\n") ||
    (memory ? "Open the Memory panel" : "Open the Context panel (task state)");
}
