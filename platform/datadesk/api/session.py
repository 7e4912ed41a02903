"""Login (token or one-time code -> session cookie), logout, me, health."""

from __future__ import annotations

from typing import Any

from litestar.params import FromQuery, JSONBody
from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import NotAuthorizedException
from litestar.response import Redirect, Response

from datadesk import __version__
from datadesk.api.auth import SESSION_COOKIE, CurrentUser, RuntimeDep
from datadesk.api.schemas import Login, MeOut
from datadesk.api.security import csrf_token


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


class SessionController(Controller):
    path = "/"

    @post("/api/login", status_code=200, opt={"login": True})
    async def login(self, request: Request, data: JSONBody[Login], rt: RuntimeDep) -> Response[dict[str, Any]]:
        """Exchange an API token or a one-time login code for a session cookie."""
        if bool(data.token) == bool(data.code):
            raise NotAuthorizedException("send exactly one of 'token' or 'code'")
        user = rt.users.by_token(data.token) if data.token else rt.users.redeem_login_code(data.code or "")
        if user is None:
            raise NotAuthorizedException("invalid, used or expired login code or token")
        sid = rt.users.new_session(user.id, rt.settings.auth.session_ttl_s)
        return Response({"user": user.id, "csrf": csrf_token(request.app.state.csrf_key, sid)}, cookies=[session_cookie(rt, sid)])

    @get("/login", opt={"login": True}, include_in_schema=False)
    async def login_link(self, rt: RuntimeDep, code: FromQuery[str] = "") -> Response[Any]:
        """The printed login URL: redeem the one-time code, set the cookie, go to the app."""
        user = rt.users.redeem_login_code(code)
        if user is None:
            return Response(
                "This login link is invalid, expired or already used. Ask an admin for a new one "
                "(`datadesk users login-url NAME`).", status_code=401, media_type="text/plain")
        sid = rt.users.new_session(user.id, rt.settings.auth.session_ttl_s)
        return Redirect("/", cookies=[session_cookie(rt, sid)])

    @post("/api/logout", status_code=200)
    async def logout(self, request: Request, user: CurrentUser, rt: RuntimeDep) -> Response[dict[str, Any]]:
        sid = request.cookies.get(SESSION_COOKIE)
        if sid:
            rt.users.end_session(sid)
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
    async def health(self, rt: RuntimeDep) -> dict[str, Any]:
        return {"status": "ok", "version": __version__, "model": rt.model_info()}
