// Single sign-on in the browser (issue 30): the login page's SSO button, the code-login switch,
// and a logout that also signs out at the provider. Loaded on its own (index.html); it reads
// GET /api/auth/options ({sso, label, login_url, code_login}) and changes only the login card.
//
// - `sso`: a button (a plain link to /auth/oidc/login, so the server starts the flow) above
//   the code/token form, labelled `auth.oidc.button_label`;
// - `code_login` false: the code/token form is hidden (the server refuses it anyway);
// - logout: a click on the top bar's "Log out" is taken first (capture phase) and sent to
//   POST /auth/oidc/logout, which ends DataDesk's session and answers the provider's
//   end-session URL; the browser goes there, and the provider sends it back.

import { api, setCsrf } from "./api.js";
import { $, h } from "./dom.js";

function ensureStyles() {
  if ($("#sso-css")) return;
  document.head.append(h("link", { id: "sso-css", rel: "stylesheet", href: "/static/sso.css" }));
}

function ssoButton(opts) {
  const form = $("#login-form");
  if (!form || $("#sso-button")) return;
  const next = location.pathname + location.search;
  const href = next && next !== "/" ? `${opts.login_url}?next=${encodeURIComponent(next)}` : opts.login_url;
  const box = h("div", { id: "sso-login", class: "sso-login" },
    h("a", { id: "sso-button", class: "button sso-button", href }, opts.label));
  if (opts.code_login) box.append(h("p", { class: "sso-or muted" }, "or"));
  form.querySelector("h1").after(box);
}

function hideCodeLogin() {
  const form = $("#login-form");
  if (!form) return;
  for (const el of form.children) {
    if (el.tagName !== "H1" && el.id !== "sso-login" && el.id !== "login-error") el.hidden = true;
  }
  const input = $("#login-secret");
  if (input) input.required = false;
  form.append(h("p", { id: "code-login-off", class: "muted" },
    "Sign-in with login links and API tokens is turned off on this server."));
}

async function logout(e) {
  if (!(e.target instanceof Element) || !e.target.closest("#logout")) return;
  e.preventDefault();
  e.stopImmediatePropagation(); // app.js's own handler would only end DataDesk's session
  const me = window.datadesk && window.datadesk.me;
  if (me && me.csrf) setCsrf(me.csrf);
  let out = null;
  try {
    out = await api("POST", "/auth/oidc/logout");
  } catch {
    // the session is gone already: nothing left to end here
  }
  if (out && out.redirect) {
    location.assign(out.redirect);
    return;
  }
  location.hash = "";
  location.reload();
}

async function init() {
  let opts;
  try {
    opts = await api("GET", "/api/auth/options");
  } catch {
    return; // an older server: the login card stays as it is
  }
  ensureStyles();
  if (opts.sso) {
    ssoButton(opts);
    window.addEventListener("click", logout, true);
  }
  if (!opts.code_login) hideCodeLogin();
}

init();
