// DataDesk web chat: login, threads, chat with streaming answers, uploads, panels.

import { ApiError, api, attachStream, postStream, setCsrf, upload } from "./api.js";
import { Conversation, loadThread } from "./chat.js";
import { $, confirmDialog, h, promptDialog, toast } from "./dom.js";
import { artifactsPanel, memoryPanel } from "./panels.js";
import { contextPanel } from "./context.js";
import { decorateIcons } from "./icons.js";
import { dataPanel, yourData } from "./datapanel.js";
import { initDemo } from "./demo.js";
import { initExport } from "./export.js";
import { initRefresh } from "./refresh.js";
import { initReport } from "./report.js";
import { revealSeq } from "./history.js";
import { clearRefusal, refuseSend } from "./composer.js";
import { initSearch, renderThreadList } from "./search.js";
import { initShare, leaveShare, openShare, sharedFromHash } from "./share.js";

const enc = encodeURIComponent;
const REATTACH_TRIES = 5; // a stream that breaks before `done` is re-attached this many times
const WATCH_EVERY_MS = 3000; // an idle open thread is checked this often for a turn started elsewhere
const PANELS = { data: ["Data", dataPanel], artifacts: ["Artifacts", artifactsPanel], memory: ["Memory", memoryPanel], context: ["Context inspector", contextPanel] };

const app = {
  me: null,
  thread: null,
  threads: [],
  running: null, // AbortController of the stream of the turn in flight (aborting it detaches)
  lastEventId: null, // SSE id of the newest event of that turn
  panel: null,
  conv: null,
};
window.datadesk = app; // for debugging from the console
app.onEmptyChat = (root) => yourData(root, app, () => showPanel("data")); // datapanel.js: "your data"
app.closePanel = () => closePanel();
app.showPanel = (name) => showPanel(name); // the "Memory updated" chip, the context panel's links
decorateIcons(); // icons.js: the page's [data-icon] buttons get their SVG

// ---- start -------------------------------------------------------------------------------
async function boot() {
  try {
    app.me = await api("GET", "/api/me");
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return showLogin();
    return showLogin(e.message);
  }
  setCsrf(app.me.csrf);
  $("#login-view").hidden = true;
  $("#app-view").hidden = false;
  $("#user-name").textContent = app.me.name || app.me.id;
  const model = app.me.model || {};
  $("#model-label").textContent = model.demo ? "demo model" : model.name || "";
  $("#banner-demo").hidden = !model.demo;
  const sb = app.me.sandbox || {};
  const banner = $("#banner-sandbox");
  if (sb.reason) {
    banner.textContent = sb.can_execute_code
      ? `Python is unavailable right now: ${sb.reason}. Large results are truncated instead of analysed.`
      : `Note: ${sb.reason}.`;
    banner.hidden = false;
  }
  app.conv = new Conversation($("#messages"), app);
  initSearch(app, openAt);
  initExport(app);
  initRefresh(app); // refresh.js: Refresh and Schedule… of the open thread
  initReport(app); // report.js: pins from the chat and the report page (#t=<tid>&view=report)
  app.refreshThreads = () => refreshThreads();
  initDemo(app);
  initShare(app); // share.js: the Share dialog, and a shared chat opened from its link (#s=)
  await refreshThreads();
  if (sharedFromHash()) return openShare(app, sharedFromHash());
  const wanted = new URLSearchParams(location.hash.slice(1)).get("t");
  const first = app.threads.find((t) => t.id === wanted) || app.threads[0];
  if (first) await openThread(first.id);
  else app.conv.empty("Start a new chat with “+ New chat”, or just type a question.");
  $("#input").focus();
}

function showLogin(message) {
  $("#app-view").hidden = true;
  $("#login-view").hidden = false;
  const err = $("#login-error");
  err.hidden = !message;
  err.textContent = message || "";
  $("#login-secret").focus();
}

