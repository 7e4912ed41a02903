"""`/api/people/...` (admins only): the users of this server and their invitations, managed from
the browser with the rules of `datadesk users ...` (cli.py): the same validation and messages,
a user's first API token shown once, deletion only when confirmed (`?yes=true`).

- `GET  /api/people/users`: every user with workspaces, permissions, revoked, last sign-in
  and API tokens (id, created, revoked: never a hash), the known workspaces and permissions;
- `POST /api/people/users` adds one (201, its token once); `PATCH .../{name}` edits its
  workspaces and/or permissions; `POST .../{name}/revoke|restore`; `POST .../{name}/tokens`
  (201, the token once); `DELETE .../{name}/tokens/{id}` revokes one token; `POST
  .../{name}/login-link` is `datadesk users login-url`; `DELETE .../{name}?yes=true` deletes;
- `GET|POST /api/people/invitations`, `DELETE /api/people/invitations/{id}` (revoke). An
  invitation lasts `auth.invitation_ttl_s`; its link (`/join?code=...`) is shown once.

The server keeps an active admin: an admin may not revoke, delete or take the admin permission
from themselves while no other active admin exists (409; another admin, or the CLI on the
server, can). A revoked user gets no new token or login link until restored (409), where the
CLI would hand out one that does not work. Every change is recorded in the audit trail
(action "admin", the admin as user, the user or invitation as target); a non-admin's change is
refused (403) and recorded as refused. CSRF: as every state-changing request
(api/guards/security.py). The join page is api/controllers/join.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from litestar import Controller, Request, Router, delete, get, patch, post
from litestar.exceptions import ClientException, PermissionDeniedException
from litestar.params import FromPath, FromQuery, JSONBody

from datadesk.api.controllers.join import JoinController, join_url
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.domain.ids import InvalidId, check_id
from datadesk.domain.users import PERMISSION_NAMES, Invitation, User
from datadesk.sandbox.sessions import purge_user_slots
from datadesk.store.interfaces.users import UserError


class NewUser(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    workspaces: list[str]
    permissions: list[str] = msgspec.field(default_factory=list)


class UserEdit(msgspec.Struct, forbid_unknown_fields=True):
    workspaces: list[str] | None = None
    permissions: list[str] | None = None


class NewInvitation(msgspec.Struct, forbid_unknown_fields=True):
    workspaces: list[str]
    permissions: list[str] = msgspec.field(default_factory=list)
    name: str | None = None  # the user name it creates; None: the invitee chooses one


ADMIN_ONLY = "people are managed by admins: you do not have the admin permission"
_FIELD_WORDS = (("permission", "permissions"), ("workspace", "workspaces"), ("user name", "name"),
                ("already exists", "name"))


def bad_input(exc: ValueError) -> ClientException:
    """A refused store operation as a 400 that names the field it is about (`extra.field`)."""
    text = str(exc)
    if isinstance(exc, InvalidId):
        field = {"user name": "name", "workspace": "workspaces"}.get(exc.kind, exc.kind)
    else:
        field = next((f for word, f in _FIELD_WORDS if word in text), None)
    return ClientException(text, extra={"field": field} if field else None)


def _user_now(rt: Any, name: str) -> dict[str, Any]:
    """User `name` as the list shows it, read after a change."""
    return user_out(rt.users.get(name), rt.users.last_login(name))


def user_out(u: User, last_login: float | None) -> dict[str, Any]:
    return {"id": u.id, "name": u.name, "workspaces": u.workspaces, "permissions": u.permissions,
            "revoked": u.revoked, "created": u.created, "last_login": last_login,
            "sso": u.sso_subject is not None, "sso_issuer": u.sso_issuer,
            "tokens": [{"id": t.id, "created": t.created, "revoked": t.revoked or u.revoked} for t in u.tokens]}


def invitation_out(inv: Invitation, now: float | None = None) -> dict[str, Any]:
    return {**msgspec.to_builtins(inv), "name": inv.name, "used_by": inv.used_by, "used_at": inv.used_at,
            "state": inv.state(time.time() if now is None else now)}


def _grants(wss: list[str], perms: list[str]) -> str:
    return f"workspaces {', '.join(wss)}; permissions {', '.join(perms) or 'none'}"


class PeopleController(Controller):
    path = "/api/people"
    opt = {"strict_query": True}  # handlers take `request` for the audit only: unknown parameters are 400s

    @staticmethod
    def _admin(request: Request, user: User, rt: Any) -> User:
        if not user.can("admin"):
            if request.method != "GET":
                rt.audit.record("admin", user=user.id, outcome="refused", detail="not an admin",
                                client=_client(request))
            raise PermissionDeniedException(ADMIN_ONLY)
        return user

    @staticmethod
    def _record(request: Request, rt: Any, admin: User, target: str, detail: str) -> None:
        rt.audit.record("admin", user=admin.id, target=target, detail=detail, client=_client(request))

    @staticmethod
    def _need(rt: Any, name: str) -> User:
        check_id(name, "user name")
        found = rt.users.get(name)
        if found is None:
            raise ClientException(f"no user named {name!r}", status_code=404)
        return found

    @staticmethod
    def _keeps_an_admin(rt: Any, admin: User, target: str, what: str) -> None:
        """409 when the admin would leave the server without an active admin (themselves)."""
        if target != admin.id:
            return
        if not any(u.id != admin.id and not u.revoked and u.can("admin") for u in rt.users.list()):
            raise ClientException(f"you are the only active admin: you cannot {what} yourself. Make another "
                                  "user an admin first (or use `datadesk users` on the server)", status_code=409)

    # -- users ---------------------------------------------------------------------------
    @get("/users")
    async def users(self, request: Request, user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        self._admin(request, user, rt)

        def read() -> list[dict[str, Any]]:
            return [user_out(u, rt.users.last_login(u.id)) for u in rt.users.list()]

        return {"users": await asyncio.to_thread(read), "workspaces": rt.workspaces.names(),
                "permissions": list(PERMISSION_NAMES), "me": user.id}

    @post("/users", status_code=201)
    async def add(self, request: Request, data: JSONBody[NewUser], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        try:
            made, token = rt.users.add(data.name, data.workspaces, data.permissions)
        except ValueError as exc:
            raise bad_input(exc) from None
        self._record(request, rt, admin, made.id, f"added {made.id}: {_grants(made.workspaces, made.permissions)}")
        return {"user": user_out(made, None), "token": token}

    @patch("/users/{name:str}")
    async def edit(self, request: Request, name: FromPath[str], data: JSONBody[UserEdit], user: CurrentUser,
                   rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        if data.workspaces is None and data.permissions is None:
            raise ClientException("nothing to change: send 'workspaces' and/or 'permissions'")
        before = self._need(rt, name)
        if data.permissions is not None and "admin" not in data.permissions and before.can("admin"):
            self._keeps_an_admin(rt, admin, name, "take the admin permission from")
        try:
            after = rt.users.update(name, workspaces=data.workspaces, permissions=data.permissions)
        except ValueError as exc:
            raise bad_input(exc) from None
        changes = [f"{what} {', '.join(old) or 'none'} -> {', '.join(new) or 'none'}"
                   for what, old, new in (("workspaces", before.workspaces, after.workspaces),
                                          ("permissions", before.permissions, after.permissions)) if old != new]
        self._record(request, rt, admin, name, f"changed {name}: " + ("; ".join(changes) or "nothing"))
        return {"user": user_out(after, rt.users.last_login(name))}

    @post("/users/{name:str}/revoke", status_code=200)
    async def revoke(self, request: Request, name: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        self._need(rt, name)
        self._keeps_an_admin(rt, admin, name, "revoke")
        rt.users.revoke(name)
        self._record(request, rt, admin, name, f"revoked {name}: all tokens and sessions stopped working")
        return {"user": _user_now(rt, name)}

    @post("/users/{name:str}/restore", status_code=200)
    async def restore(self, request: Request, name: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        self._need(rt, name)
        rt.users.restore(name)
        self._record(request, rt, admin, name, f"restored {name} (old tokens stay revoked)")
        return {"user": _user_now(rt, name)}

    @post("/users/{name:str}/tokens", status_code=201)
    async def new_token(self, request: Request, name: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        if self._need(rt, name).revoked:
            raise ClientException(f"{name} is revoked: restore them first, then make a token", status_code=409)
        token = rt.users.new_token(name)
        after = rt.users.get(name)
        self._record(request, rt, admin, name, f"new token id {after.tokens[-1].id} for {name}")
        return {"user": user_out(after, rt.users.last_login(name)), "token": token}

    @delete("/users/{name:str}/tokens/{token_id:str}", status_code=200)
    async def revoke_token(self, request: Request, name: FromPath[str], token_id: FromPath[str], user: CurrentUser,
                           rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        self._need(rt, name)
        try:
            rt.users.revoke_token(name, token_id)
        except UserError as exc:
            raise ClientException(str(exc), status_code=404) from None
        self._record(request, rt, admin, name, f"revoked token id {token_id} of {name}")
        return {"user": _user_now(rt, name)}

    @post("/users/{name:str}/login-link", status_code=201)
    async def login_link(self, request: Request, name: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        if self._need(rt, name).revoked:
            raise ClientException(f"{name} is revoked: restore them first, then make a login link", status_code=409)
        ttl = rt.settings.auth.login_code_ttl_s
        code = rt.users.new_login_code(name, ttl)
        self._record(request, rt, admin, name, f"login link for {name}")
        return {"url": f"{_base(request, rt)}/login?code={code}", "expires_in_s": ttl}

    @delete("/users/{name:str}", status_code=200)
    async def remove(self, request: Request, name: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                     yes: FromQuery[bool] = False) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        self._need(rt, name)
        if not yes:
            raise ClientException(f"this deletes user {name} and ALL their threads, artifacts and memory; "
                                  "repeat with yes=true")
        self._keeps_an_admin(rt, admin, name, "delete")
        removed = await asyncio.to_thread(rt.users.delete, name)
        # as the CLI: the user's kernel slots go (their /data links the user's files); this
        # server's reaper then lets their kernels (and containers) go, their records gone
        kernels = len(await asyncio.to_thread(purge_user_slots, rt.settings.home, name))
        self._record(request, rt, admin, name, f"deleted {name}: {len(removed)} workspace folder(s), "
                                               f"{kernels} sandbox kernel(s)")
        return {"deleted": name, "folders": len(removed), "kernels": kernels}

    # -- invitations ---------------------------------------------------------------------------
    @get("/invitations")
    async def invitations(self, request: Request, user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        self._admin(request, user, rt)
        now = time.time()
        return {"invitations": [invitation_out(i, now) for i in await asyncio.to_thread(rt.users.invitations)],
                "ttl_s": rt.settings.auth.invitation_ttl_s}

    @post("/invitations", status_code=201)
    async def invite(self, request: Request, data: JSONBody[NewInvitation], user: CurrentUser,
                     rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        ttl = rt.settings.auth.invitation_ttl_s
        try:
            code, inv = rt.users.new_invitation(data.workspaces, data.permissions, ttl, admin.id, name=data.name)
        except ValueError as exc:
            raise bad_input(exc) from None
        hours = ttl / 3600
        self._record(request, rt, admin, inv.id, f"invited {inv.name or 'a new user'}: "
                                                 f"{_grants(inv.workspaces, inv.permissions)}; for {hours:g} h")
        return {"invitation": invitation_out(inv), "url": f"{_base(request, rt)}{join_url(code)}"}

    @delete("/invitations/{inv_id:str}", status_code=200)
    async def revoke_invitation(self, request: Request, inv_id: FromPath[str], user: CurrentUser,
                                rt: RuntimeDep) -> dict[str, Any]:
        admin = self._admin(request, user, rt)
        check_id(inv_id, "invitation")
        try:
            rt.users.revoke_invitation(inv_id)
        except UserError as exc:
            raise ClientException(str(exc), status_code=404) from None
        self._record(request, rt, admin, inv_id, f"revoked invitation {inv_id}")
        inv = next((i for i in rt.users.invitations() if i.id == inv_id), None)
        return {"invitation": invitation_out(inv) if inv else None}


def _client(request: Request) -> str:
    return request.app.state.login_failures.address(request.scope)


def _base(request: Request, rt: Any) -> str:
    """This app's external base URL: `server.public_url` when set, else the request's own."""
    public = (rt.settings.server.public_url or "").rstrip("/")
    return public or str(request.base_url).rstrip("/")


# the one entry api/app.py registers: the admin API and the join page
people_router = Router(path="/", route_handlers=[PeopleController, JoinController])
__all__ = ["people_router", "PeopleController", "JoinController"]
