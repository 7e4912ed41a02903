"""Login (token or one-time code -> session cookie), logout, me, health."""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
from typing import Annotated, Any

from litestar.enums import RequestEncodingType
from litestar.params import Body, FromQuery, JSONBody
from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import ClientException, NotAuthorizedException, TooManyRequestsException
from litestar.response import Redirect, Response

from datadesk import __version__
from datadesk.api.controllers.audit import client_of
from datadesk.api.controllers.oidc import code_login_off_page, refuse_code_login  # auth.code_login
from datadesk.api.guards.auth import SESSION_COOKIE, CurrentUser, RuntimeDep
from datadesk.api.schemas import Login, MeOut
from datadesk.api.guards.security import csrf_token
from datadesk.store.users import credential_account


def sandbox_status(rt: RuntimeDep, permissions: list[str]) -> dict[str, Any]:
    """What the UI says about code execution: available, and if not, why (engine or permission)."""
    can = "code_execution" in permissions
    healthy, why = rt.sandbox_health()
    if rt.kernels is None:
        healthy, why = False, "the sandbox is turned off on this server (sandbox.backend = \"none\")"
    reason = "" if can and healthy else (
        why if can else "you do not have the code-execution permission: large results are truncated "
                        "instead of analysed in Python (ask an admin for it)")
    return {"available": healthy, "can_execute_code": can, "reason": reason,
            "backend": rt.settings.sandbox.backend}


def session_cookie(rt: RuntimeDep, sid: str) -> Cookie:
    return Cookie(key=SESSION_COOKIE, value=sid, httponly=True, samesite="strict", path="/",
                  secure=rt.settings.auth.cookie_secure, max_age=rt.settings.auth.session_ttl_s)


LOGIN_NONCE_COOKIE = "datadesk_login"  # binds the confirm form to the browser that opened the link
LOGIN_NONCE_TTL_S = 600


def _page(title: str, body: str, status: int = 200, cookies: list[Cookie] | None = None) -> Response[str]:
    doc = (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
           '<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
           f'<link rel="stylesheet" href="/static/app.css"></head><body class="dd-login-page"><main>'
           f'<h1>{html.escape(title)}</h1>{body}</main></body></html>')
    return Response(doc, status_code=status, media_type="text/html", cookies=cookies or [])


def _confirm_token(request: Request, nonce: str) -> str:
    key = request.app.state.csrf_key
    return hmac.new(key, b"login-confirm:" + nonce.encode(), hashlib.sha256).hexdigest()


