"""Identifier validation: every id is checked before it touches a path."""

from __future__ import annotations

import re
import secrets

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class InvalidId(ValueError):
    """An id (thread, user, workspace, artifact, call) that is not `[A-Za-z0-9_-]{1,64}`."""

    def __init__(self, kind: str, value: object) -> None:
        shown = repr(value)[:80]
        super().__init__(f"invalid {kind} id {shown}: ids must match [A-Za-z0-9_-]{{1,64}}")
        self.kind = kind


def check_id(value: object, kind: str = "resource") -> str:
    """Return `value` if it is a valid id, else raise `InvalidId` naming the kind."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidId(kind, value)
    return value


def new_id(prefix: str = "") -> str:
    """A fresh random id (URL-safe, valid under ID_PATTERN)."""
    return f"{prefix}{secrets.token_hex(8)}"
