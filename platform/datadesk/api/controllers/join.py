"""Joining with an invitation: `GET /join?code=...` shows what it grants and asks for a user
name (unless the invitation fixes one); `POST /join` redeems it, creates the user, signs them
in (the session cookie of the login flow) and sends them to `/`.

As the login link's confirm page (api/controllers/session.py): opening the link changes nothing
(a link preview or a mail scanner cannot use it up); the form only counts from this site and
from the browser that opened the page (a nonce cookie and an HMAC of it in the form); someone
already signed in is never switched to a new account. A used, expired or revoked invitation
gets a page that says which (410); an unknown code a 401 page, counted like a failed login
(handler opt `login`: api/guards/security.py LoginLimiter).
"""

from __future__ import annotations

import hashlib
import hmac
import html
import secrets
import time
from typing import Annotated, Any
from urllib.parse import quote

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromQuery
from litestar.response import Redirect, Response

from datadesk.api.controllers.session import _cross_site, session_cookie
from datadesk.api.guards.auth import SESSION_COOKIE, RuntimeDep
from datadesk.domain.users import Invitation
from datadesk.store.interfaces.users import UserError, invitation_problem

JOIN_NONCE_COOKIE = "datadesk_join"
JOIN_NONCE_TTL_S = 1800  # time to pick a name


def _page(title: str, body: str, status: int = 200, cookies: list[Cookie] | None = None) -> Response[str]:
    """A page in the login pages' look (app.css `.dd-login-page`); no icon to fetch."""
    doc = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
           '<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
           f'<link rel="stylesheet" href="/static/app.css"></head><body class="dd-login-page"><main>'
           f'<h1>{html.escape(title)}</h1>{body}</main></body></html>')
    return Response(doc, status_code=status, media_type="text/html", cookies=cookies or [])


def join_url(code: str) -> str:
    """The path of an invitation's link."""
    return f"/join?code={quote(code, safe='')}"


def _confirm_token(request: Request, nonce: str) -> str:
    return hmac.new(request.app.state.csrf_key, b"join-confirm:" + nonce.encode(), hashlib.sha256).hexdigest()


def _signed_in(request: Request, rt: Any):
    sid = request.cookies.get(SESSION_COOKIE)
    return rt.users.by_session(sid) if sid else None


def _client(request: Request) -> str:
    return request.app.state.login_failures.address(request.scope)


def _refused_page(request: Request, rt: Any, inv: Invitation | None, problem: UserError) -> Response[str]:
    """An invitation that cannot be used: 401 for an unknown code (counted), 410 for one used,
    expired or revoked; recorded as a failed sign-in."""
    rt.audit.record("sign_in_failed", user=None, outcome="refused", target=inv.id if inv else None,
                    detail=f"invitation: {problem}", client=_client(request))
    return _page("This invitation does not work", (
        f'<p id="join-problem">{html.escape(str(problem).capitalize())}.</p>'
        "<p>Ask an admin of this DataDesk for a new invitation.</p>"
        '<p><a class="button" href="/">Go to the login page</a></p>'), status=401 if inv is None else 410)


def _signed_in_page(current: Any) -> Response[str]:
    return _page("Already signed in", (
        f"<p>You are signed in as <strong>{html.escape(current.name)}</strong>. This invitation makes a new "
        "account, so nothing was changed.</p><p>To join as someone new, log out first (in the app), then open "
        'the link again. <a href="/">Back to the app</a></p>'), status=409)