def _cross_site(request: Request) -> bool:
    """A browser says the request came from another site (Sec-Fetch-Site, else Origin)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}"


def _signed_in(request: Request, rt: RuntimeDep):
    sid = request.cookies.get(SESSION_COOKIE)
    return rt.users.by_session(sid) if sid else None


def _already_signed_in(user: Any, other: Any) -> Response[str]:
    whose = f" as {html.escape(other.name)}" if other is not None else ""
    return _page("Already signed in", (
        f"<p>You are signed in as <strong>{html.escape(user.name)}</strong>. This link would sign you "
        f"in{whose} instead, so nothing was changed.</p><p>To switch accounts, log out first "
        "(in the app), then open the link again. <a href=\"/\">Back to the app</a></p>"), status=409)


def _bad_link_page() -> Response[str]:
    """A used, expired or mistyped login link: a page saying so, with a way to log in (401)."""
    return _page("This login link does not work", (
        "<p>It is invalid, expired (a link lasts 10 minutes) or already used (each link signs in once).</p>"
        "<p>Ask an admin for a new one (<code>datadesk users login-url NAME</code>), or log in with a login "
        "code or an API token:</p>"
        '<p><a class="button" id="login-again" href="/">Go to the login page</a></p>'), status=401)


def _account_guard(request: Request, credential: str) -> str | None:
    """The account `credential` names; 429 when that account is under attack and this address
    has failed too (api/guards/security.py LoginFailures)."""
    failures = request.app.state.login_failures
    account = credential_account(credential)
    refused = failures.account_refusal(account, failures.address(request.scope))
    if refused is not None:
        message, wait = refused
        request.app.state.runtime.audit.record("sign_in_failed", user=account, outcome="refused",
                                               detail="too many failed sign-ins", client=client_of(request))
        raise TooManyRequestsException(message, headers={"Retry-After": str(wait)})
    return account


class SessionController(Controller):
    path = "/"

    @post("/api/login", status_code=200, opt={"login": True})
    async def login(self, request: Request, data: JSONBody[Login], rt: RuntimeDep) -> Response[dict[str, Any]]:
        """Exchange an API token or a one-time login code for a session cookie."""
        refuse_code_login(rt)  # auth.code_login = false: single sign-on only (Bearer tokens still work)
        if bool(data.token) == bool(data.code):
            raise NotAuthorizedException("send exactly one of 'token' or 'code'")
        account = _account_guard(request, data.token or data.code or "")
        user = rt.users.by_token(data.token) if data.token else rt.users.peek_login_code(data.code or "")
        current = _signed_in(request, rt)
        if user is not None and current is not None and current.id != user.id:
            raise ClientException(f"you are signed in as {current.name}: log out first to sign in as "
                                  "another user", status_code=409)
        if data.code:
            user = rt.users.redeem_login_code(data.code)
        how = "token" if data.token else "code"
        if user is None:
            request.app.state.login_failures.failed_account(account)
            rt.audit.record("sign_in_failed", user=account, outcome="refused",
                            detail=f"invalid, used or expired {how}", client=client_of(request))
            raise NotAuthorizedException("invalid, used or expired login code or token")
        sid = rt.users.new_session(user.id, rt.settings.auth.session_ttl_s)
        rt.users.record_login(user.id)
        rt.audit.record("sign_in", user=user.id, detail=how, client=client_of(request))
        return Response({"user": user.id, "csrf": csrf_token(request.app.state.csrf_key, sid)}, cookies=[session_cookie(rt, sid)])

    @get("/login", include_in_schema=False, opt={"login": True})  # redeems nothing; a bad code counts
    async def login_link(self, request: Request, rt: RuntimeDep, code: FromQuery[str] = "") -> Response[Any]:
        """The printed login URL: a page that asks to confirm (POST); opening it changes nothing,
        and it never replaces the session of someone already signed in."""
        if not rt.settings.auth.code_login:
            return code_login_off_page()
        account = _account_guard(request, code)
        target = rt.users.peek_login_code(code)
        current = _signed_in(request, rt)
        if current is not None:
            return _already_signed_in(current, target)
        if target is None:
            request.app.state.login_failures.failed_account(account)
            rt.audit.record("sign_in_failed", user=account, outcome="refused",
                            detail="invalid, used or expired login link", client=client_of(request))
            return _bad_link_page()
        nonce = secrets.token_urlsafe(24)
        cookies = [Cookie(key=LOGIN_NONCE_COOKIE, value=nonce, httponly=True, samesite="strict", path="/login",
                          secure=rt.settings.auth.cookie_secure, max_age=LOGIN_NONCE_TTL_S)]
        if request.cookies.get(SESSION_COOKIE):  # a stale session cookie: dropped, it would block the POST
            cookies.append(Cookie(key=SESSION_COOKIE, value="", max_age=0, path="/", httponly=True, samesite="strict"))
        return _page("Sign in to DataDesk", (
            f"<p>Sign in as <strong>{html.escape(target.name)}</strong>?</p>"
            '<form method="post" action="/login">'
            f'<input type="hidden" name="code" value="{html.escape(code)}">'
            f'<input type="hidden" name="confirm" value="{_confirm_token(request, nonce)}">'
            f'<button type="submit" id="login-confirm">Sign in as {html.escape(target.name)}</button>'
            "</form><p>If you did not ask for this link, close this page.</p>"), cookies=cookies)

    @post("/login", opt={"login": True}, include_in_schema=False, status_code=303)
    async def login_confirm(
        self, request: Request, rt: RuntimeDep,
        data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
    ) -> Response[Any]:
        """The confirm form: only from this site, from the browser that opened the link (its
        nonce cookie), and never while someone is signed in; then the code is redeemed."""
        if not rt.settings.auth.code_login:
            return code_login_off_page()
        nonce = request.cookies.get(LOGIN_NONCE_COOKIE) or ""
        sent = str(data.get("confirm") or "")
        if _cross_site(request) or not nonce or not hmac.compare_digest(sent, _confirm_token(request, nonce)):
            return _page("Login not confirmed", "<p>This sign-in was not confirmed from the login page. "
                         "Open the login link again.</p>", status=403)
        code = str(data.get("code") or "")
        current = _signed_in(request, rt)
        if current is not None:
            return _already_signed_in(current, rt.users.peek_login_code(code))
        account = _account_guard(request, code)
        user = rt.users.redeem_login_code(code)
        if user is None:
            request.app.state.login_failures.failed_account(account)
            rt.audit.record("sign_in_failed", user=account, outcome="refused",
                            detail="invalid, used or expired login link", client=client_of(request))
            return _bad_link_page()
        sid = rt.users.new_session(user.id, rt.settings.auth.session_ttl_s)
        rt.users.record_login(user.id)
        rt.audit.record("sign_in", user=user.id, detail="login link", client=client_of(request))
        gone = Cookie(key=LOGIN_NONCE_COOKIE, value="", max_age=0, path="/login", httponly=True, samesite="strict")
        return Redirect("/", status_code=303, cookies=[session_cookie(rt, sid), gone])

    @post("/api/logout", status_code=200)
    async def logout(self, request: Request, user: CurrentUser, rt: RuntimeDep) -> Response[dict[str, Any]]:
        sid = request.cookies.get(SESSION_COOKIE)
        if sid:
            rt.users.end_session(sid)
            rt.audit.record("sign_out", user=user.id, client=client_of(request))
        return Response({"logged_out": True},
                        cookies=[Cookie(key=SESSION_COOKIE, value="", max_age=0, path="/", httponly=True,
                                        samesite="strict")])

    @get("/api/me")
    async def me(self, request: Request, user: CurrentUser, rt: RuntimeDep) -> MeOut:
        sid = request.cookies.get(SESSION_COOKIE)
        return MeOut(id=user.id, name=user.name, workspaces=user.workspaces,
                     permissions=user.permissions, model=rt.model_info(),
                     sandbox=sandbox_status(rt, user.permissions),
                     csrf=csrf_token(request.app.state.csrf_key, sid) if sid and not request.headers.get("authorization") else None)

    @get("/api/health")
    async def health(self, rt: RuntimeDep, request: Request) -> dict[str, Any]:
        disk = await rt.disk.recent_status()  # statvfs in its own thread: a network file system may be slow
        out = {"status": "degraded" if disk["low"] else "ok", "version": __version__, "model": rt.model_info(),
               "disk": disk}
        lag = request.app.state.get("loop_lag")
        if lag is not None:  # api/looplag.py: how late this worker's event loop runs
            out["loop"] = lag.report()
        return out