$("#login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const secret = $("#login-secret").value.trim();
  const body = secret.startsWith("ddt_") ? { token: secret } : { code: secret };
  try {
    await api("POST", "/api/login", body);
    $("#login-secret").value = "";
    await boot();
  } catch (err) {
    showLogin(err.status === 429 ? "Too many attempts: wait a minute and try again." : err.message);
  }
});

$("#logout").addEventListener("click", async () => {
  try {
    await api("POST", "/api/logout");
  } catch (e) {
    toast(e.message);
  }
  location.hash = "";
  location.reload();
});

// ---- threads -----------------------------------------------------------------------------
async function refreshThreads() {
  app.threads = await api("GET", "/api/threads");
  renderThreadList($("#thread-list"), app.threads, app.thread && app.thread.id, openThread); // by date (search.js)
}

// Open thread `tid` at record `seq` (a search hit; 0: the title matched).
async function openAt(tid, seq) {
  if (!app.thread || app.thread.id !== tid) await openThread(tid);
  if (app.thread && app.thread.id === tid && seq > 0) await revealSeq(app.conv, tid, seq);
}

async function openThread(tid) {
  leaveShare(app); // share.js: back from a shared chat to one's own
  if (app.running) app.running.abort(); // leaving a running turn stops nothing: it runs on
  setRunning(null);
  try {
    app.thread = await loadThread(app.conv, tid);
  } catch (e) {
    toast(e.message);
    return;
  }
  location.hash = `t=${tid}`;
  $("#thread-title").textContent = app.thread.title;
  $("#thread-actions").hidden = false;
  document.body.classList.remove("sidebar-open");
  await refreshThreads();
  if (app.panel) showPanel(app.panel);
  if (app.thread.turn) follow(app.thread.id, `${app.thread.turn}:0`, true); // still running: re-attach
}

// "+ New chat" again on the empty chat this tab just made keeps it (no empty chats piling up)
function isEmptyChat() {
  return app.thread && app.thread.id === app.madeHere && app.thread.title === "New chat" &&
    !document.querySelector("#messages .msg, #messages .tool-wrap");
}

async function newThread(title = "New chat") {
  if (title === "New chat" && isEmptyChat()) {
    document.body.classList.remove("sidebar-open");
    $("#input").focus();
    return app.thread;
  }
  const t = await api("POST", "/api/threads", { title, reuse_empty: title === "New chat" });
  app.madeHere = t.id;
  await refreshThreads();
  await openThread(t.id);
  return t;
}

$("#new-thread").addEventListener("click", () => newThread().catch((e) => toast(e.message)));

$("#rename-thread").addEventListener("click", async () => {
  const title = await promptDialog("Rename this chat", app.thread.title);
  if (title === null) return;
  try {
    app.thread = await api("PATCH", `/api/threads/${enc(app.thread.id)}`, { title });
    $("#thread-title").textContent = app.thread.title;
    await refreshThreads();
  } catch (e) {
    toast(e.message);
  }
});

$("#clear-thread").addEventListener("click", async () => {
  const ok = await confirmDialog("Clear this chat?",
    "All messages, the summary, the tables, charts and files of this chat, and its Python kernel are removed. " +
    "Your memory (facts and preferences) stays. This cannot be undone.", "Clear chat");
  if (!ok) return;
  try {
    const r = await api("POST", `/api/threads/${enc(app.thread.id)}/clear`);
    await openThread(app.thread.id);
    toast(`Chat cleared: ${r.removed.records || 0} records and ${r.removed.artifacts || 0} artifacts removed; memory kept.`, "info");
  } catch (e) {
    toast(e.message);
  }
});

$("#delete-thread").addEventListener("click", async () => {
  const ok = await confirmDialog("Delete this chat?",
    `“${app.thread.title}” is deleted with its messages, tables, charts and files. Your memory stays.`, "Delete");
  if (!ok) return;
  try {
    await api("DELETE", `/api/threads/${enc(app.thread.id)}`);
    app.thread = null;
    $("#thread-title").textContent = "No chat selected";
    $("#thread-actions").hidden = true;
    app.conv.empty("Chat deleted.");
    await refreshThreads();
    if (app.threads[0]) await openThread(app.threads[0].id);
  } catch (e) {
    toast(e.message);
  }
});

