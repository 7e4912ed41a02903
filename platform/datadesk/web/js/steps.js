// Edit and re-run a step, and the SQL scratchpad (issue 31). A step is one sql_query or python
// call the user runs outside the model (POST /api/threads/{tid}/steps): its card is drawn live from
// the same events as a turn's, then the thread is drawn again, the step shown as "You ran".

import { api, postStream } from "./api.js";
import { $, h, toast } from "./dom.js";

const enc = encodeURIComponent;
const FIELD = { sql_query: "sql", python: "code" };

// Called after a thread is drawn (chat.js loadThread): Edit on sql_query and python cards, the
// "You ran" mark on the user's own steps, and the scratchpad button beside the composer.
export function stepControls(conv, tid, records) {
  const calls = new Map();
  for (const rec of records) {
    for (const call of rec.tool_calls || []) calls.set(call.id, { call, byUser: (rec.meta || {}).via === "user" });
  }
  for (const el of conv.root.querySelectorAll(".tool-card[data-call]")) {
    const found = calls.get(el.dataset.call);
    if (!found) continue;
    if (found.byUser && !el.querySelector(".by-user")) {
      el.classList.add("user-step");
      el.querySelector("summary").prepend(h("span", { class: "by-user" }, "You ran "));
    }
    const field = FIELD[found.call.name];
    const extras = el.parentElement && el.parentElement.querySelector(".tool-extras");
    if (field && extras && !extras.querySelector(".edit-step")) {
      extras.append(h("button", { type: "button", class: "edit-step", title: `Edit this ${field === "sql" ? "SQL" : "code"} and run it yourself`,
        onclick: () => openEditor(conv, tid, extras, found.call) }, "Edit"));
    }
  }
  scratchpadButton(conv);
}

function argsOf(call) {
  try {
    const a = JSON.parse(call.arguments || "{}");
    return a && typeof a === "object" ? a : {};
  } catch {
    return {};
  }
}

function editorBox(text, label, run, cancel, extra = null) {
  const area = h("textarea", { class: "step-input code", rows: "8", spellcheck: "false", "aria-label": label });
  area.value = text;
  Object.assign(area.style, { fontFamily: "monospace", width: "100%", boxSizing: "border-box" });
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(area.value); }
  });
  const box = h("div", { class: "step-editor" }, extra, area, h("div", { class: "edit-actions" },
    h("button", { type: "button", class: "primary step-run", title: "Run (Ctrl+Enter)", onclick: () => run(area.value) }, "Run"),
    h("button", { type: "button", class: "step-cancel", onclick: cancel }, "Cancel")));
  setTimeout(() => area.focus(), 0);
  return box;
}

function openEditor(conv, tid, extras, call) {
  if (extras.querySelector(".step-editor")) return;
  const args = argsOf(call);
  const field = FIELD[call.name];
  const box = editorBox(String(args[field] || ""), `edited ${field}`, (text) => {
    if (!text.trim()) return toast(`The ${field} is empty.`);
    box.remove();
    runStep(conv, tid, { tool: call.name, arguments: { ...args, [field]: text }, edited_from: call.id });
  }, () => box.remove());
  extras.append(box);
}

// Run a step: its card streams at the end of the thread, then the thread is drawn from its log.
export async function runStep(conv, tid, body) {
  if (conv.app.running) return toast("A turn is running: wait for it or stop it first.");
  const running = new AbortController();
  conv.app.running = running;
  try {
    await postStream(`/api/threads/${enc(tid)}/steps`, body, (type, data) => conv.onEvent(type, data), running.signal);
  } catch (e) {
    conv.notice(e.message, "error");
  }
  if (conv.app.running === running) conv.app.running = null;
  const { loadThread } = await import("./chat.js");
  conv.app.thread = await loadThread(conv, tid);
}

function scratchpadButton(conv) {
  const composer = $("#composer");
  if (!composer || composer.querySelector("#scratchpad-btn")) return;
  const btn = h("button", { id: "scratchpad-btn", type: "button", class: "icon-btn", title: "SQL scratchpad: run SQL yourself",
    "aria-label": "SQL scratchpad", onclick: () => openScratchpad(conv) }, "SQL");
  composer.insertBefore(btn, $("#input"));
}

async function openScratchpad(conv) {
  const tid = conv.app.thread && conv.app.thread.id;
  if (!tid) return toast("Open or start a chat first.");
  if (document.querySelector("#scratchpad")) return;
  const picker = h("select", { class: "step-source", "aria-label": "source" });
  try {
    const ws = conv.app.thread.workspace;
    const cat = await api("GET", `/api/workspace/catalog${ws ? `?workspace=${enc(ws)}` : ""}`);
    for (const s of cat.sources || []) picker.append(h("option", { value: s.name }, s.name));
  } catch (e) {
    toast(e.message);
  }
  const close = () => pad.remove();
  const box = editorBox("SELECT ", "scratchpad SQL", (sql) => {
    if (!sql.trim()) return toast("The SQL is empty.");
    close();
    const args = { sql };
    if (picker.value && picker.value !== "warehouse") args.source = picker.value;
    runStep(conv, conv.app.thread.id, { tool: "sql_query", arguments: args });
  }, close, h("label", { class: "step-source-label" }, "Source ", picker));
  const pad = h("div", { id: "scratchpad", class: "scratchpad" }, h("div", { class: "label" }, "SQL scratchpad"), box);
  $("#composer").before(pad);
}
