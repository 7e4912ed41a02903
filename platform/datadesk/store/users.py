"""`users.json` (users, hashed tokens, permissions) and `sessions.json` (login sessions): the
embedded `store.interfaces.users.Users`.

Secrets are never stored in clear: API tokens, one-time login codes and session ids are random
256-bit values kept only as SHA-256 hashes (a slow password hash buys nothing for values with
that much entropy). Writes are atomic renames under a cross-process file lock, so the CLI can
add or revoke users while the server runs; the server notices by the file's mtime.
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Callable

import msgspec
from filelock import FileLock

from datadesk.domain.ids import new_id
from datadesk.domain.users import Invitation, TokenEntry, User
from datadesk.store.interfaces.users import (UserError, checked_grants, checked_new_user, credential_account,
                                             invitation_problem, invitee_name, new_api_token, new_invitation_code,
                                             new_login_code_value, new_session_id, no_user, secret_hash,
                                             sso_mismatch)
from datadesk.store.files import read_json, write_json
from datadesk.store.layout import Layout

__all__ = ["UserError", "UserStore", "credential_account"]

_new_token = new_api_token
_hash = secret_hash


class LoginCode(msgspec.Struct):
    hash: str
    user: str
    expires: float


class Session(msgspec.Struct):
    user: str
    created: float
    expires: float


class StoredInvitation(Invitation, omit_defaults=True):
    """An invitation as `users.json` keeps it: with its code's hash."""

    hash: str = ""

    def public(self) -> Invitation:
        fields = msgspec.structs.asdict(self)
        fields.pop("hash")
        return Invitation(**fields)


class UsersDoc(msgspec.Struct, omit_defaults=True):
    version: int = 1
    users: dict[str, User] = msgspec.field(default_factory=dict)
    login_codes: list[LoginCode] = msgspec.field(default_factory=list)
    logins: dict[str, float] = msgspec.field(default_factory=dict)  # user -> time of the last login
    invitations: list[StoredInvitation] = msgspec.field(default_factory=list)  # oldest first


