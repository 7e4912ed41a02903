"""The memory panel: see, add, confirm, resolve, edit and delete (hard) one's own facts.

Every endpoint takes `?workspace=` (default: the user's first workspace). A
workspace the user is not a member of is a 404 (like one that does not
exist); without the workspace flag or the `memory` permission it is a 403
naming why. The user's own switch (`PUT /api/memory/settings`) does not lock
the panel: a user who turned memory off can still see and delete.

Deletes here are hard: the fact and its history go, the audit keeps only the
id, and its text is redacted from the user's thread summaries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, delete, get, post, put
from litestar.exceptions import PermissionDeniedException
from litestar.params import FromPath, FromQuery, JSONBody

from datadesk.api.guards.access import member_workspace
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.domain.ids import check_id
from datadesk.domain.users import User
from datadesk.domain.memory import STATUSES, Fact
from datadesk.memory.store import MemoryStore, memory_access


class NewFact(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    kind: str = "fact"
    importance: int = 3
    scope: str = "workspace"
    replaces: str | None = None  # from the panel this supersedes the named fact at once
    expires_at: float | None = None


class Resolution(msgspec.Struct, forbid_unknown_fields=True):
    keep: str  # "new" | "old" | "both"


class FactEdit(msgspec.Struct, forbid_unknown_fields=True):
    text: str


class MemorySwitch(msgspec.Struct, forbid_unknown_fields=True):
    enabled: bool


def _store(rt: RuntimeDep) -> MemoryStore:
    return rt.memory


def _workspace(rt: RuntimeDep, user: User, workspace: str | None) -> str:
    """The workspace of the request, checked: member (else 404), flag and permission (else 403)."""
    ws = member_workspace(user, workspace)
    cfg = rt.workspaces.config(ws)
    ok, why = memory_access(cfg.memory, user.permissions, ws)
    if not ok:
        raise PermissionDeniedException(why)
    return ws


def _fact_out(fact: Fact) -> dict[str, Any]:
    return msgspec.to_builtins(fact)


class MemoryController(Controller):
    path = "/api/memory"

    @get("/")
    async def list_memory(self, user: CurrentUser, rt: RuntimeDep,
                          workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """Facts grouped by status (a conflict also carries the text of the fact it contradicts),
        the user's switch and the limits."""
        ws = _workspace(rt, user, workspace)
        store = _store(rt)
        groups: dict[str, list[dict[str, Any]]] = {s: [] for s in STATUSES}
        facts = store.facts(ws, user.id)
        texts = {f.id: f.text for f in facts}
        for fact in sorted(facts, key=lambda f: f.updated, reverse=True):
            out = _fact_out(fact)
            if fact.status == "conflict" and fact.conflicts_with in texts:
                out["conflicts_with_text"] = texts[fact.conflicts_with]  # what the user chooses between
            groups[fact.status].append(out)
        s = store.settings
        return {"workspace": ws, "enabled": store.user_enabled(ws, user.id), "facts": groups,
                "limits": {"max_active": s.max_active, "max_chars": s.max_chars,
                           "max_total_chars": s.max_total_chars, "max_inactive": s.max_inactive}}

    @post("/", status_code=201)
    async def add_fact(self, data: JSONBody[NewFact], user: CurrentUser, rt: RuntimeDep,
                       workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """Add from the panel: any kind, active at once unless it contradicts an active fact."""
        ws = _workspace(rt, user, workspace)
        store = _store(rt)
        fact = store.remember(ws, user.id, data.text, kind=data.kind, importance=data.importance,
                              scope=data.scope, source="panel", replaces=data.replaces,
                              user_asked=True, expires_at=data.expires_at)
        return _fact_out(fact)

    @put("/settings", status_code=200)
    async def set_switch(self, data: JSONBody[MemorySwitch], user: CurrentUser, rt: RuntimeDep,
                         workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        ws = _workspace(rt, user, workspace)
        _store(rt).set_user_enabled(ws, user.id, data.enabled)
        return {"workspace": ws, "enabled": data.enabled}

    @post("/{fid:str}/confirm", status_code=200)
    async def confirm_fact(self, fid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                           workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        ws = _workspace(rt, user, workspace)
        return _fact_out(_store(rt).confirm(ws, user.id, check_id(fid, "fact")))

    @post("/{fid:str}/resolve", status_code=200)
    async def resolve_fact(self, fid: FromPath[str], data: JSONBody[Resolution], user: CurrentUser,
                           rt: RuntimeDep, workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        ws = _workspace(rt, user, workspace)
        return _fact_out(_store(rt).resolve(ws, user.id, check_id(fid, "fact"), data.keep))

    @post("/{fid:str}/edit", status_code=200)
    async def edit_fact(self, fid: FromPath[str], data: JSONBody[FactEdit], user: CurrentUser,
                        rt: RuntimeDep, workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        ws = _workspace(rt, user, workspace)
        return _fact_out(_store(rt).edit(ws, user.id, check_id(fid, "fact"), data.text))

    @delete("/{fid:str}", status_code=200)
    async def delete_fact(self, fid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                          workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """Hard delete of one fact (and its history), redacting it from summaries."""
        ws = _workspace(rt, user, workspace)
        store = _store(rt)
        removed = await asyncio.to_thread(store.delete, ws, user.id, check_id(fid, "fact"))
        return {"workspace": ws, "deleted": removed}

    @delete("/", status_code=200)
    async def delete_all(self, user: CurrentUser, rt: RuntimeDep,
                         workspace: FromQuery[str | None] = None) -> dict[str, Any]:
        """Hard delete of all of this user's memory in this workspace."""
        ws = _workspace(rt, user, workspace)
        store = _store(rt)
        removed = await asyncio.to_thread(store.delete_all, ws, user.id)
        return {"workspace": ws, "deleted": removed}
