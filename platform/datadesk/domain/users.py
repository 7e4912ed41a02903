"""Users, their permissions and workspace membership."""

from __future__ import annotations

import msgspec

PERMISSION_NAMES = ("code_execution", "memory", "admin")


class TokenEntry(msgspec.Struct, omit_defaults=True):
    """A long-lived API token, stored only as its SHA-256 hash."""

    id: str
    hash: str
    created: float
    revoked: bool = False


class User(msgspec.Struct, omit_defaults=True):
    id: str
    name: str
    workspaces: list[str]
    permissions: list[str] = msgspec.field(default_factory=list)
    created: float = 0.0
    revoked: bool = False
    tokens: list[TokenEntry] = msgspec.field(default_factory=list)

    @property
    def permission_set(self) -> frozenset[str]:
        return frozenset(self.permissions)

    def can(self, permission: str) -> bool:
        return permission in self.permissions
