"""`Users`: who may sign in and how (users, API tokens, one-time login codes, sessions).

The app, the API and the CLI type against `Users`; two sets implement it:
`store.users.UserStore` (embedded: `users.json` and `sessions.json` under file locks) and
`cluster.users.PgUserStore` (tables `users`, `user_tokens`, `login_codes`, `sessions`,
`user_logins`). Both keep the same rules:

- a user's name is its id, unique; it has at least one workspace and only known permissions;
- secrets are never stored in clear: API tokens, login codes and session ids are random
  256-bit values kept only as SHA-256 hashes (a slow hash buys nothing at that entropy);
- a revoked user's tokens, codes and sessions stop working at once;
- a login code is one-time and expires; a user's new code voids their earlier ones;
- an expired session is refused, and swept when sessions are written.

Errors: `UserError` (a `ValueError`) for a bad operation: unknown user, duplicate name,
unknown permission, no workspace, a malformed name (the id check's own `ValueError`).

The pure helpers below (formats, hashing, validation) are shared by both sets, so a token made
by one is checked by the other and a migrated home keeps working.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Iterable, Protocol, runtime_checkable

from datadesk.domain.ids import ID_PATTERN, check_id
from datadesk.domain.users import PERMISSION_NAMES, User


class UserError(ValueError):
    """A bad user operation (unknown user, duplicate name, unknown permission)."""


def new_api_token(uid: str) -> str:
    """An API token: `ddt_<user>.<secret>`; the user part only names whose it is (for the
    per-account login limit), the secret alone is what is checked."""
    return f"ddt_{uid}.{secrets.token_urlsafe(32)}"


def new_login_code_value(uid: str) -> str:
    """A login code: `<user>.<secret>` (the user part, as for tokens, is never trusted)."""
    return f"{uid}.{secrets.token_urlsafe(32)}"


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def credential_account(credential: str) -> str | None:
    """The account a token (`ddt_<user>.<secret>`) or login code (`<user>.<secret>`) names,
    or None (an older credential without the user part, or not one of ours)."""
    body = credential[4:] if credential.startswith("ddt_") else credential
    uid, dot, rest = body.partition(".")
    return uid if dot and rest and ID_PATTERN.fullmatch(uid) else None


def secret_hash(secret: str) -> str:
    """The stored form of a token, code or session id (hex SHA-256)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def checked_new_user(name: str, workspaces: Iterable[str],
                     permissions: Iterable[str]) -> tuple[list[str], list[str]]:
    """Validate a new user; returns (workspaces deduplicated in order, permissions sorted)."""
    check_id(name, "user name")
    wss = list(dict.fromkeys(workspaces))
    for ws in wss:
        check_id(ws, "workspace")
    if not wss:
        raise UserError("a user needs at least one workspace")
    perms = set(permissions)
    unknown = perms - set(PERMISSION_NAMES)
    if unknown:
        raise UserError(f"unknown permission(s) {sorted(unknown)}; known: {list(PERMISSION_NAMES)}")
    return wss, sorted(perms)


def no_user(uid: str) -> UserError:
    return UserError(f"no user named {uid!r}")


@runtime_checkable
class Users(Protocol):
    """Users, their API tokens, one-time login codes and login sessions."""

    # -- users -------------------------------------------------------------------
    def list(self) -> list[User]:
        """Every user, revoked ones included, oldest first."""
        ...

    def get(self, uid: str) -> User | None:
        """The user named `uid` (revoked or not), else None."""
        ...

    def add(self, name: str, workspaces: list[str], permissions: list[str] = ()) -> tuple[User, str]:
        """Create a user; returns it with its first API token (shown once). `UserError` for a
        duplicate name, no workspace or an unknown permission; `ValueError` for a bad name."""
        ...

    def new_token(self, uid: str) -> str:
        """Another API token for `uid` (shown once). `UserError` for an unknown user."""
        ...

    def revoke(self, uid: str) -> None:
        """Revoke a user: every token, login code and session stops working at once."""
        ...

    def delete(self, uid: str) -> list[str]:
        """Remove a user with its tokens, codes and sessions, and what it owns; returns the
        places of the user's data removed. `UserError` for an unknown user."""
        ...

    # -- authentication ------------------------------------------------------------
    def by_token(self, token: str) -> User | None:
        """The active user owning API token `token`, else None (revoked, unknown, empty)."""
        ...

    def new_login_code(self, uid: str, ttl_s: float) -> str:
        """A one-time code for the login URL, valid `ttl_s` seconds; the user's earlier codes stop
        working. `UserError` for an unknown user."""
        ...

    def peek_login_code(self, code: str) -> User | None:
        """The active user a valid code is for, without consuming it (the confirm page)."""
        ...

    def redeem_login_code(self, code: str) -> User | None:
        """Consume a code; its active user, or None if unknown, expired or used. Of two hosts
        redeeming one code at once, exactly one gets the user."""
        ...

    def record_login(self, uid: str) -> None:
        """Note that `uid` logged in (the startup login URL is printed only until an admin has)."""
        ...

    def has_logged_in(self, uid: str) -> bool:
        ...

    # -- sessions ----------------------------------------------------------------------
    def new_session(self, uid: str, ttl_s: float) -> str:
        """A new session id for `uid`, valid `ttl_s` seconds (expired sessions are swept)."""
        ...

    def by_session(self, sid: str) -> User | None:
        """The active user of an unexpired session, else None."""
        ...

    def end_session(self, sid: str) -> None:
        """Forget session `sid` (log out); unknown ids are ignored."""
        ...