class UserStore:
    """Reads and updates users, tokens, login codes and sessions (the embedded `Users`)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = FileLock(str(layout.users_file) + ".lock")
        self._slock = FileLock(str(layout.sessions_file) + ".lock")
        self._mem_lock = threading.Lock()
        self._cache: tuple[float, UsersDoc] | None = None

    # -- documents -----------------------------------------------------------
    def _load(self) -> UsersDoc:
        path = self.layout.users_file
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return UsersDoc()
        with self._mem_lock:
            if self._cache and self._cache[0] == mtime:
                return self._cache[1]
        doc = msgspec.convert(read_json(path, {}), UsersDoc)
        with self._mem_lock:
            self._cache = (mtime, doc)
        return doc

    def _update(self, change: Callable[[UsersDoc], object]) -> object:
        with self._lock:
            self._cache = None
            doc = msgspec.convert(read_json(self.layout.users_file, {}), UsersDoc)
            result = change(doc)
            write_json(self.layout.users_file, doc, mode=0o600)
            self._cache = None
            return result

    # -- users ---------------------------------------------------------------
    def list(self) -> list[User]:
        return list(self._load().users.values())

    def get(self, uid: str) -> User | None:
        return self._load().users.get(uid)

    def add(self, name: str, workspaces: list[str], permissions: list[str] = ()) -> tuple[User, str]:
        """Create a user and return it with its first API token (shown once)."""
        wss, perms = checked_new_user(name, workspaces, permissions)
        token = _new_token(name)

        def change(doc: UsersDoc) -> User:
            if name in doc.users:
                raise UserError(f"user {name!r} already exists")
            user = User(id=name, name=name, workspaces=wss, permissions=perms, created=time.time(),
                        tokens=[TokenEntry(id=new_id("k"), hash=_hash(token), created=time.time())])
            doc.users[name] = user
            return user

        return self._update(change), token  # type: ignore[return-value]

    def new_token(self, uid: str) -> str:
        token = _new_token(uid)

        def change(doc: UsersDoc) -> None:
            user = self._need(doc, uid)
            user.tokens.append(TokenEntry(id=new_id("k"), hash=_hash(token), created=time.time()))

        self._update(change)
        return token

    def revoke(self, uid: str) -> None:
        """Revoke a user: every token, login code and session stops working at once."""

        def change(doc: UsersDoc) -> None:
            user = self._need(doc, uid)
            user.revoked = True
            for tok in user.tokens:
                tok.revoked = True
            doc.login_codes = [c for c in doc.login_codes if c.user != uid]

        self._update(change)
        self._drop_sessions(lambda s: s.user == uid)

    def delete(self, uid: str) -> list[str]:
        """Remove a user and everything of theirs on disk (threads, artifacts, memory,
        summaries), in every workspace. Returns the directories removed."""
        import shutil

        def change(doc: UsersDoc) -> None:
            self._need(doc, uid)
            del doc.users[uid]
            doc.login_codes = [c for c in doc.login_codes if c.user != uid]

        self._update(change)
        self._drop_sessions(lambda s: s.user == uid)
        removed = []
        root = self.layout.workspaces_dir
        for wsdir in (root.iterdir() if root.is_dir() else ()):
            udir = wsdir / "users" / uid
            if udir.is_dir() and not udir.is_symlink():
                # renamed away first: a concurrent writer never sees half a user
                trash = udir.with_name(f".deleted-{uid}-{new_id()}")
                udir.rename(trash)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(str(udir))
        return removed

    def update(self, uid: str, *, workspaces: list[str] | None = None,
               permissions: list[str] | None = None) -> User:
        def change(doc: UsersDoc) -> User:
            user = self._need(doc, uid)
            wss, perms = checked_grants(user.workspaces if workspaces is None else workspaces,
                                        user.permissions if permissions is None else permissions)
            user.workspaces, user.permissions = wss, perms
            return user

        return self._update(change)  # type: ignore[return-value]

    def restore(self, uid: str) -> None:
        def change(doc: UsersDoc) -> None:
            self._need(doc, uid).revoked = False

        self._update(change)

    def revoke_token(self, uid: str, token_id: str) -> None:
        def change(doc: UsersDoc) -> None:
            tok = next((t for t in self._need(doc, uid).tokens if t.id == token_id), None)
            if tok is None:
                raise UserError(f"user {uid!r} has no token {token_id!r}")
            tok.revoked = True

        self._update(change)

    def sync_sso(self, name: str, workspaces: list[str], permissions: list[str], *,
                 issuer: str, subject: str) -> User:
        wss, perms = checked_new_user(name, workspaces, permissions)

        def change(doc: UsersDoc) -> User:
            user = doc.users.get(name)
            if user is None:
                user = doc.users[name] = User(id=name, name=name, workspaces=wss, permissions=perms,
                                              created=time.time(), sso_issuer=issuer, sso_subject=subject)
                return user
            refusal = sso_mismatch(user, issuer, subject)
            if refusal is not None:
                raise refusal
            if not user.revoked:
                user.workspaces, user.permissions = wss, perms
                user.sso_issuer, user.sso_subject = issuer, subject
            return user

        return self._update(change)  # type: ignore[return-value]

    def last_login(self, uid: str) -> float | None:
        return self._load().logins.get(uid)

    # -- invitations ---------------------------------------------------------
    def new_invitation(self, workspaces: list[str], permissions: list[str], ttl_s: float,
                       created_by: str, name: str | None = None) -> tuple[str, Invitation]:
        wss, perms = checked_new_user(name, workspaces, permissions) if name is not None \
            else checked_grants(workspaces, permissions)
        code = new_invitation_code()

        def change(doc: UsersDoc) -> Invitation:
            if name is not None and name in doc.users:
                raise UserError(f"user {name!r} already exists")
            now = time.time()
            inv = StoredInvitation(id=new_id("inv_"), workspaces=wss, permissions=perms, created=now,
                                   expires=now + ttl_s, created_by=created_by, name=name, hash=_hash(code))
            doc.invitations.append(inv)
            return inv.public()

        return code, self._update(change)  # type: ignore[return-value]

    def invitations(self) -> list[Invitation]:
        return [inv.public() for inv in reversed(self._load().invitations)]

    def peek_invitation(self, code: str) -> Invitation | None:
        if not code or not isinstance(code, str):
            return None
        hit = self._find_invitation(self._load(), _hash(code))
        return hit.public() if hit else None

    def revoke_invitation(self, inv_id: str) -> None:
        def change(doc: UsersDoc) -> None:
            inv = next((i for i in doc.invitations if i.id == inv_id), None)
            if inv is None:
                raise UserError(f"no invitation {inv_id!r}")
            inv.revoked = True

        self._update(change)

    def redeem_invitation(self, code: str, name: str | None) -> User:
        digest = _hash(code) if code and isinstance(code, str) else ""

        def change(doc: UsersDoc) -> User:
            inv = self._find_invitation(doc, digest) if digest else None
            now = time.time()
            refusal = invitation_problem(inv, now)
            if refusal is not None:
                raise refusal
            uid = invitee_name(inv, name)
            if uid in doc.users:
                raise UserError(f"the user name {uid!r} is taken; choose another")
            user = doc.users[uid] = User(id=uid, name=uid, workspaces=list(inv.workspaces),
                                         permissions=list(inv.permissions), created=now)
            inv.used_by, inv.used_at = uid, now
            return user

        return self._update(change)  # type: ignore[return-value]

    @staticmethod
    def _find_invitation(doc: UsersDoc, digest: str) -> StoredInvitation | None:
        return next((i for i in doc.invitations if hmac.compare_digest(i.hash, digest)), None)

    @staticmethod
    def _need(doc: UsersDoc, uid: str) -> User:
        user = doc.users.get(uid)
        if user is None:
            raise no_user(uid)
        return user

    # -- authentication -----------------------------------------------------
    def by_token(self, token: str) -> User | None:
        """The active user owning API token `token`, else None."""
        if not token:
            return None
        digest = _hash(token)
        for user in self._load().users.values():
            if user.revoked:
                continue
            for tok in user.tokens:
                if not tok.revoked and hmac.compare_digest(tok.hash, digest):
                    return user
        return None

    def new_login_code(self, uid: str, ttl_s: float) -> str:
        """A one-time code for the login URL (exchanged for a session, then void); the user's
        earlier codes stop working."""
        code = new_login_code_value(uid)

        def change(doc: UsersDoc) -> None:
            self._need(doc, uid)
            now = time.time()
            doc.login_codes = [c for c in doc.login_codes if c.expires > now and c.user != uid]
            doc.login_codes.append(LoginCode(hash=_hash(code), user=uid, expires=now + ttl_s))

        self._update(change)
        return code

    def peek_login_code(self, code: str) -> User | None:
        """The active user a valid login code is for, without consuming it (for the confirm page)."""
        if not code:
            return None
        digest, now = _hash(code), time.time()
        doc = self._load()
        hit = next((c for c in doc.login_codes if hmac.compare_digest(c.hash, digest) and c.expires > now), None)
        user = doc.users.get(hit.user) if hit else None
        return user if user and not user.revoked else None

    def record_login(self, uid: str) -> None:
        """Note that `uid` logged in (the startup login URL is printed only until an admin has)."""
        self._update(lambda doc: doc.logins.__setitem__(uid, time.time()))

    def has_logged_in(self, uid: str) -> bool:
        return uid in self._load().logins

    def redeem_login_code(self, code: str) -> User | None:
        """Consume a login code; returns its user, or None if unknown/expired/used."""
        if not code:
            return None
        digest = _hash(code)

        def change(doc: UsersDoc) -> User | None:
            now = time.time()
            hit = next((c for c in doc.login_codes if hmac.compare_digest(c.hash, digest)), None)
            doc.login_codes = [c for c in doc.login_codes if c is not hit and c.expires > now]
            if hit is None or hit.expires <= now:
                return None
            user = doc.users.get(hit.user)
            return user if user and not user.revoked else None

        return self._update(change)  # type: ignore[return-value]

    # -- sessions ------------------------------------------------------------
    def _sessions(self) -> dict[str, Session]:
        raw = read_json(self.layout.sessions_file, {})
        return msgspec.convert(raw, dict[str, Session])

    def new_session(self, uid: str, ttl_s: float) -> str:
        sid = new_session_id()
        now = time.time()
        with self._slock:
            sessions = {k: v for k, v in self._sessions().items() if v.expires > now}
            sessions[_hash(sid)] = Session(user=uid, created=now, expires=now + ttl_s)
            write_json(self.layout.sessions_file, sessions, mode=0o600)
        return sid

    def by_session(self, sid: str) -> User | None:
        if not sid:
            return None
        sess = self._sessions().get(_hash(sid))
        if sess is None or sess.expires <= time.time():
            return None
        user = self.get(sess.user)
        return user if user and not user.revoked else None

    def end_session(self, sid: str) -> None:
        digest = _hash(sid)
        self._drop_sessions(lambda s, d=digest: False, key=digest)

    def _drop_sessions(self, predicate: Callable[[Session], bool], key: str | None = None) -> None:
        with self._slock:
            sessions = self._sessions()
            kept = {k: v for k, v in sessions.items() if k != key and not predicate(v)}
            if len(kept) != len(sessions):
                write_json(self.layout.sessions_file, kept, mode=0o600)
