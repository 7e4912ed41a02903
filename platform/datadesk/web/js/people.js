// People (admins only): the users of this server with their workspaces, permissions, last
// sign-in and API tokens; add, edit, revoke, restore, delete; invitation links. A secret (a new
// token, a login or invitation link) is shown once, with a copy button, until the next change.
// Loaded on its own (index.html); it adds a "People" button to the top bar for admins once the
// app has signed in (app.js sets window.datadesk.me), and talks to /api/people/... (api.js adds
// the CSRF header).

import { api } from "./api.js";
import { $, confirmDialog, h, relative, toast, when } from "./dom.js";

const enc = encodeURIComponent;
const PERMISSION_LABELS = { code_execution: "run code", memory: "memory", admin: "admin" };
const view = { secret: null, editing: null };

// ---- wiring ------------------------------------------------------------------------------------
function ensureStyles() {
  if ($("#people-css")) return;
  document.head.append(h("link", { id: "people-css", rel: "stylesheet", href: "/static/people.css" }));
}

function isAdmin() {
  const me = window.datadesk && window.datadesk.me;
  return Boolean(me && (me.permissions || []).includes("admin"));
}

function syncButton() {
  let btn = $("#open-people");
  if (!btn) {
    btn = h("button", { id: "open-people", type: "button", hidden: true, onclick: openPeople }, "People");
    const nav = $(".top-actions");
    if (!nav) return;
    nav.insertBefore(btn, $("#user-name"));
  }
  btn.hidden = $("#app-view").hidden || !isAdmin();
}

function dialog() {
  let dlg = $("#people-dialog");
  if (!dlg) {
    dlg = h("dialog", { id: "people-dialog", class: "people-dialog", "aria-labelledby": "people-title" },
      h("div", { class: "people-head" },
        h("h2", { id: "people-title" }, "People"),
        h("button", { type: "button", class: "icon-btn", id: "people-close", "aria-label": "Close", title: "Close",
          onclick: () => dlg.close() }, "✕")),
      h("div", { id: "people-body", class: "people-body", "aria-live": "polite" }));
    dlg.addEventListener("close", () => { view.secret = null; view.editing = null; });
    document.body.append(dlg);
  }
  return dlg;
}

async function openPeople() {
  ensureStyles();
  const dlg = dialog();
  if (!dlg.open) dlg.showModal();
  await render();
}

// Run one change, then show the list again; `shown(result)` keeps a one-time secret to show.
async function act(fn, shown) {
  view.secret = null;
  try {
    const result = await fn();
    if (shown) view.secret = shown(result);
  } catch (e) {
    toast(e.message);
  }
  await render();
}

// ---- the view ----------------------------------------------------------------------------------
async function render() {
  const body = $("#people-body");
  let users;
  let invitations;
  try {
    [users, invitations] = await Promise.all([api("GET", "/api/people/users"), api("GET", "/api/people/invitations")]);
  } catch (e) {
    body.replaceChildren(h("p", { class: "error", id: "people-error" }, e.message));
    return;
  }
  body.replaceChildren(...[secretBox(), usersSection(users), invitationsSection(users, invitations)].filter(Boolean));
  body.dataset.ready = "1";
}

function secretBox() {
  const s = view.secret;
  if (!s) return null;
  const input = h("input", { id: "people-secret", class: "people-secret-value", readonly: true, value: s.value,
    "aria-label": s.label, onfocus: (e) => e.target.select() });
  return h("div", { class: "people-secret", role: "status" },
    h("strong", {}, s.label), h("p", { class: "muted" }, s.note),
    h("div", { class: "people-secret-row" }, input,
      h("button", { type: "button", id: "people-copy", onclick: () => copy(input) }, "Copy"),
      h("button", { type: "button", class: "icon-btn", "aria-label": "Dismiss", title: "Dismiss",
        onclick: () => { view.secret = null; render(); } }, "✕")));
}

async function copy(input) {
  input.focus();
  input.select();
  try {
    await navigator.clipboard.writeText(input.value);
    toast("Copied to the clipboard.", "info");
  } catch {
    toast("Could not copy here: the text is selected, press Ctrl+C (⌘C).", "info");
  }
}

