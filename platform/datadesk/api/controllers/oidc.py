"""Single sign-on routes (OpenID Connect, `[auth.oidc]`; the logic is in api/sso/):

- `GET /api/auth/options`: what the login page offers ({sso, label, login_url, code_login});
- `GET /auth/oidc/login[?next=/path]`: starts a sign-in: the flow cookie, then the provider;
- `GET /auth/oidc/callback`: the provider's return (the redirect URI to register): checks,
  syncs the user's grants, opens a session of `auth.session_max_age_s`, goes to `next`;
- `POST /auth/oidc/logout`: ends DataDesk's session (CSRF-checked like every browser POST) and
  answers the provider's end-session URL, where the browser goes next (RP-initiated logout);
- `GET /auth/oidc/logged-out`: where the provider sends the browser back after its logout.

Every refusal is a page that says what happened (api/sso/errors.py), and an audit entry.
`refuse_code_login` / `code_login_off_page` are what the code and token logins of session.py
answer when `auth.code_login = false`.
"""

from __future__ import annotations

import html
from typing import Any

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import PermissionDeniedException
from litestar.response import Redirect, Response

from datadesk.api.guards.auth import SESSION_COOKIE, RuntimeDep
from datadesk.api.sso.errors import FlowRejected, ProviderRefused, ProviderUnreachable, SSOError, SSOUnavailable
from datadesk.api.sso.flow import FLOW_COOKIE, FLOW_PATH, FLOW_TTL_S, Flow, check_state, open_flow, safe_next, seal
from datadesk.api.sso.oidc import OIDCClient
from datadesk.api.sso.signin import SSOSignIn

SSO_COOKIE = "datadesk_sso"  # this session came from SSO; its ID token for the provider's logout (`id_token_hint`)
MAX_HINT_CHARS = 3800  # a larger token (a long groups claim) is not kept: logout sends client_id alone
CALLBACK_PATH = "/auth/oidc/callback"
LOGGED_OUT_PATH = "/auth/oidc/logged-out"
CODE_LOGIN_OFF = ("Signing in with a login link, a login code or an API token is turned off on this server "
                  "(auth.code_login = false): use single sign-on. API clients still send their token as "
                  "'Authorization: Bearer <token>'.")


def refuse_code_login(rt: Any) -> None:
    """403 for a browser login by code or token when `auth.code_login` is false."""
    if not rt.settings.auth.code_login:
        raise PermissionDeniedException(CODE_LOGIN_OFF)


def code_login_off_page() -> Response[str]:
    return sso_page("Login links are turned off", f"<p>{html.escape(CODE_LOGIN_OFF)}</p>"
                    '<p><a class="button" href="/">Go to the login page</a></p>', status=403)


def sso_page(title: str, body: str, status: int = 200, cookies: list[Cookie] | None = None) -> Response[str]:
    """A small page in the login page's look (no script)."""
    doc = (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
           '<meta name="viewport" content="width=device-width,initial-scale=1">'
           f'<link rel="stylesheet" href="/static/app.css"></head><body class="dd-login-page"><main>'
           f'<h1>{html.escape(title)}</h1>{body}</main></body></html>')
    return Response(doc, status_code=status, media_type="text/html", cookies=cookies or [],
                    headers={"Cache-Control": "no-store"})


def error_page(exc: SSOError, cookies: list[Cookie] | None = None) -> Response[str]:
    again = ('<a class="button" id="sso-retry" href="/auth/oidc/login">Try again</a> '
             if isinstance(exc, (ProviderUnreachable, ProviderRefused, FlowRejected)) else "")
    body = (f'<p id="sso-error">{html.escape(exc.message)}</p>'
            f'<p>{again}<a class="button" id="login-again" href="/">Go to the login page</a></p>')
    return sso_page(exc.title, body, status=exc.status, cookies=cookies)


def _gone(key: str, path: str, samesite: str = "strict") -> Cookie:
    return Cookie(key=key, value="", max_age=0, path=path, httponly=True, samesite=samesite)  # type: ignore[arg-type]


def base_url(request: Request, rt: Any) -> str:
    """This app's external base URL: `auth.oidc.public_url`, `server.public_url`, else the request's."""
    configured = rt.settings.auth.oidc.public_url or rt.settings.server.public_url
    if configured:
        return configured.rstrip("/")
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def oidc_client(request: Request, rt: Any) -> OIDCClient:
    """This app's provider client (made once, kept in the app's state)."""
    if not rt.settings.auth.oidc.issuer:
        raise SSOUnavailable("Single sign-on is not configured on this server (auth.oidc.issuer is empty).",
                             "sso: not configured")
    client = request.app.state.get("oidc_client")
    if client is None:
        client = OIDCClient(rt.settings.auth.oidc, counter=getattr(rt, "counters", None))
        request.app.state["oidc_client"] = client
    return client


def _client_address(request: Request) -> str | None:
    failures = request.app.state.get("login_failures")
    return failures.address(request.scope) if failures is not None else (request.client.host if request.client else None)


def _audit(request: Request, rt: Any, action: str, user: str | None, outcome: str = "ok",
           detail: str | None = None) -> None:
    audit = getattr(rt, "audit", None)
    if audit is not None:
        audit.record(action, user=user, outcome=outcome, detail=detail, client=_client_address(request))