// ---- sending -----------------------------------------------------------------------------
function setRunning(ctrl, elsewhere = false) {
  app.running = ctrl;
  app.runningElsewhere = !!ctrl && elsewhere; // followed, not started from this tab (composer.js)
  if (!ctrl) clearRefusal();
  $("#send").hidden = !!ctrl;
  $("#stop").hidden = !ctrl;
  $("#input").classList.toggle("busy", !!ctrl);
}

// Send the composer's text, or `again` (Retry of an interrupted turn: the draft stays).
async function send(again) {
  const input = $("#input");
  const retry = typeof again === "string";
  const text = (retry ? again : input.value).trim();
  if (!text) return;
  if (app.running) return refuseSend(app.runningElsewhere); // composer.js: say why, keep the text
  if (!app.thread) {
    try {
      await newThread(text.slice(0, 60));
    } catch (e) {
      toast(e.message);
      return;
    }
  }
  if (!retry) input.value = "";
  if (app.thread.title === "New chat" && !document.querySelector("#messages .msg")) {
    // the first question names the chat (rename changes it)
    try {
      app.thread = await api("PATCH", `/api/threads/${enc(app.thread.id)}`, { title: text.replace(/\s+/g, " ").slice(0, 60) });
      $("#thread-title").textContent = app.thread.title;
    } catch {
      // keep "New chat": the question matters more than the title
    }
  }
  app.conv.userMessage(text);
  const ctrl = new AbortController();
  setRunning(ctrl);
  const tid = app.thread.id;
  let ended = false;
  app.lastEventId = null;
  try {
    await postStream(`/api/threads/${enc(tid)}/messages`, { content: text }, (type, data, id) => {
      ended = onTurnEvent(type, data, id) || ended;
    }, ctrl.signal);
  } catch (e) {
    if (e.name === "AbortError") return; // another thread was opened: the turn runs on
    if (e.status === 413 || e.status === 409 || e.status === 429 || !app.lastEventId) {
      app.conv.notice(e.message, "error");
      if (!retry && (e.status === 413 || e.status === 409 || e.status === 429)) input.value = text; // nothing was sent: keep it
      setRunning(null);
      if (e.status === 409) refuseSend(true); // a turn another tab started holds the thread
      afterTurn();
      return;
    }
  }
  if (app.running !== ctrl) return;
  if (!ended) return follow(tid, app.lastEventId, false); // the stream broke: the turn runs on, re-attach
  setRunning(null);
  afterTurn();
}

// Retry of a turn the server stopped mid-way (chat.js `interrupted`): the question again, as a new
// turn, once the stream that reported the stop has closed (at most a few seconds); whether it went.
app.retry = async (text) => {
  for (let i = 0; app.running && i < 50; i++) await new Promise((r) => setTimeout(r, 100));
  if (app.running) return false;
  send(text);
  return true;
};

// An event of the turn in flight; true when it was the last one (`done`).
function onTurnEvent(type, data, id) {
  if (id) app.lastEventId = id;
  app.conv.onEvent(type, data);
  return type === "done";
}

function afterTurn() {
  refreshThreads().then(() => { // the turn may have named the chat (its first question)
    const t = app.thread && app.threads.find((x) => x.id === app.thread.id);
    if (t && t.title !== app.thread.title) $("#thread-title").textContent = app.thread.title = t.title;
  }).catch(() => {});
  if (app.panel && app.panel !== "memory") showPanel(app.panel);
}