// A grants picker: a checkbox per known workspace (and the given ones), another workspace by
// name, and a checkbox per permission. `read()` gives {workspaces, permissions}.
function grantsPicker(all, chosen, permissions, chosenPerms, prefix) {
  const names = [...new Set([...all, ...chosen])];
  const wsBoxes = names.map((ws) => h("input", { type: "checkbox", value: ws, checked: chosen.includes(ws),
    dataset: { workspace: ws } }));
  const other = h("input", { type: "text", class: "people-other-ws", placeholder: "another workspace",
    "aria-label": "Another workspace", id: `${prefix}-other-ws`, size: 16 });
  const permBoxes = permissions.map((p) => h("input", { type: "checkbox", value: p, checked: chosenPerms.includes(p),
    dataset: { permission: p } }));
  const el = h("div", { class: "people-grants" },
    h("fieldset", {}, h("legend", {}, "Workspaces"),
      ...wsBoxes.map((b) => h("label", { class: "people-check" }, b, ` ${b.value}`)), other),
    h("fieldset", {}, h("legend", {}, "Permissions"),
      ...permBoxes.map((b) => h("label", { class: "people-check" }, b, ` ${PERMISSION_LABELS[b.value] || b.value}`))));
  const read = () => ({
    workspaces: [...wsBoxes.filter((b) => b.checked).map((b) => b.value),
      ...other.value.split(/[\s,]+/).filter(Boolean)],
    permissions: permBoxes.filter((b) => b.checked).map((b) => b.value),
  });
  return { el, read };
}

