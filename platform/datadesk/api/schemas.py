"""Request and response bodies (msgspec Structs; unknown fields are refused)."""

from __future__ import annotations

from typing import Any

import msgspec


class NewThread(msgspec.Struct, forbid_unknown_fields=True):
    title: str = msgspec.field(default="New chat")
    workspace: str | None = None
    project: str | None = None  # a label: project-scoped memory facts apply to this thread
    reuse_empty: bool = False  # return the user's empty untitled chat instead of making another


class NewMessage(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    # the turn always outlives its client (chat.finish_in_background); false: leaving cancels it
    background: bool | None = None
    edit_of: int | None = None  # the seq of the user's question this message replaces (a new branch)


class ThreadPatch(msgspec.Struct, forbid_unknown_fields=True):
    title: str


class Login(msgspec.Struct, forbid_unknown_fields=True):
    token: str | None = None
    code: str | None = None


class ThreadOut(msgspec.Struct):
    id: str
    workspace: str
    title: str
    created: float
    updated: float
    running: bool = False
    turn: str | None = None  # the running chat turn (GET .../events re-attaches to it)
    refreshed: dict[str, Any] | None = None  # the last refresh: {at, status, changes, trigger}


class ThreadDetail(msgspec.Struct):
    thread: ThreadOut
    records: list[dict[str, Any]]
    has_more: bool


class MeOut(msgspec.Struct):
    id: str
    name: str
    workspaces: list[str]
    permissions: list[str]
    model: dict[str, Any]
    sandbox: dict[str, Any] = msgspec.field(default_factory=dict)  # available, reason, can_execute_code
    csrf: str | None = None  # X-CSRF-Token for state-changing requests (cookie sessions only)