// Follow the running turn of thread `tid` from event id `lastId` (re-attach after a reload, when
// the thread is opened again, or when a stream broke); the turn runs on whatever happens here.
async function follow(tid, lastId, fresh) {
  const ctrl = new AbortController();
  setRunning(ctrl, fresh || app.runningElsewhere); // fresh: a turn this tab did not start
  app.lastEventId = lastId;
  let ended = false;
  for (let attempt = 0; !ended && attempt < REATTACH_TRIES; attempt += 1) {
    if (attempt) await new Promise((r) => setTimeout(r, 500 * attempt));
    if (app.running !== ctrl) return;
    try {
      const status = await attachStream(`/api/threads/${enc(tid)}/events`, app.lastEventId, (type, data, id) => {
        ended = onTurnEvent(type, data, id) || ended;
      }, ctrl.signal);
      if (status === 204) break; // the turn ended and its events are gone: the log has it all
    } catch (e) {
      if (e.name === "AbortError") return;
      if (e.status && e.status < 500) break;
    }
  }
  if (app.running !== ctrl) return;
  setRunning(null);
  if (!ended && app.thread && app.thread.id === tid) {
    try {
      app.thread = await loadThread(app.conv, tid, false); // draw what the log has now
    } catch (e) {
      toast(e.message);
    }
    if (!fresh) app.conv.notice("Lost the connection to the running turn: this is what the log has.", "warn");
  }
  afterTurn();
}

// A turn started in another tab (or by another client) on the open thread: show it here too.
setInterval(async () => {
  if (!app.thread || app.running || document.visibilityState !== "visible") return;
  try {
    const d = await api("GET", `/api/threads/${enc(app.thread.id)}?limit=1`);
    if (d.thread.turn && !app.running && app.thread && d.thread.id === app.thread.id) await openThread(d.thread.id);
  } catch {
    // a failed check is retried at the next tick
  }
}, WATCH_EVERY_MS);