// ---- users -------------------------------------------------------------------------------------
function usersSection(data) {
  const rows = [];
  for (const u of data.users) {
    rows.push(userRow(u, data));
    if (view.editing === u.id) rows.push(editRow(u, data));
  }
  return h("section", { class: "people-users" },
    h("h3", {}, "Users"),
    h("div", { class: "people-scroll" }, h("table", { class: "people-table", id: "people-users" },
      h("thead", {}, h("tr", {}, ...["User", "Workspaces", "Permissions", "Last sign-in", "API tokens", "Status", ""]
        .map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...rows))),
    addUserForm(data));
}

function userRow(u, data) {
  const you = u.id === data.me;
  const path = `/api/people/users/${enc(u.id)}`;
  const name = h("td", {}, h("strong", {}, u.name), you ? h("span", { class: "badge" }, "you") : null,
    u.sso ? h("span", { class: "badge people-sso", title: u.sso_issuer || "" }, "SSO") : null);
  const actions = h("td", { class: "people-actions" },
    h("button", { type: "button", class: "people-edit", onclick: () => { view.editing = u.id; view.secret = null; render(); } }, "Edit"),
    u.revoked
      ? h("button", { type: "button", class: "people-restore", onclick: () => act(() => api("POST", `${path}/restore`)) }, "Restore")
      : h("button", { type: "button", class: "people-revoke danger", onclick: () => revokeUser(u) }, "Revoke"),
    u.revoked ? null : h("button", { type: "button", class: "people-new-token", onclick: () => act(
      () => api("POST", `${path}/tokens`),
      (r) => ({ label: `New API token for ${u.id}`, value: r.token, note: "Shown once: store it now." })) }, "New token"),
    u.revoked ? null : h("button", { type: "button", class: "people-login-link", onclick: () => act(
      () => api("POST", `${path}/login-link`),
      (r) => ({ label: `One-time login link for ${u.id}`, value: r.url,
        note: `Works once, for ${Math.round(r.expires_in_s / 60)} minutes. Send it to ${u.id} privately.` })) }, "Login link"),
    h("button", { type: "button", class: "people-delete danger", onclick: () => deleteUser(u) }, "Delete"));
  return h("tr", { dataset: { user: u.id }, class: u.revoked ? "revoked" : "" },
    name,
    h("td", {}, u.workspaces.join(", ")),
    h("td", {}, u.permissions.map((p) => PERMISSION_LABELS[p] || p).join(", ") || h("span", { class: "muted" }, "none")),
    h("td", { title: u.last_login ? when(u.last_login) : "" }, u.last_login ? relative(u.last_login) : h("span", { class: "muted" }, "never")),
    h("td", {}, tokensCell(u)),
    h("td", { class: "people-status" }, u.revoked ? "revoked" : "active"),
    actions);
}

function tokensCell(u) {
  const live = u.tokens.filter((t) => !t.revoked);
  if (!u.tokens.length) return h("span", { class: "muted" }, "none");
  const list = h("ul", { class: "people-tokens" }, ...u.tokens.map((t) => h("li", { dataset: { token: t.id } },
    h("code", {}, t.id), ` ${when(t.created)} `,
    t.revoked ? h("span", { class: "muted" }, "revoked")
      : h("button", { type: "button", class: "link-btn people-revoke-token", onclick: () => act(
        () => api("DELETE", `/api/people/users/${enc(u.id)}/tokens/${enc(t.id)}`)) }, "revoke"))));
  return h("details", {}, h("summary", {}, `${live.length} active of ${u.tokens.length}`), list);
}

function editRow(u, data) {
  const picker = grantsPicker(data.workspaces, u.workspaces, data.permissions, u.permissions, "people-edit");
  const form = h("form", { class: "people-form", id: "people-edit-form" }, picker.el,
    h("div", { class: "people-form-actions" },
      h("button", { type: "submit", class: "primary" }, "Save"),
      h("button", { type: "button", onclick: () => { view.editing = null; render(); } }, "Cancel")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    view.editing = null;
    act(() => api("PATCH", `/api/people/users/${enc(u.id)}`, picker.read()));
  });
  return h("tr", { class: "people-editing" }, h("td", { colspan: 7 }, h("p", {}, `Edit ${u.id}:`), form));
}

function addUserForm(data) {
  const picker = grantsPicker(data.workspaces, [], data.permissions, [], "people-add");
  const name = h("input", { id: "people-add-name", required: true, maxlength: 64, pattern: "[A-Za-z0-9_\\-]{1,64}",
    autocomplete: "off", "aria-label": "User name" });
  const form = h("form", { class: "people-form", id: "people-add-form" },
    h("label", {}, "User name ", name), picker.el,
    h("div", { class: "people-form-actions" }, h("button", { type: "submit", class: "primary" }, "Add user")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(() => api("POST", "/api/people/users", { name: name.value.trim(), ...picker.read() }),
      (r) => ({ label: `API token for ${r.user.id}`, value: r.token,
        note: "Shown once: store it now. They can paste it on the login page, or use an invitation instead." }));
  });
  return h("details", { class: "people-add" }, h("summary", {}, "Add a user (with an API token)"), form);
}

async function revokeUser(u) {
  if (await confirmDialog(`Revoke ${u.id}?`, `Every API token and session of ${u.id} stops working at once. You can restore them later (with a new token).`, "Revoke")) {
    act(() => api("POST", `/api/people/users/${enc(u.id)}/revoke`));
  }
}

async function deleteUser(u) {
  if (await confirmDialog(`Delete ${u.id}?`, `This deletes user ${u.id} and ALL their threads, artifacts and memory, in every workspace. It cannot be undone.`, "Delete")) {
    act(() => api("DELETE", `/api/people/users/${enc(u.id)}?yes=true`));
  }
}

// ---- invitations -------------------------------------------------------------------------------
function invitationsSection(users, data) {
  const days = data.ttl_s / 86400;
  const life = days >= 1 ? `${Math.round(days * 10) / 10} day(s)` : `${Math.round(data.ttl_s / 3600)} hour(s)`;
  const picker = grantsPicker(users.workspaces, [], users.permissions, [], "people-invite");
  const name = h("input", { id: "people-invite-name", maxlength: 64, pattern: "[A-Za-z0-9_\\-]{1,64}",
    autocomplete: "off", placeholder: "optional: the invitee picks one", "aria-label": "User name (optional)" });
  const form = h("form", { class: "people-form", id: "people-invite-form" }, picker.el,
    h("label", {}, "User name ", name),
    h("div", { class: "people-form-actions" }, h("button", { type: "submit", class: "primary", id: "people-invite" }, "Create invitation link")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const body = picker.read();
    if (name.value.trim()) body.name = name.value.trim();
    act(() => api("POST", "/api/people/invitations", body),
      (r) => ({ label: "Invitation link", value: r.url,
        note: `Shown once. It makes one account with ${r.invitation.workspaces.join(", ")}, once, within ${life}.` }));
  });
  const rows = data.invitations.map((i) => h("tr", { dataset: { invitation: i.id, state: i.state } },
    h("td", {}, i.name || h("span", { class: "muted" }, "anyone")),
    h("td", {}, i.workspaces.join(", ")),
    h("td", {}, i.permissions.map((p) => PERMISSION_LABELS[p] || p).join(", ") || h("span", { class: "muted" }, "none")),
    h("td", {}, i.created_by, h("span", { class: "muted" }, ` ${relative(i.created)}`)),
    h("td", { class: "people-inv-state" }, invitationState(i)),
    h("td", {}, i.state === "open" ? h("button", { type: "button", class: "people-revoke-invitation danger",
      onclick: () => act(() => api("DELETE", `/api/people/invitations/${enc(i.id)}`)) }, "Revoke") : null)));
  return h("section", { class: "people-invitations" },
    h("h3", {}, "Invitations"),
    h("p", { class: "muted" }, `A link that creates one account with the workspaces it names, once, within ${life}.`),
    form,
    rows.length ? h("div", { class: "people-scroll" }, h("table", { class: "people-table", id: "people-invitations" },
      h("thead", {}, h("tr", {}, ...["For", "Workspaces", "Permissions", "Made by", "State", ""].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, ...rows))) : h("p", { class: "muted" }, "No invitations yet."));
}

function invitationState(i) {
  if (i.state === "used") return `used by ${i.used_by} ${relative(i.used_at)}`;
  if (i.state === "open") return `open, expires ${relative(i.expires)}`;
  if (i.state === "expired") return `expired ${relative(i.expires)}`;
  return "revoked";
}

// ---- start -------------------------------------------------------------------------------------
const appView = $("#app-view");
if (appView) {
  new MutationObserver(syncButton).observe(appView, { attributes: true, attributeFilter: ["hidden"] });
  syncButton();
}
