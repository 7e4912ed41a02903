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
    # single sign-on: the provider (`iss`) and its subject (`sub`) this name is bound to, once
    # the user has signed in with it (`Users.sync_sso`); None for a user who never has
    sso_issuer: str | None = None
    sso_subject: str | None = None

    @property
    def permission_set(self) -> frozenset[str]:
        return frozenset(self.permissions)

    def can(self, permission: str) -> bool:
        return permission in self.permissions


class Invitation(msgspec.Struct, omit_defaults=True):
    """A one-time, expiring invitation to join with these grants (`Users.new_invitation`); its
    secret code is never kept, only its hash (beside it, in the store)."""

    id: str
    workspaces: list[str]
    permissions: list[str] = msgspec.field(default_factory=list)
    created: float = 0.0
    expires: float = 0.0
    created_by: str = ""
    name: str | None = None  # the user name it is for, or None: the invitee picks one
    used_by: str | None = None
    used_at: float | None = None
    revoked: bool = False

    def state(self, now: float) -> str:
        """One of "open", "used", "revoked", "expired" (a used one stays "used" when revoked)."""
        if self.used_by is not None:
            return "used"
        if self.revoked:
            return "revoked"
        return "expired" if self.expires <= now else "open"