class OIDCController(Controller):
    path = "/"

    @get("/api/auth/options")
    async def options(self, rt: RuntimeDep) -> dict[str, Any]:
        """What the login page offers; public (the login page reads it before anyone signs in)."""
        oidc, auth = rt.settings.auth.oidc, rt.settings.auth
        return {"sso": bool(oidc.issuer), "label": oidc.button_label, "login_url": "/auth/oidc/login",
                "code_login": auth.code_login}

    @get("/auth/oidc/login", include_in_schema=False)
    async def login(self, request: Request, rt: RuntimeDep) -> Response[Any]:
        """Start a sign-in at the provider; `next` (a path of this app) is where it ends."""
        try:
            flow = Flow.new(safe_next(request.query_params.get("next")))
            url = await oidc_client(request, rt).authorization_url(flow, base_url(request, rt) + CALLBACK_PATH)
        except SSOError as exc:
            _audit(request, rt, "sign_in_failed", None, "refused", exc.reason)
            return error_page(exc)
        cookie = Cookie(key=FLOW_COOKIE, value=seal(flow, request.app.state.csrf_key), max_age=FLOW_TTL_S,
                        path=FLOW_PATH, httponly=True, samesite="lax", secure=rt.settings.auth.cookie_secure)
        return Redirect(url, status_code=303, cookies=[cookie], headers={"Cache-Control": "no-store"})

    @get(CALLBACK_PATH, include_in_schema=False)
    async def callback(self, request: Request, rt: RuntimeDep) -> Response[Any]:
        """The provider's return: a session for a checked, synced user, else a page saying why."""
        q = request.query_params
        drop_flow = _gone(FLOW_COOKIE, FLOW_PATH, "lax")
        try:
            client = oidc_client(request, rt)
            flow = open_flow(request.cookies.get(FLOW_COOKIE), request.app.state.csrf_key)
            check_state(flow, q.get("state"))
            if q.get("iss") is not None and q.get("iss") != client.issuer:  # RFC 9207: no mix-up of providers
                raise FlowRejected(f"The sign-in response names the issuer {q.get('iss')[:120]!r}, not the "
                                   f"configured provider {client.issuer!r}.", "sso: response from another issuer")
            if q.get("error"):
                said = f"{q.get('error')[:80]}" + (f": {q.get('error_description', '')[:300]}"
                                                   if q.get("error_description") else "")
                raise ProviderRefused(f"The sign-in provider answered: {said}.", f"sso: provider said {q.get('error')[:40]}")
            if not q.get("code"):
                raise FlowRejected("The sign-in provider returned without a sign-in code.", "sso: no code")
            done = await SSOSignIn(client, rt.users).complete(q["code"], flow, base_url(request, rt) + CALLBACK_PATH)
        except SSOError as exc:
            _audit(request, rt, "sign_in_failed", exc.user, "refused", exc.reason)
            return error_page(exc, cookies=[drop_flow])
        old = request.cookies.get(SESSION_COOKIE)
        if old:
            rt.users.end_session(old)  # a sign-in replaces this browser's session
        max_age = rt.settings.auth.session_max_age_s
        sid = rt.users.new_session(done.user.id, max_age)
        rt.users.record_login(done.user.id)
        _audit(request, rt, "sign_in", done.user.id, detail="sso")
        secure = rt.settings.auth.cookie_secure
        cookies = [Cookie(key=SESSION_COOKIE, value=sid, httponly=True, samesite="strict", path="/",
                          secure=secure, max_age=max_age), drop_flow]
        hint = done.id_token if len(done.id_token) <= MAX_HINT_CHARS else "sso"  # "sso": too big to keep
        cookies.append(Cookie(key=SSO_COOKIE, value=hint, httponly=True, samesite="strict", path=FLOW_PATH,
                              secure=secure, max_age=max_age))
        return Redirect(flow.next, status_code=303, cookies=cookies, headers={"Cache-Control": "no-store"})

    @post("/auth/oidc/logout", status_code=200, include_in_schema=False)
    async def logout(self, request: Request, rt: RuntimeDep) -> Response[dict[str, Any]]:
        """End this browser's session; `redirect` is the provider's logout, when it has one."""
        sid = request.cookies.get(SESSION_COOKIE)
        hint = request.cookies.get(SSO_COOKIE)  # set by an SSO sign-in: only then the provider's logout too
        user = rt.users.by_session(sid) if sid else None
        if sid:
            rt.users.end_session(sid)
        if user is not None:
            _audit(request, rt, "sign_out", user.id, detail="sso" if hint else None)
        out: dict[str, Any] = {"logged_out": True, "redirect": None}
        if rt.settings.auth.oidc.issuer and hint:
            try:
                out["redirect"] = await oidc_client(request, rt).end_session_url(
                    hint if hint.count(".") == 2 else None, base_url(request, rt) + LOGGED_OUT_PATH)
            except ProviderUnreachable as exc:
                out["provider_error"] = exc.message  # DataDesk's session is over all the same
        return Response(out, cookies=[_gone(SESSION_COOKIE, "/"), _gone(SSO_COOKIE, FLOW_PATH)],
                        headers={"Cache-Control": "no-store"})

    @get(LOGGED_OUT_PATH, include_in_schema=False)
    async def logged_out(self) -> Response[str]:
        """The provider's logout sends the browser back here."""
        return sso_page("You are signed out", "<p>You are signed out of DataDesk and of your sign-in provider.</p>"
                        '<p><a class="button" id="login-again" href="/">Sign in again</a></p>')