def _form(request: Request, code: str, inv: Invitation, nonce: str, error: str = "",
          name: str = "", status: int = 200, cookies: list[Cookie] | None = None) -> Response[str]:
    grants = ", ".join(html.escape(w) for w in inv.workspaces)
    extra = f"; permissions: {html.escape(', '.join(inv.permissions))}" if inv.permissions else ""
    if inv.name is not None:
        who = f"<p>Join as <strong>{html.escape(inv.name)}</strong>.</p>"
        field, label = "", f"Join as {html.escape(inv.name)}"
    else:
        who = "<p>Choose your user name: letters, digits, <code>-</code> and <code>_</code> (at most 64).</p>"
        field = ('<p><label>User name <input id="join-name" name="name" required maxlength="64" '
                 f'pattern="[A-Za-z0-9_\\-]{{1,64}}" autocomplete="username" value="{html.escape(name)}"></label></p>')
        label = "Join"
    shown_error = f'<p id="join-error" class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return _page("Join DataDesk", (
        f"<p>You are invited to the workspace(s) <strong>{grants}</strong>{extra}.</p>{who}{shown_error}"
        '<form method="post" action="/join">'
        f'<input type="hidden" name="code" value="{html.escape(code)}">'
        f'<input type="hidden" name="confirm" value="{_confirm_token(request, nonce)}">'
        f'{field}<button type="submit" id="join-submit">{label}</button></form>'
        "<p>The invitation works once. If you did not expect it, close this page.</p>"),
        status=status, cookies=cookies)


class JoinController(Controller):
    path = "/join"
    include_in_schema = False

    @get("/", opt={"login": True})  # redeems nothing; an unknown code counts as a failure
    async def join_page(self, request: Request, rt: RuntimeDep, code: FromQuery[str] = "") -> Response[str]:
        current = _signed_in(request, rt)
        if current is not None:
            return _signed_in_page(current)
        inv = rt.users.peek_invitation(code)
        problem = invitation_problem(inv, time.time())
        if problem is not None:
            return _refused_page(request, rt, inv, problem)
        nonce = secrets.token_urlsafe(24)
        cookies = [Cookie(key=JOIN_NONCE_COOKIE, value=nonce, httponly=True, samesite="strict", path="/join",
                          secure=rt.settings.auth.cookie_secure, max_age=JOIN_NONCE_TTL_S)]
        if request.cookies.get(SESSION_COOKIE):  # a stale session cookie: dropped, it would block the POST
            cookies.append(Cookie(key=SESSION_COOKIE, value="", max_age=0, path="/", httponly=True, samesite="strict"))
        return _form(request, code, inv, nonce, cookies=cookies)

    @post("/", opt={"login": True}, status_code=303)
    async def join(self, request: Request, rt: RuntimeDep,
                   data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]) -> Response[Any]:
        """The form: only from this site and the browser that opened the page; then the
        invitation is redeemed (one-time) and its new user signed in."""
        nonce = request.cookies.get(JOIN_NONCE_COOKIE) or ""
        sent = str(data.get("confirm") or "")
        if _cross_site(request) or not nonce or not hmac.compare_digest(sent, _confirm_token(request, nonce)):
            return _page("Joining not confirmed", "<p>This was not sent from the invitation's page. "
                         "Open the invitation link again.</p>", status=403)
        current = _signed_in(request, rt)
        if current is not None:
            return _signed_in_page(current)
        code, name = str(data.get("code") or ""), str(data.get("name") or "").strip()
        try:
            user = rt.users.redeem_invitation(code, name or None)
        except (UserError, ValueError) as exc:
            inv = rt.users.peek_invitation(code)
            problem = invitation_problem(inv, time.time())
            if problem is not None:  # unknown, or used/expired/revoked (perhaps just now, by someone else)
                return _refused_page(request, rt, inv, problem)
            return _form(request, code, inv, nonce, error=str(exc), name=name, status=400)
        sid = rt.users.new_session(user.id, rt.settings.auth.session_ttl_s)
        rt.users.record_login(user.id)
        used = rt.users.peek_invitation(code)
        rt.audit.record("sign_in", user=user.id, target=used.id if used else None,
                        detail="joined with an invitation", client=_client(request))
        gone = Cookie(key=JOIN_NONCE_COOKIE, value="", max_age=0, path="/join", httponly=True, samesite="strict")
        return Redirect("/", status_code=303, cookies=[session_cookie(rt, sid), gone])
