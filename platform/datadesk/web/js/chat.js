// The conversation: messages, streaming answers and tool cards (history and live events).

import { api } from "./api.js";
import { earlierButton, tagSeq } from "./history.js";
import { $, bytes, h, num, setHtml, toast } from "./dom.js";
import { addCopyButtons, chartViewer, collapsible, modelNotes } from "./code.js";
import { GRID_FORMATS, gridButton } from "./grid.js";
import { figureImage, vegaChart } from "./charts.js";
import { uploadCard } from "./upload.js";
import { branchControls } from "./branches.js";
import { stepControls } from "./steps.js";
import { refreshControls } from "./refresh.js";
import { icon } from "./icons.js";
import { CHIP_TOOLS, chipFor, updateChip } from "./memorychip.js";
import { showUsage } from "./usage.js";

// what GET /api/artifacts/{id}/view shows in the browser (never SVG)
export const REPORT_FORMATS = new Set(["md", "markdown", "html", "htm"]);
export const IMAGE_FORMATS = new Set(["png", "jpg", "jpeg", "gif", "webp"]);
const LIVE_OUTPUT_CHARS = 20_000; // a running card keeps the newest output printed so far
// a turn cut off by a stopped server (interrupted) or by a host that left the cluster (host_lost,
// finished by another host): its answer holds what was written, and Retry asks again
export const CUT_OFF_KINDS = new Set(["interrupted", "host_lost"]);

// how a card ends: done, error, cancelled or timed out (never still spinning after its turn)
export function endState(ok, status, meta, preview) {
  if (status === "cancelled") return "cancelled";
  if (meta && meta.status === "interrupted") return "interrupted"; // the server stopped mid-call
  const run = (meta && meta.status) || "";
  if (/time/i.test(run) || (!ok && /\btimed out\b/i.test(String(preview || "").slice(0, 300)))) return "timed out";
  return ok ? "done" : "error";
}

function elapsedText(s) {
  const n = Math.max(0, Math.floor(s));
  return n < 60 ? `${n} s` : `${Math.floor(n / 60)} min ${String(n % 60).padStart(2, "0")} s`;
}

function prettyArgs(raw) {
  let args = null;
  try {
    args = JSON.parse(raw || "{}");
  } catch {
    return { label: "arguments (not valid JSON)", text: raw || "" };
  }
  if (args && typeof args.sql === "string") return { label: "SQL", text: args.sql, lang: "sql" };
  if (args && typeof args.query === "string") return { label: "query", text: args.query, lang: "sql" };
  if (args && typeof args.code === "string") return { label: "code", text: args.code, lang: "python" };
  return { label: "arguments", text: JSON.stringify(args, null, 2) };
}

// Pin one of the user's messages as a standing constraint of the thread (its task state).
function pinButton(app, seq) {
  return h("button", {
    type: "button", class: "pin-msg", title: "Pin as a standing constraint (always sent to the model)",
    "aria-label": "Pin as a standing constraint",
    onclick: async (e) => {
      e.stopPropagation();
      try {
        await api("POST", `/api/threads/${encodeURIComponent(app.thread.id)}/task-state`, { seq });
        toast("Pinned: the assistant keeps this as a constraint of this chat.", "info");
      } catch (err) {
        toast(err.message);
      }
    },
  }, icon("pin")); // icons.js: SVG, not an emoji that may render as an empty box
}

export class Conversation {
  constructor(root, app) {
    this.root = root;
    this.app = app;
    this.cards = new Map(); // call id -> card
    this.artifacts = new Map(); // artifact id -> artifact (thread's list)
    this.bubble = null; // the assistant message streaming now
    this.asked = new Map(); // turn id -> the user's message (Retry of an interrupted turn sends it again)
    this.lastAsked = ""; // the newest user message shown
    this.ticker = setInterval(() => this.tick(), 1000); // elapsed seconds of running cards
    this.atBottom = true; // autoscroll only while the reader is at the bottom
    this.pill = h("button", { type: "button", id: "new-messages", class: "new-messages", hidden: true }, "New messages ↓");
    this.pill.addEventListener("click", () => this.scroll(true));
    root.after(this.pill);
    root.addEventListener("scroll", () => {
      this.atBottom = root.scrollHeight - root.scrollTop - root.clientHeight < 48;
      if (this.atBottom) this.pill.hidden = true;
    });
  }