$("#composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});

$("#input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});

$("#stop").addEventListener("click", async () => {
  if (!app.thread) return;
  $("#stop").disabled = true;
  try {
    await api("POST", `/api/threads/${enc(app.thread.id)}/cancel`); // the stream then ends with `done`
  } catch (e) {
    toast(e.message);
  } finally {
    $("#stop").disabled = false;
  }
});

// ---- uploads -----------------------------------------------------------------------------
async function uploadFile(file) {
  if (app.running) {
    toast("Wait for the running turn to finish before uploading.", "info");
    return;
  }
  if (!app.thread) await newThread(file.name.slice(0, 60));
  const status = $("#upload-status");
  const bar = $("#upload-progress");
  const label = $("#upload-text");
  status.hidden = false;
  status.classList.remove("error", "warn"); // a message stays until dismissed (✕) or the next upload
  bar.value = 0;
  label.textContent = `Uploading ${file.name}…`;
  try {
    const r = await upload(`/api/threads/${enc(app.thread.id)}/uploads`, file, (f) => {
      bar.value = Math.round(f * 100);
      label.textContent = f < 1 ? `Uploading ${file.name}… ${Math.round(f * 100)}%` : `Reading ${file.name}…`;
    });
    const a = r.artifact;
    const all = r.artifacts || [a];
    const skipped = (r.skipped_sheets || []).map((s) => `${s.sheet} (${s.why})`);
    label.textContent = (all.length > 1 ? `${file.name} uploaded: ${all.length} sheets, each its own table`
      : `${file.name} uploaded${a.rows !== null && a.rows !== undefined ? `: ${a.rows.toLocaleString("en-US")} rows` : ""}`) +
      (skipped.length ? `; skipped: ${skipped.join(", ")}` : "") + "." + (r.warning ? ` Warning: ${r.warning}` : "");
    status.classList.toggle("warn", !!r.warning);
    for (const one of all) app.conv.artifacts.set(one.id, one);
    app.conv.userUpload(file.name, all.map((one) => one.id), skipped);
    if (r.thread_title && app.thread.title !== r.thread_title) { // an untitled chat is named after its file
      app.thread.title = r.thread_title;
      $("#thread-title").textContent = r.thread_title;
      refreshThreads().catch(() => {});
    }
  } catch (e) {
    status.classList.add("error");
    label.textContent = `${file.name} was not uploaded: ${e.message}`;
  }
}

$("#upload-btn").addEventListener("click", () => $("#file-input").click());
$("#file-input").addEventListener("change", (e) => {
  const f = e.target.files[0];
  e.target.value = "";
  if (f) uploadFile(f).catch((err) => toast(err.message));
});

const chat = $("#chat");
let dragDepth = 0;
chat.addEventListener("dragenter", (e) => {
  if (!e.dataTransfer || !Array.from(e.dataTransfer.types).includes("Files")) return;
  e.preventDefault();
  dragDepth += 1;
  $("#drop-hint").hidden = false;
});
chat.addEventListener("dragover", (e) => {
  if (e.dataTransfer && Array.from(e.dataTransfer.types).includes("Files")) e.preventDefault();
});
chat.addEventListener("dragleave", () => {
  dragDepth = Math.max(0, dragDepth - 1);
  if (!dragDepth) $("#drop-hint").hidden = true;
});
chat.addEventListener("drop", (e) => {
  e.preventDefault();
  dragDepth = 0;
  $("#drop-hint").hidden = true;
  const files = Array.from(e.dataTransfer.files || []);
  if (files.length > 1) toast("One file at a time: uploading the first.", "info");
  if (files[0]) uploadFile(files[0]).catch((err) => toast(err.message));
});

// ---- re-import: an uploaded CSV/TSV read again with the options of its card's form ---------
app.reimport = async (aid, options) => {
  const r = await api("POST", `/api/threads/${enc(app.thread.id)}/artifacts/${enc(aid)}/reimport`, options);
  const a = r.artifact;
  toast(`Re-imported ${a.name || aid}: ${Number(a.rows).toLocaleString("en-US")} rows × ${a.columns} columns.` +
    (r.warning ? ` Warning: ${r.warning}` : ""), r.warning ? "error" : "info");
  if (app.thread) await openThread(app.thread.id);
};

// ---- re-query ----------------------------------------------------------------------------
app.requery = async (aid, button) => {
  if (button) {
    button.disabled = true;
    button.textContent = "Re-running…";
  }
  try {
    const r = await api("POST", `/api/artifacts/${enc(aid)}/requery`);
    const rows = r.rows !== undefined && r.rows !== null ? ` (${Number(r.rows).toLocaleString("en-US")} rows)` : "";
    toast(`Query re-run: artifact ${aid} is available again${rows}.`, "info");
    if (app.thread) await openThread(app.thread.id);
  } catch (e) {
    toast(e.message);
    if (button) {
      button.disabled = false;
      button.textContent = "Re-run query";
    }
  }
};

// ---- panels ------------------------------------------------------------------------------
async function showPanel(name) {
  const [title, render] = PANELS[name];
  app.panel = name;
  $("#panel-title").textContent = title;
  $("#panel").hidden = false;
  $("#panel").dataset.panel = name;
  document.body.classList.add("panel-open");
  const body = $("#panel-body");
  body.setAttribute("aria-busy", "true");
  try {
    await render(body, app);
  } catch (e) {
    body.replaceChildren(h("p", { class: "error" }, e.message));
  } finally {
    body.removeAttribute("aria-busy");
  }
}

function closePanel() {
  app.panel = null;
  $("#panel").hidden = true;
  document.body.classList.remove("panel-open");
}

for (const name of Object.keys(PANELS)) {
  $(`#open-${name}`).addEventListener("click", () => (app.panel === name ? closePanel() : showPanel(name)));
}
$("#panel-close").addEventListener("click", closePanel);
$("#toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
$("#close-sidebar").addEventListener("click", () => {
  document.body.classList.remove("sidebar-open");
  $("#toggle-sidebar").focus();
});
$("#upload-dismiss").addEventListener("click", () => { $("#upload-status").hidden = true; });
document.addEventListener("click", (e) => { // a tap beside the open drawer closes it
  if (document.body.classList.contains("sidebar-open") && !e.target.closest("#sidebar, #toggle-sidebar")) {
    document.body.classList.remove("sidebar-open");
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && document.body.classList.contains("sidebar-open")) {
    document.body.classList.remove("sidebar-open");
    return;
  }
  if (e.key === "Escape" && app.panel && !document.querySelector("dialog[open]")) closePanel();
});

boot();
