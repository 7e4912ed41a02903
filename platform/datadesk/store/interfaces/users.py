"""`Users`: who may sign in and how (users, API tokens, one-time login codes, sessions).

The app, the API and the CLI type against `Users`; two sets implement it:
`store.users.UserStore` (embedded: `users.json` and `sessions.json` under file locks) and
`cluster.users.PgUserStore` (tables `users`, `user_tokens`, `login_codes`, `sessions`, `invitations`,
`user_logins`). Both keep the same rules:

- a user's name is its id, unique; it has at least one workspace and only known permissions;
- secrets are never stored in clear: API tokens, login codes and session ids are random
  256-bit values kept only as SHA-256 hashes (a slow hash buys nothing at that entropy);
- a revoked user's tokens, codes and sessions stop working at once;
- a login code is one-time and expires; a user's new code voids their earlier ones;
- an expired session is refused, and swept when sessions are written;
- an invitation is one-time and expires; of two redeems of one code at once exactly one
  creates its user; a revoked user can be restored (its old tokens stay revoked);
- single sign-on binds a name to one (issuer, subject) pair at its first SSO sign-in; another
  subject arriving with that name is refused (no takeover by a reused username).

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
from datadesk.domain.users import PERMISSION_NAMES, Invitation, User


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
    return checked_grants(workspaces, permissions)


def checked_grants(workspaces: Iterable[str], permissions: Iterable[str]) -> tuple[list[str], list[str]]:
    """Validate grants alone (an edit, an invitation, an SSO sign-in): (workspaces, permissions)."""
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


def new_invitation_code() -> str:
    """An invitation's secret: `ddi_<secret>` (names no one: the invitee may pick the name)."""
    return f"ddi_{secrets.token_urlsafe(32)}"


def invitation_problem(inv: Invitation | None, now: float) -> UserError | None:
    """Why `inv` cannot be redeemed now (the message the join page shows), or None if it can."""
    if inv is None:
        return UserError("this invitation link is not valid (mistyped or cut short?)")
    state = inv.state(now)
    if state == "used":
        return UserError("this invitation has already been used")
    if state == "revoked":
        return UserError("this invitation was revoked by an admin")
    if state == "expired":
        return UserError("this invitation has expired; ask an admin for a new one")
    return None


def invitee_name(inv: Invitation, name: str | None) -> str:
    """The user name an invitation's redeem creates: its fixed name, else the one chosen."""
    if inv.name is not None:
        if name and name != inv.name:
            raise UserError(f"this invitation is for the user name {inv.name!r}")
        return inv.name
    if not name:
        raise UserError("choose a user name")
    check_id(name, "user name")
    return name


def sso_mismatch(user: User, issuer: str, subject: str) -> UserError | None:
    """The refusal when `user` is bound to another SSO identity than (issuer, subject)."""
    if user.sso_subject is None or (user.sso_issuer, user.sso_subject) == (issuer, subject):
        return None
    return UserError(f"the user name {user.id!r} belongs to another single sign-on account")


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

    def update(self, uid: str, *, workspaces: list[str] | None = None,
               permissions: list[str] | None = None) -> User:
        """Replace a user's workspaces and/or permissions (None: kept); returns the user.
        `UserError` for an unknown user, no workspace or an unknown permission."""
        ...

    def restore(self, uid: str) -> None:
        """Un-revoke a user (an admin's "re-enable"); its old tokens stay revoked. `UserError`
        for an unknown user."""
        ...

    def revoke_token(self, uid: str, token_id: str) -> None:
        """Revoke one API token of `uid` by its id. `UserError` for an unknown user or token."""
        ...

    def sync_sso(self, name: str, workspaces: list[str], permissions: list[str], *,
                 issuer: str, subject: str) -> User:
        """A single sign-on: the first one creates the user (no API token) or binds a
        pre-created, never bound one; every one replaces its workspaces and permissions. A name
        bound to another (issuer, subject) raises `UserError`; a revoked user is returned
        unchanged (the caller refuses it). `UserError` for no workspace or unknown permission."""
        ...

    def last_login(self, uid: str) -> float | None:
        """The time of `uid`'s last `record_login`, or None."""
        ...

    # -- invitations -------------------------------------------------------------------
    def new_invitation(self, workspaces: list[str], permissions: list[str], ttl_s: float,
                       created_by: str, name: str | None = None) -> tuple[str, Invitation]:
        """A one-time invitation valid `ttl_s` seconds: (its secret code, shown once; the
        invitation). `name` fixes the user name it creates. `UserError` for bad grants or a
        name already taken."""
        ...

    def invitations(self) -> list[Invitation]:
        """Every invitation, open, used, revoked and expired, newest first."""
        ...

    def peek_invitation(self, code: str) -> Invitation | None:
        """The invitation of `code` in whatever state (the join page), or None if unknown."""
        ...

    def revoke_invitation(self, inv_id: str) -> None:
        """Void an invitation by id. `UserError` for an unknown id."""
        ...

    def redeem_invitation(self, code: str, name: str | None) -> User:
        """Consume an invitation and create its user (`name`, or its fixed name) with its
        grants, no API token. Of two redeems at once exactly one wins; unknown, used, revoked
        or expired codes and taken names raise `UserError` (a taken name leaves it open)."""
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
