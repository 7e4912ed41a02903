// Sharing a chat inside its workspace (issue 32): the owner's Share dialog (create a link, copy,
// revoke) and the read-only view a colleague opens from the link (`/#s=<share id>`, sign-in
// needed): a banner "Shared by … · read only · Copy into my chats", the records as the owner
// sees them, charts and the grid read through the share (GET /api/shares/{sid}/...).

import { api, setPathRewrite } from "./api.js";
import { $, h, toast, when } from "./dom.js";

const enc = encodeURIComponent;
const ARTIFACT_URL = /^\/api\/artifacts\//;
let shared = null; // {sid, observer} while a shared chat is shown

// ---- the owner's dialog -------------------------------------------------------------------
function linkOf(share) {
  return `${location.origin}/#s=${share.id}`;
}

async function copyLink(url, button) {
  try {
    if (navigator.clipboard && window.isSecureContext) await navigator.clipboard.writeText(url);
    else {
      const area = h("textarea", { class: "offscreen", "aria-hidden": "true" });
      area.value = url;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy link"; }, 1500);
  } catch (e) {
    toast(`Could not copy: ${e.message}`);
  }
}

function shareRow(share, refresh) {
  const url = linkOf(share);
  const input = h("input", { type: "text", readonly: true, value: url, class: "share-link", "aria-label": "Share link" });
  input.addEventListener("focus", () => input.select());
  const row = h("li", { class: `share-row ${share.active ? "" : "revoked"}`, dataset: { share: share.id } });
  if (!share.active) {
    row.append(h("span", { class: "muted" }, `Revoked ${when(share.revoked)} · created ${when(share.created)}`));
    return row;
  }
  const copy = h("button", { type: "button", class: "share-copy" }, "Copy link");
  copy.addEventListener("click", () => copyLink(url, copy));
  const revoke = h("button", { type: "button", class: "danger share-revoke" }, "Revoke");
  revoke.addEventListener("click", async () => {
    try {
      await api("DELETE", `/api/shares/${enc(share.id)}`);
      toast("Link revoked: it no longer opens for anyone.", "info");
      await refresh();
    } catch (e) {
      toast(e.message);
    }
  });
  row.append(input, h("span", { class: "share-row-actions" }, copy, revoke),
    h("span", { class: "muted share-when" }, `created ${when(share.created)}`));
  return row;
}

function shareDialog() {
  let dlg = $("#share-dialog");
  if (dlg) return dlg;
  dlg = h("dialog", { id: "share-dialog", class: "share-dialog", "aria-labelledby": "share-title" },
    h("h3", { id: "share-title" }, "Share this chat"),
    h("p", { id: "share-explain", class: "muted" }),
    h("ul", { id: "share-list", class: "share-list" }),
    h("div", { class: "dialog-actions" },
      h("button", { id: "share-create", type: "button", class: "primary" }, "Create link"),
      h("button", { id: "share-close", type: "button" }, "Close")));
  document.body.append(dlg);
  $("#share-close", dlg).addEventListener("click", () => dlg.close());
  return dlg;
}

async function openShareDialog(app) {
  const thread = app.thread;
  if (!thread) return;
  const dlg = shareDialog();
  $("#share-explain", dlg).textContent = `People of workspace “${thread.workspace}” who sign in can open this chat ` +
    "read only and copy it into their own chats, with its tables and charts. They never reach your kernel, memory, " +
    "drafts or task state. Revoke a link to close it for everyone.";
  const list = $("#share-list", dlg);
  const refresh = async () => {
    const shares = await api("GET", `/api/shares?thread=${enc(thread.id)}`);
    list.replaceChildren(...shares.map((s) => shareRow(s, refresh)));
    if (!shares.length) list.append(h("li", { class: "muted" }, "No links yet."));
  };
  $("#share-create", dlg).onclick = async () => {
    try {
      await api("POST", `/api/threads/${enc(thread.id)}/shares`);
      await refresh();
      const first = list.querySelector(".share-row:not(.revoked) .share-link");
      if (first) first.focus();
    } catch (e) {
      toast(e.message);
    }
  };
  try {
    await refresh();
  } catch (e) {
    toast(e.message);
    return;
  }
  if (!dlg.open) dlg.showModal();
}

export function initShare(app) {
  const btn = $("#share-thread");
  if (btn) btn.addEventListener("click", () => openShareDialog(app));
  // a link pasted into a tab that has the app open already changes only the hash: start over,
  // as a new tab would (a chat still loading here would otherwise draw over the shared one)
  window.addEventListener("hashchange", () => {
    const sid = sharedFromHash();
    if (sid && (!shared || shared.sid !== sid)) location.reload();
  });
}

// ---- the read-only view -------------------------------------------------------------------
function throughShare(sid) {
  return (path) => path.replace(ARTIFACT_URL, `/api/shares/${enc(sid)}/artifacts/`);
}

// every artifact URL in `root` (images, links) read through the share
function pointAll(root, rewrite) {
  const nodes = root.querySelectorAll ? root.querySelectorAll("[src^='/api/artifacts/'], [href^='/api/artifacts/']") : [];
  for (const el of [root, ...nodes]) {
    for (const attr of ["src", "href"]) {
      const v = el.getAttribute && el.getAttribute(attr);
      if (v && ARTIFACT_URL.test(v)) el.setAttribute(attr, rewrite(v));
    }
  }
}

function banner(view, sid) {
  const who = view.share.mine ? "you" : view.share.owner_name;
  const fork = h("button", { type: "button", id: "share-fork", class: "primary" }, "Copy into my chats");
  fork.addEventListener("click", async () => {
    fork.disabled = true;
    try {
      const copy = await api("POST", `/api/shares/${enc(sid)}/fork`);
      location.hash = `t=${copy.id}`;
      location.reload(); // the copy opens as any chat of one's own
    } catch (e) {
      fork.disabled = false;
      toast(e.message);
    }
  });
  const report = h("button", { type: "button", id: "share-report", "aria-pressed": "false" }, "Report page");
  report.addEventListener("click", () => toggleReport(sid, report));
  return h("div", { id: "shared-banner", class: "banner shared-banner", role: "status" },
    h("span", {}, "Shared by ", h("strong", {}, who), ` · ${when(view.share.created)} · read only · `),
    h("span", { class: "shared-banner-actions" }, report, fork));
}

// the thread's report page, through the same share (read only), in place of the messages
async function toggleReport(sid, button) {
  const messages = $("#messages");
  let page = $("#shared-report");
  if (page && !page.hidden) {
    page.hidden = true;
    messages.hidden = false;
    button.setAttribute("aria-pressed", "false");
    button.textContent = "Report page";
    return;
  }
  try {
    const report = await api("GET", `/api/shares/${enc(sid)}/report`);
    const { renderReport } = await import("./report.js"); // the report page's own drawing (report.js)
    if (!page) {
      page = h("div", { id: "shared-report", class: "report-body shared-report" });
      messages.before(page);
    }
    renderReport(page, report, { editable: false });
    page.hidden = false;
    messages.hidden = true;
    button.setAttribute("aria-pressed", "true");
    button.textContent = "Back to the chat";
  } catch (e) {
    toast(e.message);
  }
}

function notFound(app, sid) {
  $("#thread-title").textContent = "Shared chat not found";
  app.conv.root.replaceChildren(h("div", { class: "shared-missing" },
    h("p", {}, "This link does not open a chat for you: it was revoked, its chat was deleted, or it is shared in a " +
      "workspace you are not a member of."),
    h("p", {}, h("a", { href: "/", id: "shared-home" }, "Back to my chats"))));
  void sid;
}

// Show share `sid` read only; true when the view (or its "not found") is shown
export async function openShare(app, sid) {
  leaveShare(app);
  const rewrite = throughShare(sid);
  document.body.classList.add("shared-view");
  $("#thread-actions").hidden = true;
  let view;
  try {
    view = await api("GET", `/api/shares/${enc(sid)}`);
  } catch (e) {
    if (e.status === 404 || e.status === 400) notFound(app, sid);
    else toast(e.message);
    shared = { sid, observer: null };
    return true;
  }
  setPathRewrite(rewrite); // the grid (pages, column profiles, group-bys) reads through the share too
  const observer = new MutationObserver((changes) => {
    for (const c of changes) {
      if (c.type === "attributes") pointAll(c.target, rewrite);
      for (const n of c.addedNodes || []) if (n.nodeType === 1) pointAll(n, rewrite);
    }
  });
  observer.observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ["src", "href"] });
  shared = { sid, observer };
  app.thread = null; // nothing of the owner's is "the open thread": no action, no send
  $("#thread-title").textContent = view.thread.title;
  app.conv.render(view.records, view.artifacts);
  pointAll(app.conv.root, rewrite);
  app.conv.root.before(banner(view, sid));
  return true;
}

// Back to one's own chats (opening a thread of one's own calls this)
export function leaveShare() {
  if (!shared) return;
  if (shared.observer) shared.observer.disconnect();
  setPathRewrite(null);
  document.body.classList.remove("shared-view");
  for (const sel of ["#shared-banner", "#shared-report"]) {
    const el = $(sel);
    if (el) el.remove();
  }
  $("#messages").hidden = false;
  shared = null;
}

export function sharedFromHash() {
  return new URLSearchParams(location.hash.slice(1)).get("s");
}