  clear() {
    this.root.replaceChildren();
    this.cards.clear();
    this.asked.clear();
    this.lastAsked = "";
    this.bubble = null;
  }

  empty(text) {
    this.root.replaceChildren(h("p", { class: "empty" }, text));
  }

  // to the newest message when the reader is at the bottom (or `force`); else the "new messages" pill
  scroll(force = false) {
    if (force || this.atBottom) {
      this.root.scrollTop = this.root.scrollHeight;
      this.atBottom = true;
      this.pill.hidden = true;
    } else {
      this.pill.hidden = false;
    }
  }

  // ---- history ---------------------------------------------------------------
  // `runningTurn`: the turn still running; its events are replayed (re-attach), so of its
  // records only the question is drawn here
  render(records, artifacts, runningTurn = null) {
    this.clear();
    this.artifacts = new Map(artifacts.map((a) => [a.id, a]));
    if (!records.length) this.empty("Ask a question about your data to start.");
    if (!records.length && this.root.id === "messages" && this.app && this.app.onEmptyChat) this.app.onEmptyChat(this.root);
    for (const rec of records) {
      if (runningTurn && rec.turn_id === runningTurn && rec.role !== "user") continue;
      this.renderRecord(rec);
      tagSeq(this.root, rec.seq); // search opens a thread at a record; "load earlier" pages from the oldest
    }
    this.bubble = null;
    this.scroll(true);
  }

  renderRecord(rec) {
    if (rec.role === "user") {
      if (rec.meta && rec.meta.kind === "upload" && rec.meta.reimport) this.notice(`Re-imported ${rec.meta.filename}: artifact ${rec.meta.artifact} was replaced.`);
      else if (rec.meta && rec.meta.kind === "upload") {
        this.userUpload(rec.meta.filename, rec.meta.artifacts || [rec.meta.artifact], rec.meta.skipped_sheets || []);
      }
      else {
        this.userMessage(rec.content, rec.seq);
        if (rec.turn_id) this.asked.set(rec.turn_id, rec.content);
      }
    } else if (rec.role === "assistant") {
      const cut = !!(rec.meta && CUT_OFF_KINDS.has(rec.meta.kind)); // the server stopped while it was written
      if (rec.content) {
        const b = this.newBubble();
        b.dataset.seq = String(rec.seq); // report.js: pin a paragraph of this answer
        setHtml(b, rec.html || "");
        addCopyButtons(b);
        if (cut) b.classList.add("interrupted");
        else if (rec.status === "error") b.append(h("p", { class: "error" }, (rec.meta && rec.meta.error) || "the model failed"));
      } else if (!cut && rec.status === "error" && rec.meta && rec.meta.error) {
        this.notice(rec.meta.error, "error");
      }
      for (const call of rec.tool_calls || []) this.card(call.id, call.name, call.arguments, call.input_html);
      if (cut) this.interrupted(rec.meta.error, this.asked.get(rec.turn_id));
      this.bubble = null;
    } else if (rec.role === "tool") {
      const card = this.card(rec.tool_call_id, rec.name, null);
      const status = rec.status || "ok"; // records omit the default status
      this.finishCard(card, {
        ok: status === "ok", status, html: rec.html, meta: rec.meta || {},
        duration_ms: rec.meta && rec.meta.duration_ms, preview: rec.content,
      });
    }
  }

