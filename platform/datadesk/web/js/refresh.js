// Refresh an analysis and schedule it (issue 31): the Refresh button of the open thread
// (POST /api/threads/{tid}/refresh, its progress per step live), the refresh summary card (rows
// old -> new, sum and schema changes, the new report versions; GET .../refresh), the schedule
// dialog (PUT/GET/DELETE .../schedule) and the thread list's badge.

import { api, postStream } from "./api.js";
import { $, h, toast } from "./dom.js";

const enc = encodeURIComponent;

function hhmm(ts) {
  return new Date(ts * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function num(v) {
  return typeof v === "number" ? v.toLocaleString(undefined, { maximumSignificantDigits: 8 }) : String(v ?? "?");
}

// The thread list's badge: "refreshed 07:30, 2 changes" (or "refresh failed 07:30").
export function refreshBadge(r) {
  if (!r || !r.at) return null;
  const text = r.status === "ok" ? `refreshed ${hhmm(r.at)}, ${r.changes} change${r.changes === 1 ? "" : "s"}`
    : `refresh failed ${hhmm(r.at)}`;
  return h("span", { class: `badge refreshed ${r.status === "ok" ? "" : "failed"}`, title: `Last refresh (${r.trigger})` }, text);
}

export function initRefresh(app) {
  const btn = $("#refresh-thread");
  if (!btn || btn.dataset.wired) return;
  btn.dataset.wired = "1";
  btn.addEventListener("click", () => runRefresh(app));
  const sched = $("#schedule-thread");
  if (sched) sched.addEventListener("click", () => openSchedule(app));
}

function stepLine(d) {
  const what = d.kind === "query" ? "query" : "python";
  return `Step ${d.n} of ${d.of}: ${d.name} (${what}) — ${d.status === "running" ? "running…" : d.status}`
    + (d.summary && d.summary.length ? `: ${d.summary.join("; ")}` : "");
}

// Run a refresh: a live card with a line per step, then the thread drawn again (its summary card).
export async function runRefresh(app) {
  const conv = app.conv;
  const tid = app.thread && app.thread.id;
  if (!tid) return toast("Open a chat first.");
  if (app.running) return toast("A turn is running: wait for it or stop it first.");
  const lines = h("ol", { class: "refresh-steps" });
  const card = h("div", { class: "refresh-card running", role: "status" }, h("div", { class: "label" }, "Refreshing…"), lines);
  conv.root.append(card);
  conv.scroll();
  const running = new AbortController();
  app.running = running;
  try {
    await postStream(`/api/threads/${enc(tid)}/refresh`, {}, (type, data) => {
      if (type === "refresh.started") card.querySelector(".label").textContent = `Refreshing: ${data.steps} steps…`;
      else if (type === "refresh.step") {
        let li = lines.querySelector(`li[data-n="${data.n}"]`);
        if (!li) lines.append((li = h("li", { dataset: { n: String(data.n) } })));
        li.className = `step ${data.status}`;
        li.textContent = stepLine(data);
      } else if (type === "error") conv.notice(data.message || "the refresh failed", "error");
      conv.scroll();
    }, running.signal);
  } catch (e) {
    card.remove();
    conv.notice(e.message, "error");
  }
  if (app.running === running) app.running = null;
  const { loadThread } = await import("./chat.js");
  app.thread = await loadThread(conv, tid);
  if (app.refreshThreads) await app.refreshThreads();
}

// After a thread is drawn (chat.js loadThread): the summary card after the refresh's own message.
export async function refreshControls(conv, tid, records) {
  reportButtons(conv);
  const last = [...records].reverse().find((r) => r.role === "assistant" && (r.meta || {}).via === "refresh" && !(r.tool_calls || []).length);
  if (!last) return;
  let report;
  try {
    report = await api("GET", `/api/threads/${enc(tid)}/refresh`);
  } catch {
    return; // never refreshed (or cleared meanwhile)
  }
  if (!conv.app || !conv.app.thread || conv.app.thread.id !== tid) return;
  conv.root.querySelectorAll(".refresh-card").forEach((el) => el.remove());
  conv.root.append(summaryCard(report));
  conv.scroll();
}

// "Refresh" beside each report a python step wrote: the same refresh of the whole thread, whose
// summary card links the report's new version.
function reportButtons(conv) {
  for (const link of conv.root.querySelectorAll(".file-link.report")) {
    if (link.querySelector(".refresh-report")) continue;
    link.append(" · ", h("button", { type: "button", class: "refresh-report link-btn",
      title: "Re-run this chat's queries and the Python that wrote this report, on today's data",
      onclick: () => runRefresh(conv.app) }, "Refresh"));
  }
}

function changeLines(s) {
  const c = s.change || {};
  const out = [];
  if (c.rows_old !== c.rows_new) out.push(`rows ${num(c.rows_old)} → ${num(c.rows_new)}`);
  for (const col of c.columns_added || []) out.push(`column added: ${col}`);
  for (const col of c.columns_removed || []) out.push(`column removed: ${col}`);
  for (const [col, [a, b]] of Object.entries(c.types_changed || {})) out.push(`${col}: type ${a} → ${b}`);
  for (const x of c.sums || []) out.push(`sum of ${x.column}: ${num(x.old)} → ${num(x.new)}`);
  return out.length ? out : [`unchanged (${num(c.rows_new)} rows)`];
}

export function summaryCard(report) {
  const head = report.status === "ok" ? `Refreshed ${hhmm(report.finished || report.started)}` : `Refresh ${report.status}`;
  const card = h("div", { class: `refresh-card ${report.status}`, dataset: { refresh: report.id } },
    h("div", { class: "label" }, `${head} · ${report.changes} change${report.changes === 1 ? "" : "s"}`
      + (report.trigger === "schedule" ? " · scheduled" : "")));
  if (report.error) card.append(h("div", { class: "refresh-error" }, report.error));
  const list = h("ul", { class: "refresh-steps" });
  for (const s of report.steps || []) {
    const li = h("li", { class: `step ${s.ok ? "ok" : "error"}` });
    if (s.kind === "query") {
      li.append(h("b", {}, `${s.name} → ${s.artifact}: `), changeLines(s).join("; "));
      if (s.previous) li.append(" ", h("a", { href: `/api/artifacts/${enc(s.previous)}/download`, class: "previous" }, "old data"));
    } else {
      li.append(h("b", {}, "python: "), s.ok ? "ran again" : `failed: ${s.error}`);
      for (const o of s.outputs || []) {
        if (!o.new) continue;
        li.append(" · ", h("a", { href: `/api/artifacts/${enc(o.new)}/view`, target: "_blank", rel: "noopener", class: "new-version" },
          `${o.file} (new version)`));
        if (o.old) li.append(" ", h("a", { href: `/api/artifacts/${enc(o.old)}/view`, target: "_blank", rel: "noopener", class: "old-version" }, "old"));
      }
    }
    if (!s.ok && s.kind === "query") li.append(` failed: ${s.error}`);
    list.append(li);
  }
  card.append(list);
  return card;
}

// ---- the schedule dialog ---------------------------------------------------------------------
async function openSchedule(app) {
  const tid = app.thread && app.thread.id;
  if (!tid) return toast("Open a chat first.");
  let current = null;
  try {
    current = await api("GET", `/api/threads/${enc(tid)}/schedule`);
  } catch {
    current = null;
  }
  document.querySelector("#schedule-dialog")?.remove();
  const mode = h("select", { id: "schedule-mode", "aria-label": "schedule kind" },
    h("option", { value: "at" }, "Every day at"), h("option", { value: "cron" }, "Cron expression"));
  const value = h("input", { id: "schedule-value", "aria-label": "time or cron", placeholder: "07:30", autocomplete: "off" });
  const tz = h("input", { id: "schedule-tz", "aria-label": "time zone", autocomplete: "off" });
  tz.value = (current && current.tz) || Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  if (current) {
    mode.value = current.cron ? "cron" : "at";
    value.value = current.cron || current.at || "";
  }
  mode.addEventListener("change", () => { value.placeholder = mode.value === "at" ? "07:30" : "0 7 * * 1-5"; });
  const status = h("p", { id: "schedule-status", class: "muted" }, current
    ? `Next run ${current.next_run}` + (current.last_status ? ` · last: ${current.last_status}` + (current.last_error ? ` (${current.last_error})` : "") : "")
    : "No schedule yet.");
  const error = h("p", { id: "schedule-error", class: "error", role: "alert" });
  const close = () => { dlg.close(); dlg.remove(); };
  const save = async () => {
    const body = { [mode.value]: value.value.trim() };
    if (tz.value.trim()) body.tz = tz.value.trim();
    try {
      const s = await api("PUT", `/api/threads/${enc(tid)}/schedule`, body);
      toast(`Scheduled: next run ${s.next_run}`);
      close();
    } catch (e) {
      error.textContent = e.message;
    }
  };
  const remove = async () => {
    try {
      await api("DELETE", `/api/threads/${enc(tid)}/schedule`);
      toast("Schedule removed.");
      close();
    } catch (e) {
      error.textContent = e.message;
    }
  };
  const dlg = h("dialog", { id: "schedule-dialog", class: "schedule-dialog" },
    h("h3", {}, "Schedule a refresh"), h("div", { class: "schedule-row" }, mode, value),
    h("label", { class: "schedule-row" }, "Time zone ", tz), status, error,
    h("div", { class: "dialog-actions" },
      current ? h("button", { type: "button", id: "schedule-remove", class: "danger", onclick: remove }, "Remove") : null,
      h("button", { type: "button", id: "schedule-cancel", onclick: close }, "Cancel"),
      h("button", { type: "button", id: "schedule-save", class: "primary", onclick: save }, "Save")));
  document.body.append(dlg);
  dlg.showModal();
  value.focus();
}
