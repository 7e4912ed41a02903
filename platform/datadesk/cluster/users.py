"""`PgUserStore`: the cluster `store.interfaces.users.Users`, on tables `users`, `user_tokens`,
`login_codes`, `sessions` and `user_logins` (migration 0002_users.sql) and `invitations`, with
the users' single sign-on binding (0009_people.sql).

No cache: every read is a query, so a user revoked or a session ended via one host is refused
by every other host at the next request. The hot reads (`by_token`, `by_session`) are one
SELECT each, the user's tokens folded in as JSON. Times come from the database clock
(`now()`), so hosts with skewed clocks agree on what has expired.

Login codes are consumed by `DELETE ... RETURNING`: of two hosts redeeming one code at once,
the second's DELETE waits on the first's row lock and then finds no row, so exactly one wins.
An invitation's redeem locks its row (`SELECT ... FOR UPDATE`) for the transaction that
creates the user and marks it used: the second redeem waits, then reads it used.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import msgspec

from datadesk.cluster.database import Database
from datadesk.domain.ids import new_id
from datadesk.domain.users import Invitation, User
from datadesk.store.interfaces.users import (UserError, checked_grants, checked_new_user, invitation_problem,
                                             invitee_name, new_api_token, new_invitation_code, new_login_code_value,
                                             new_session_id, no_user, secret_hash, sso_mismatch)

log = logging.getLogger(__name__)

# A user row with its tokens (oldest first) as JSON: `SELECT {USER_COLUMNS} FROM users u ...`.
USER_COLUMNS = """u.id, u.name, u.workspaces, u.permissions, extract(epoch FROM u.created_at)::float8 AS created,
    u.revoked, u.sso_issuer, u.sso_subject, coalesce((SELECT json_agg(json_build_object('id', k.id, 'hash', k.hash,
        'created', extract(epoch FROM k.created_at)::float8, 'revoked', k.revoked) ORDER BY k.seq)
        FROM user_tokens k WHERE k.user_id = u.id), '[]'::json) AS tokens"""

INVITATION_COLUMNS = """id, workspaces, permissions, extract(epoch FROM created_at)::float8 AS created,
    extract(epoch FROM expires_at)::float8 AS expires, created_by, name, used_by,
    extract(epoch FROM used_at)::float8 AS used_at, revoked"""

# What `delete` also removes: the user's data in the other stores (threads, artifacts, memory),
# given by the composition root; returns the places removed.
Purge = Callable[[str], Iterable[str]]


def _user(row: dict[str, Any] | None) -> User | None:
    return None if row is None else msgspec.convert(row, User)


def _invitation(row: dict[str, Any]) -> Invitation:
    return msgspec.convert({k: v for k, v in row.items() if k != "now"}, Invitation)


class PgUserStore:
    """Users, tokens, login codes and sessions in PostgreSQL (the cluster `Users`)."""

    def __init__(self, db: Database, purge: Purge | None = None) -> None:
        self.db = db
        self.purge = purge

    def _one(self, sql: str, params: tuple | dict = ()) -> dict[str, Any] | None:
        with self.db.autocommit() as conn:  # one statement: its own transaction
            return conn.execute(sql, params).fetchone()

    # -- users ---------------------------------------------------------------------
    def list(self) -> list[User]:
        with self.db.connection() as conn:
            rows = conn.execute(f"SELECT {USER_COLUMNS} FROM users u ORDER BY u.seq").fetchall()
        return [msgspec.convert(r, User) for r in rows]

    def get(self, uid: str) -> User | None:
        if not isinstance(uid, str) or not uid:
            return None
        return _user(self._one(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s", (uid,)))

    def add(self, name: str, workspaces: list[str], permissions: list[str] = ()) -> tuple[User, str]:
        """Create a user and return it with its first API token (shown once)."""
        wss, perms = checked_new_user(name, workspaces, permissions)
        token = new_api_token(name)
        with self.db.connection() as conn:
            made = conn.execute(
                "INSERT INTO users (id, name, workspaces, permissions) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING RETURNING id", (name, name, wss, perms)).fetchone()
            if made is None:
                raise UserError(f"user {name!r} already exists")
            conn.execute("INSERT INTO user_tokens (id, user_id, hash) VALUES (%s, %s, %s)",
                         (new_id("k"), name, secret_hash(token)))
            row = conn.execute(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s", (name,)).fetchone()
        return msgspec.convert(row, User), token

    def new_token(self, uid: str) -> str:
        token = new_api_token(uid)
        made = self._one("INSERT INTO user_tokens (id, user_id, hash) SELECT %s, id, %s FROM users"
                         " WHERE id = %s RETURNING id", (new_id("k"), secret_hash(token), uid))
        if made is None:
            raise no_user(uid)
        return token

    def revoke(self, uid: str) -> None:
        """Revoke a user: every token, login code and session stops working at once (one
        statement: no host sees the user revoked with a session still live)."""
        hit = self._one(
            "WITH u AS (UPDATE users SET revoked = true WHERE id = %(u)s RETURNING id),"
            " k AS (UPDATE user_tokens SET revoked = true WHERE user_id = %(u)s),"
            " c AS (DELETE FROM login_codes WHERE user_id = %(u)s),"
            " s AS (DELETE FROM sessions WHERE user_id = %(u)s)"
            " SELECT id FROM u", {"u": uid})
        if hit is None:
            raise no_user(uid)

    def delete(self, uid: str) -> list[str]:
        """Remove a user; its tokens, codes, sessions and login go with it (ON DELETE CASCADE),
        then `purge` removes its data in the other stores. Returns what `purge` removed."""
        if self._one("DELETE FROM users WHERE id = %s RETURNING id", (uid,)) is None:
            raise no_user(uid)
        return list(self.purge(uid)) if self.purge is not None else []

    def update(self, uid: str, *, workspaces: list[str] | None = None,
               permissions: list[str] | None = None) -> User:
        with self.db.connection() as conn:
            row = conn.execute("SELECT workspaces, permissions FROM users WHERE id = %s FOR UPDATE", (uid,)).fetchone()
            if row is None:
                raise no_user(uid)
            wss, perms = checked_grants(row["workspaces"] if workspaces is None else workspaces,
                                        row["permissions"] if permissions is None else permissions)
            conn.execute("UPDATE users SET workspaces = %s, permissions = %s WHERE id = %s", (wss, perms, uid))
            return msgspec.convert(conn.execute(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s",
                                                (uid,)).fetchone(), User)

    def restore(self, uid: str) -> None:
        if self._one("UPDATE users SET revoked = false WHERE id = %s RETURNING id", (uid,)) is None:
            raise no_user(uid)

    def revoke_token(self, uid: str, token_id: str) -> None:
        hit = self._one("UPDATE user_tokens SET revoked = true WHERE id = %s AND user_id = %s RETURNING id",
                        (token_id, uid))
        if hit is None:
            if self.get(uid) is None:
                raise no_user(uid)
            raise UserError(f"user {uid!r} has no token {token_id!r}")

    def sync_sso(self, name: str, workspaces: list[str], permissions: list[str], *,
                 issuer: str, subject: str) -> User:
        """Create, or bind and update, a user at a single sign-on; the user's row lock orders
        two first sign-ins at once (the second finds the first's user and its binding)."""
        wss, perms = checked_new_user(name, workspaces, permissions)
        fields = {"u": name, "w": wss, "p": perms, "i": issuer, "s": subject}
        with self.db.connection() as conn:
            made = conn.execute(
                "INSERT INTO users (id, name, workspaces, permissions, sso_issuer, sso_subject)"
                " VALUES (%(u)s, %(u)s, %(w)s, %(p)s, %(i)s, %(s)s) ON CONFLICT DO NOTHING RETURNING id",
                fields).fetchone()
            if made is None:
                if conn.execute("SELECT id FROM users WHERE id = %s FOR UPDATE", (name,)).fetchone() is None:
                    raise UserError(f"user {name!r} was deleted during this sign-in; sign in again")
                user = msgspec.convert(conn.execute(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s",
                                                    (name,)).fetchone(), User)
                refusal = sso_mismatch(user, issuer, subject)
                if refusal is not None:
                    raise refusal
                if user.revoked:
                    return user
                conn.execute("UPDATE users SET workspaces = %(w)s, permissions = %(p)s, sso_issuer = %(i)s,"
                             " sso_subject = %(s)s WHERE id = %(u)s", fields)
            return msgspec.convert(conn.execute(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s",
                                                (name,)).fetchone(), User)

    def last_login(self, uid: str) -> float | None:
        row = self._one("SELECT extract(epoch FROM last_at)::float8 AS t FROM user_logins WHERE user_id = %s", (uid,))
        return None if row is None else row["t"]

    # -- invitations -------------------------------------------------------------------
    def new_invitation(self, workspaces: list[str], permissions: list[str], ttl_s: float,
                       created_by: str, name: str | None = None) -> tuple[str, Invitation]:
        wss, perms = checked_new_user(name, workspaces, permissions) if name is not None \
            else checked_grants(workspaces, permissions)
        code = new_invitation_code()
        row = self._one(
            "INSERT INTO invitations (id, hash, workspaces, permissions, name, created_by, expires_at)"
            " SELECT %(id)s, %(h)s, %(w)s, %(p)s, %(n)s, %(by)s, now() + make_interval(secs => %(ttl)s)"
            " WHERE %(n)s::text IS NULL OR NOT EXISTS (SELECT 1 FROM users WHERE id = %(n)s)"
            f" RETURNING {INVITATION_COLUMNS}",
            {"id": new_id("inv_"), "h": secret_hash(code), "w": wss, "p": perms, "n": name, "by": created_by,
             "ttl": float(ttl_s)})
        if row is None:
            raise UserError(f"user {name!r} already exists")
        return code, _invitation(row)

    def invitations(self) -> list[Invitation]:
        with self.db.connection() as conn:
            rows = conn.execute(f"SELECT {INVITATION_COLUMNS} FROM invitations ORDER BY seq DESC").fetchall()
        return [_invitation(r) for r in rows]

    def peek_invitation(self, code: str) -> Invitation | None:
        if not code or not isinstance(code, str):
            return None
        row = self._one(f"SELECT {INVITATION_COLUMNS} FROM invitations WHERE hash = %s", (secret_hash(code),))
        return None if row is None else _invitation(row)

    def revoke_invitation(self, inv_id: str) -> None:
        if self._one("UPDATE invitations SET revoked = true WHERE id = %s RETURNING id", (inv_id,)) is None:
            raise UserError(f"no invitation {inv_id!r}")

    def redeem_invitation(self, code: str, name: str | None) -> User:
        digest = secret_hash(code) if code and isinstance(code, str) else ""
        with self.db.connection() as conn:
            row = conn.execute(f"SELECT {INVITATION_COLUMNS}, extract(epoch FROM now())::float8 AS now"
                               " FROM invitations WHERE hash = %s FOR UPDATE", (digest,)).fetchone()
            inv = None if row is None else _invitation(row)
            refusal = invitation_problem(inv, row["now"] if row else 0.0)
            if refusal is not None:
                raise refusal
            uid = invitee_name(inv, name)
            made = conn.execute("INSERT INTO users (id, name, workspaces, permissions) VALUES (%s, %s, %s, %s)"
                                " ON CONFLICT DO NOTHING RETURNING id",
                                (uid, uid, inv.workspaces, inv.permissions)).fetchone()
            if made is None:
                raise UserError(f"the user name {uid!r} is taken; choose another")
            conn.execute("UPDATE invitations SET used_by = %s, used_at = now() WHERE id = %s", (uid, inv.id))
            return msgspec.convert(conn.execute(f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = %s",
                                                (uid,)).fetchone(), User)

    # -- authentication --------------------------------------------------------------
    def by_token(self, token: str) -> User | None:
        """The active user owning API token `token`, else None."""
        if not token or not isinstance(token, str):
            return None
        return _user(self._one(
            f"SELECT {USER_COLUMNS} FROM user_tokens t JOIN users u ON u.id = t.user_id"
            " WHERE t.hash = %s AND NOT t.revoked AND NOT u.revoked", (secret_hash(token),)))

    def new_login_code(self, uid: str, ttl_s: float) -> str:
        """A one-time code for the login URL; the user's earlier codes stop working."""
        code = new_login_code_value(uid)
        with self.db.connection() as conn:
            # the user's row lock orders two hosts making codes at once: the second one's
            # DELETE (a later statement, a newer snapshot) then sees and voids the first's code
            if conn.execute("SELECT id FROM users WHERE id = %s FOR UPDATE", (uid,)).fetchone() is None:
                raise no_user(uid)
            conn.execute(
                "WITH gone AS (DELETE FROM login_codes WHERE user_id = %(u)s OR expires_at <= now())"
                " INSERT INTO login_codes (hash, user_id, expires_at)"
                " VALUES (%(h)s, %(u)s, now() + make_interval(secs => %(ttl)s))",
                {"u": uid, "h": secret_hash(code), "ttl": float(ttl_s)})
        return code

    def peek_login_code(self, code: str) -> User | None:
        """The active user a valid login code is for, without consuming it."""
        if not code or not isinstance(code, str):
            return None
        return _user(self._one(
            f"SELECT {USER_COLUMNS} FROM login_codes c JOIN users u ON u.id = c.user_id"
            " WHERE c.hash = %s AND c.expires_at > now() AND NOT u.revoked", (secret_hash(code),)))

    def redeem_login_code(self, code: str) -> User | None:
        """Consume a login code; its active user, or None if unknown/expired/used."""
        if not code or not isinstance(code, str):
            return None
        return _user(self._one(
            "WITH hit AS (DELETE FROM login_codes WHERE hash = %s RETURNING user_id, expires_at)"
            f" SELECT {USER_COLUMNS} FROM hit JOIN users u ON u.id = hit.user_id"
            " WHERE hit.expires_at > now() AND NOT u.revoked", (secret_hash(code),)))

    def record_login(self, uid: str) -> None:
        self._one("INSERT INTO user_logins (user_id, last_at) SELECT id, now() FROM users WHERE id = %s"
                  " ON CONFLICT (user_id) DO UPDATE SET last_at = EXCLUDED.last_at RETURNING user_id", (uid,))

    def has_logged_in(self, uid: str) -> bool:
        return self._one("SELECT 1 AS x FROM user_logins WHERE user_id = %s", (uid,)) is not None

    # -- sessions ------------------------------------------------------------------------
    def new_session(self, uid: str, ttl_s: float) -> str:
        """A session id for `uid`; expired sessions are swept in the same statement. Like the
        embedded store, an unknown user gets an id that authenticates no one."""
        sid = new_session_id()
        self._one(
            "WITH swept AS (DELETE FROM sessions WHERE expires_at <= now())"
            " INSERT INTO sessions (hash, user_id, expires_at)"
            " SELECT %(h)s, id, now() + make_interval(secs => %(ttl)s) FROM users WHERE id = %(u)s"
            " RETURNING user_id", {"h": secret_hash(sid), "u": uid, "ttl": float(ttl_s)})
        return sid

    def by_session(self, sid: str) -> User | None:
        if not sid or not isinstance(sid, str):
            return None
        return _user(self._one(
            f"SELECT {USER_COLUMNS} FROM sessions s JOIN users u ON u.id = s.user_id"
            " WHERE s.hash = %s AND s.expires_at > now() AND NOT u.revoked", (secret_hash(sid),)))

    def end_session(self, sid: str) -> None:
        if sid and isinstance(sid, str):
            self._one("DELETE FROM sessions WHERE hash = %s RETURNING hash", (secret_hash(sid),))

    # -- migration from a file home (`datadesk migrate`) ----------------------------------
    def import_user(self, user: User, last_login: float | None = None) -> None:
        """Copy one user as it is: its tokens keep their ids and hashes (the clear values are
        not known, nor needed), revocation and times kept. Idempotent: a second run updates."""
        with self.db.connection() as conn:
            conn.execute(
                "INSERT INTO users (id, name, workspaces, permissions, created_at, revoked, sso_issuer, sso_subject)"
                " VALUES (%s, %s, %s, %s, to_timestamp(%s), %s, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                " workspaces = EXCLUDED.workspaces, permissions = EXCLUDED.permissions, revoked = EXCLUDED.revoked,"
                " sso_issuer = EXCLUDED.sso_issuer, sso_subject = EXCLUDED.sso_subject",
                (user.id, user.name, user.workspaces, user.permissions, user.created, user.revoked,
                 user.sso_issuer, user.sso_subject))
            for tok in user.tokens:
                conn.execute(
                    "INSERT INTO user_tokens (id, user_id, hash, created_at, revoked)"
                    " VALUES (%s, %s, %s, to_timestamp(%s), %s) ON CONFLICT (id) DO UPDATE SET revoked = EXCLUDED.revoked",
                    (tok.id, user.id, tok.hash, tok.created, tok.revoked or user.revoked))
            if last_login is not None:
                conn.execute("INSERT INTO user_logins (user_id, last_at) VALUES (%s, to_timestamp(%s))"
                             " ON CONFLICT (user_id) DO UPDATE SET last_at = EXCLUDED.last_at", (user.id, last_login))

    def import_invitation(self, inv: Any) -> bool:
        """Copy one invitation (a `store.users.StoredInvitation`: its code's hash, grants, times,
        whether it was used or revoked) as it is; False when it was there already. Idempotent."""
        row = self._one(
            "INSERT INTO invitations (id, hash, workspaces, permissions, name, created_by, created_at, expires_at,"
            " used_by, used_at, revoked) VALUES (%(id)s, %(hash)s, %(ws)s, %(perms)s, %(name)s, %(by)s,"
            " to_timestamp(%(created)s), to_timestamp(%(expires)s), %(used_by)s, to_timestamp(%(used_at)s),"
            " %(revoked)s) ON CONFLICT (id) DO NOTHING RETURNING id",
            {"id": inv.id, "hash": inv.hash, "ws": inv.workspaces, "perms": inv.permissions, "name": inv.name,
             "by": inv.created_by, "created": inv.created, "expires": inv.expires, "used_by": inv.used_by,
             "used_at": inv.used_at, "revoked": inv.revoked})
        return row is not None

    def import_session(self, digest: str, uid: str, created: float, expires: float) -> bool:
        """Copy one session by its stored hash; False (nothing copied) when its user is unknown
        or it has expired. Idempotent."""
        row = self._one(
            "INSERT INTO sessions (hash, user_id, created_at, expires_at)"
            " SELECT %(h)s, id, to_timestamp(%(c)s), to_timestamp(%(e)s) FROM users"
            " WHERE id = %(u)s AND to_timestamp(%(e)s) > now()"
            " ON CONFLICT (hash) DO UPDATE SET expires_at = EXCLUDED.expires_at RETURNING hash",
            {"h": digest, "u": uid, "c": created, "e": expires})
        return row is not None


def build_users(db: Database, purge: Purge | None = None) -> PgUserStore:
    """The cluster user store on `db` (schema from migration 0002_users.sql); `purge(uid)`
    removes a deleted user's data in the other stores and returns the places removed."""
    return PgUserStore(db, purge)