  userMessage(text, seq) {
    this.lastAsked = text;
    const el = h("div", { class: "msg user" }, text);
    if (seq) el.append(pinButton(this.app, seq));
    if (this.root.querySelector(".empty")) this.root.replaceChildren();
    this.root.append(el);
    this.scroll(true); // the user's own question: always shown
    return el;
  }

  // an uploaded file: its artifacts (a workbook: one per sheet), how it was read, the form to re-import it
  userUpload(filename, ids, skipped = []) {
    const el = uploadCard(this.app, this.artifacts, filename, ids.filter(Boolean), skipped);
    if (this.root.querySelector(".empty")) this.root.replaceChildren();
    this.root.append(el);
    this.scroll();
  }

  notice(text, kind = "info") {
    this.root.append(h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text));
    this.scroll();
  }

  // A turn cut off by a stopped server (on restart its partial answer is recorded as interrupted):
  // the notice, and Retry, which sends the user's message `text` again as a new turn.
  interrupted(message, text) {
    const box = h("div", { class: "notice warn interrupted", role: "status" },
      `Interrupted: ${message || "the server stopped before this turn finished"}. `);
    if (text) {
      box.append(h("button", { type: "button", class: "retry", title: "Send the question again as a new turn",
        onclick: async (e) => {
          e.target.disabled = true;
          // the button comes back if nothing was sent (the stream that showed it still closing)
          if (!(await this.app.retry(text))) e.target.disabled = false;
        } }, "Retry"));
    }
    this.root.append(box);
    this.scroll();
    return box;
  }

  newBubble() {
    const el = h("div", { class: "msg assistant markdown" });
    this.root.append(el);
    this.bubble = { el, text: "", html: "" };
    return el;
  }

  // ---- live events -------------------------------------------------------------
  onEvent(type, data) {
    if (type === "message.delta") {
      if (!this.bubble) this.newBubble();
      const b = this.bubble;
      b.text += data.text || "";
      if (data.html !== undefined) {
        b.html = data.html;
        b.rendered = b.text.length;
        setHtml(b.el, b.html);
      } else {
        // not rendered yet: show the new text as plain text after the last rendering
        setHtml(b.el, b.html);
        b.el.append(h("span", { class: "pending" }, b.text.slice(b.rendered || 0)));
      }
    } else if (type === "message.completed") {
      if (!this.bubble) this.newBubble();
      setHtml(this.bubble.el, data.html || "");
      addCopyButtons(this.bubble.el);
      this.bubble = null;
    } else if (type === "tool.started") {
      this.bubble = null;
      const card = this.card(data.call_id, data.name, data.arguments, data.input_html);
      card.el.classList.add("running");
      card.startedAt = Date.now();
      card.status.textContent = "running…";
    } else if (type === "tool.progress") {
      const card = this.cards.get(data.call_id);
      if (card && card.el.classList.contains("running")) this.progress(card, data);
    } else if (type === "artifact.created") {
      const card = this.cards.get(data.call_id);
      if (card && data.artifact) card.pending.push(data.artifact);
    } else if (type === "tool.finished") {
      const card = this.card(data.call_id, data.name, null);
      this.finishCard(card, { ok: data.ok, status: data.ok ? "ok" : "error", html: data.html, meta: data.meta || {},
        duration_ms: data.duration_ms, preview: data.preview });
    } else if (type === "error") {
      const cut = CUT_OFF_KINDS.has(data.kind);
      if (this.bubble && cut) this.bubble.el.classList.add("interrupted");
      this.bubble = null;
      if (cut) this.interrupted(data.message, this.lastAsked);
      else this.notice(data.message || "the turn failed", data.kind === "cancelled" ? "info" : "error");
    } else if (type === "done") {
      this.endTurn(data.status);
    }
    this.scroll();
  }

  // The thread's summary state as a small notice (GET .../task-state): shown when the summary
  // failed or history left the model's request unsummarised; the context inspector has the rest.
  async summaryState(tid = this.app && this.app.thread && this.app.thread.id) {
    if (!tid) return;
    let s;
    try {
      s = (await api("GET", `/api/threads/${encodeURIComponent(tid)}/task-state`)).summary;
    } catch {
      return;
    }
    if (this.app.thread && this.app.thread.id !== tid) return; // another chat is shown now
    this.root.querySelectorAll(".notice.summary-state").forEach((el) => el.remove());
    const dropped = s.dropped_unsummarised_through_seq;
    if (s.state !== "failed" && !dropped) return;
    const parts = [s.state === "failed" ? `The thread summary could not be updated (${s.reason}).` : "The thread summary is behind."];
    if (dropped) parts.push(`Messages up to #${dropped} are no longer sent to the model and no summary covers them; your pinned goal and constraints still are.`);
    this.root.append(h("div", { class: "notice warn summary-state", role: "status" }, parts.join(" ")));
  }

  // The turn ended: a card still running ends as cancelled (or error), never spinning on.
  endTurn(status) {
    setTimeout(() => this.summaryState(), 1500); // the refresh runs after the reply
    if (this.app && this.app.thread) showUsage(this, this.app.thread.id); // usage.js: tokens and cost
    this.bubble = null;
    for (const card of this.cards.values()) {
      if (!card.el.classList.contains("running")) continue;
      const st = status === "cancelled" ? "cancelled" : "error";
      this.finishCard(card, { ok: false, status: st, html: "", meta: {},
        message: st === "cancelled" ? "stopped before it finished" : "the turn ended before this call finished" });
    }
  }

  // ---- live progress of a running call -----------------------------------------
  progress(card, data) {
    if (typeof data.elapsed_s === "number") card.startedAt = Date.now() - data.elapsed_s * 1000;
    card.facts = card.facts || {};
    if (data.rows !== undefined && data.rows !== null) card.facts.rows = data.rows;
    if (data.bytes !== undefined && data.bytes !== null) card.facts.bytes = data.bytes;
    if (data.message) card.facts.message = data.message;
    const text = (data.stdout || "") + (data.stderr || "");
    if (text) {
      if (!card.live) {
        card.liveText = "";
        card.live = h("pre", { class: "code live-output" });
        card.liveBox = h("div", { class: "tool-section live" }, h("div", { class: "label" }, "output so far"), card.live);
        card.body.append(card.liveBox);
      }
      card.liveText = (card.liveText + text).slice(-LIVE_OUTPUT_CHARS);
      card.live.textContent = card.liveText;
      card.live.scrollTop = card.live.scrollHeight;
    }
    this.runningStatus(card);
  }

  runningStatus(card) {
    const parts = ["running…"];
    if (card.startedAt) parts.push(elapsedText((Date.now() - card.startedAt) / 1000));
    const f = card.facts || {};
    if (f.rows !== undefined) parts.push(`${num(f.rows)} rows`);
    if (f.bytes !== undefined) parts.push(bytes(f.bytes));
    if (f.message) parts.push(f.message);
    card.status.textContent = parts.join(" · ");
  }

  tick() {
    for (const card of this.cards.values()) {
      if (card.el.classList.contains("running") && card.startedAt) this.runningStatus(card);
    }
  }

  // ---- tool cards --------------------------------------------------------------
  card(callId, name, rawArgs, inputHtml) {
    let card = this.cards.get(callId);
    if (!card) {
      const status = h("span", { class: "tool-status" });
      const summary = h("summary", {}, h("span", { class: "tool-name" }, name || "tool"), status);
      const body = h("div", { class: "tool-body" });
      const el = h("details", { class: "tool-card", dataset: { call: callId, tool: name || "" } }, summary, body);
      const extras = h("div", { class: "tool-extras" });
      // memorychip.js: a memory or constraint call is one "Memory updated" chip, not a card
      const chip = CHIP_TOOLS.has(name) ? chipFor(this, el, name) : null;
      if (!chip) this.root.append(h("div", { class: "tool-wrap" }, el, extras));
      else if (chip.parentNode !== this.root) this.root.append(chip);
      card = { el, body, status, extras, name, chip, pending: [] };
      this.cards.set(callId, card);
    }
    if (rawArgs !== null && rawArgs !== undefined && !card.argsShown) {
      const a = prettyArgs(rawArgs);
      let pre = h("pre", { class: `code ${a.lang || ""}` }, a.text);
      if (inputHtml) { // highlighted on the server (Pygments), sanitized there
        const tmp = h("div");
        setHtml(tmp, inputHtml);
        pre = tmp.querySelector("pre") || pre;
        pre.classList.add("code", "hl");
      }
      const section = h("div", { class: "tool-section" }, h("div", { class: "label" }, a.label), pre);
      card.body.prepend(section);
      addCopyButtons(section);
      card.argsShown = true;
    }
    return card;
  }

  finishCard(card, { ok, status, html, meta, duration_ms, preview, message }) {
    if (card.ended) return;
    card.ended = true;
    card.el.classList.remove("running");
    const state = endState(ok, status, meta, preview);
    card.el.classList.add(ok ? "ok" : "failed");
    card.el.dataset.state = state.replace(" ", "-");
    if (card.liveBox && !html && !ok) { // stopped (or cut off): what it printed stays shown
      card.liveBox.querySelector(".label").textContent = "printed before it stopped";
      card.liveBox.classList.remove("live");
      card.live.classList.add("stopped-output");
      card.liveBox = card.live = null;
    } else if (card.liveBox) {
      card.liveBox.remove(); // the result below has the output
      card.liveBox = card.live = null;
    }
    // a failed python step opens with its error (a stopped one stays as the user left it)
    if (card.name === "python" && (state === "error" || state === "timed out")) card.el.open = true;
    const parts = [state];
    if (meta.rows !== undefined && meta.rows !== null) parts.push(`${num(meta.rows)} rows`);
    else if (meta.artifact && meta.artifact.rows !== undefined && meta.artifact.rows !== null) parts.push(`${num(meta.artifact.rows)} rows`);
    if (duration_ms) parts.push(`${(duration_ms / 1000).toFixed(2)} s`);
    card.status.textContent = parts.join(" · ");
    if (card.chip) setTimeout(() => updateChip(card.chip)); // after its result is in

    const art = meta.artifact;
    if (art) {
      card.body.append(this.offloadNotice(art));
    } else if (meta.truncated) {
      card.body.append(h("div", { class: "notice warn tool-notice" },
        `Truncated: the ${meta.rows !== undefined ? `${num(meta.rows)}-row ` : ""}result was cut to a preview. ` +
        "The full data was not saved (no code execution here), so only the rows shown reached the model."));
    }
    const result = h("div", { class: "tool-section" }, h("div", { class: "label" }, ok ? "result" : state));
    const out = h("div", { class: `tool-result ${ok ? "" : "error"}` });
    if (html) setHtml(out, html);
    else if (message) out.append(h("p", { class: "muted" }, message));
    result.append(out);
    card.body.append(result);
    modelNotes(out);
    addCopyButtons(out);
    collapsible(out);

    // charts inline (outside the collapsed card), files and reports as links
    const dark = meta.dark_images || {};
    for (const id of meta.images || []) {
      card.extras.append(figureImage(id, dark[id], (this.artifacts.get(id) || {}).title));
    }
    for (const id of meta.charts || []) card.extras.append(vegaChart(id, (this.artifacts.get(id) || {}).title));
    const shown = new Set([...(meta.images || []), ...Object.values(dark), ...(meta.charts || [])]);
    for (const f of meta.artifacts || []) {
      if (shown.has(f.id)) continue;
      card.extras.append(this.fileLink(f));
    }
  }

  offloadNotice(art) {
    const known = this.artifacts.get(art.id) || art;
    const expired = known.status === "expired";
    const rows = art.rows !== null && art.rows !== undefined ? `${num(art.rows)} rows × ${art.columns} columns` : "the full result";
    const box = h("div", { class: `notice tool-notice ${expired ? "warn" : "info"}`, dataset: { artifact: art.id } });
    if (expired) {
      box.append(`Expired: artifact ${art.id} (${rows}) was removed from the cache. `);
      if (known.can_requery) {
        box.append(h("button", { type: "button", class: "requery", onclick: (e) => this.app.requery(art.id, e.target) },
          "Re-run query"));
      } else {
        box.append("It cannot be re-run automatically (the tool is not read-only): ask again.");
      }
      return box;
    }
    box.append(`Offloaded: ${rows} (${bytes(art.bytes)} ${art.format}) saved as artifact ${art.id}. ` +
      "The model saw only this preview, not the full data. ");
    if (known.status === "partial" || art.status === "partial") {
      box.append(h("strong", { class: "partial" }, known.partial_by === "source"
        ? "Partial (by the source): the source itself cut this result. " : "Partial: not all rows were kept. "));
    }
    const base = `/api/artifacts/${encodeURIComponent(art.id)}/download`;
    box.append(h("a", { href: base, class: "download", download: "" }, art.format === "parquet" ? "Download Parquet" : "Download"));
    if (art.format === "parquet") {
      box.append(" · ", h("a", { href: `${base}?format=csv`, class: "download", download: "" }, "CSV"), " ",
        gridButton(art.id, `Result ${art.id} · ${rows}`));
    }
    return box;
  }

  fileLink(f) {
    const name = f.file || f.id;
    const ext = (f.format || "").toLowerCase();
    const id = encodeURIComponent(f.id);
    if (REPORT_FORMATS.has(ext)) {
      return h("div", { class: "file-link report" }, "Report: ",
        h("a", { href: `/api/artifacts/${id}/view`, target: "_blank", rel: "noopener", class: "open-report" }, name),
        ` (${bytes(f.bytes)}) · `, h("a", { href: `/api/artifacts/${id}/download`, download: "" }, "download"));
    }
    if (IMAGE_FORMATS.has(ext)) {
      const src = `/api/artifacts/${id}/view`;
      const img = h("img", { class: "chart", src, alt: name, loading: "lazy" });
      img.addEventListener("click", () => chartViewer(src, name));
      return img;
    }
    return h("div", { class: "file-link" }, "File: ", h("a", { href: `/api/artifacts/${id}/download`, download: "" }, name),
      ` (${bytes(f.bytes)}) `, GRID_FORMATS.has(ext) ? gridButton(f.id, name) : null);
  }
}

// Draw a thread from its log; `thread.turn` is the turn still running (the caller re-attaches).
export async function loadThread(conv, tid, replay = true) {
  const [detail, artifacts] = await Promise.all([
    api("GET", `/api/threads/${encodeURIComponent(tid)}?limit=500`),
    api("GET", `/api/threads/${encodeURIComponent(tid)}/artifacts`).catch((e) => {
      toast(e.message);
      return [];
    }),
  ]);
  conv.render(detail.records, artifacts, replay ? detail.thread.turn : null);
  conv.summaryState(tid); // a notice when the summary failed or history left the model's request
  branchControls(conv, tid, detail.records); // branches.js: Edit, Regenerate, "‹ n / m ›"
  stepControls(conv, tid, detail.records); // steps.js: Edit and re-run a step, the SQL scratchpad
  refreshControls(conv, tid, detail.records); // refresh.js: the last refresh's summary card
  showUsage(conv, tid); // usage.js: tokens and cost per turn and for the chat
  if (detail.has_more) $("#messages").prepend(earlierButton(conv, tid)); // history.js
  return detail.thread;
}
