"""The cluster set, opened once per process by the composition root: the database (migrated),
the object store, and every cluster implementation of the `store/interfaces/` protocols built on them."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable
from urllib.parse import unquote

from datadesk.cluster.database import Database
from datadesk.domain.ids import ID_PATTERN, check_id
from datadesk.domain.credentials import add_known_secrets, url_password
from datadesk.sandbox.ownership import set_host
from datadesk.settings import Settings, SettingsError
from datadesk.store.interfaces.blobs import BlobUnavailable
from datadesk.store.layout import Layout
from datadesk.store.workspaces import Workspaces

log = logging.getLogger(__name__)


def cluster_problem(settings: Settings) -> str | None:
    """Why these settings cannot run the cluster set, or None. Names the missing setting."""
    if not settings.cluster.database_url:
        return None
    missing = []
    if not settings.storage.url:
        missing.append("storage.url (DATADESK_STORAGE_URL, e.g. s3://bucket/prefix): every file lives in the "
                       "object store, so hosts share nothing on disk")
    if not settings.server.secret_key:
        missing.append("server.secret_key (DATADESK_SECRET_KEY): one secret for CSRF and sessions on every host")
    if settings.storage.url and not settings.storage.url.startswith("s3://"):
        missing.append(f"storage.url must be s3://bucket/prefix, not {settings.storage.url!r}")
    if missing:
        return "the cluster set (cluster.database_url is set) needs " + "; ".join(missing)
    return None


class ClusterSet:
    """The open database and object store, and the cluster implementations built on them, each
    built once on first use and shared (one lock connection, one pool, one cache per process)."""

    def __init__(self, settings: Settings, layout: Layout) -> None:
        problem = cluster_problem(settings)
        if problem:
            raise SettingsError(problem)
        assert settings.cluster.database_url and settings.storage.url
        # its credentials, wherever they came from (a settings file too), are kept out of every
        # log line and API answer of this process (domain/redaction.py `known_secrets`)
        password = url_password(settings.cluster.database_url)
        add_known_secrets(password, unquote(password or ""), settings.server.secret_key,
                          os.environ.get("AWS_SECRET_ACCESS_KEY"), os.environ.get("AWS_SESSION_TOKEN"))
        self.settings = settings
        self.layout = layout
        self.host_id = settings.cluster.host_id or os.uname().nodename
        set_host(self.host_id)  # kernel records and heartbeats name this host as the cluster does
        self.db = Database(settings.cluster.database_url, max_size=settings.cluster.pool_size,
                           name=f"datadesk@{self.host_id}")
        self.db.migrate()
        self._built: dict[str, Any] = {}

    def _once(self, name: str, build: Callable[[], Any]) -> Any:
        if name not in self._built:
            self._built[name] = build()
        return self._built[name]

    def users(self, purge: Callable[[str], Iterable[str]] | None = None) -> Any:
        from datadesk.cluster.users import build_users

        # a deleted user's data goes from every store of the set (`purge_user`), on any host
        return self._once("users", lambda: build_users(self.db, purge or self.purge_user))

    def counters(self) -> Any:
        from datadesk.cluster.counters import build_counters

        return self._once("counters", lambda: build_counters(self.db))

    def audit(self) -> Any:
        from datadesk.cluster.audit import build_audit

        # the audit trail's table (audit_events), written by every host, read by any admin view
        return self._once("audit", lambda: build_audit(self.db, self.settings.audit.retention_days, self.host_id,
                                                       self.layout.home / "audit-spill"))

    def locks(self) -> Any:
        from datadesk.cluster.locks import build_locks

        return self._once("locks", lambda: build_locks(self.db))

    def search(self) -> Any:
        from datadesk.cluster.search import build_search

        return self._once("search", lambda: build_search(self.db))

    def threads(self) -> Any:
        from datadesk.cluster.threads import build_threads

        return self._once("threads", lambda: build_threads(self.db, self.settings, self.layout, self.search()))

    def memory_docs(self) -> Any:
        from datadesk.cluster.memory import build_memory_docs

        return self._once("memory", lambda: build_memory_docs(self.db))

    def shares(self) -> Any:
        from datadesk.cluster.shares import build_shares

        return self._once("shares", lambda: build_shares(self.db))

    def blobs(self) -> Any:
        from datadesk.cluster.objects.blobs import build_blobs

        return self._once("blobs", lambda: build_blobs(self.settings, self.layout))

    def artifacts(self, open_thread: Callable[[Any], Any] | None = None) -> Any:
        from datadesk.cluster.objects.artifacts import build_artifacts

        return self._once("artifacts", lambda: build_artifacts(self.db, self.blobs(), self.layout, open_thread))

    def turns(self, before_turn: Callable[[Any], None] | None = None) -> Any:
        from datadesk.cluster.takeover import build_takeover
        from datadesk.cluster.turns import build_turns

        if "turns" not in self._built:
            registry = build_turns(self.db, self.settings, self.layout, before_turn)
            self._built["turns"] = registry
            # a claim that finds its thread's turn cut off (its host died or hung) finishes it first
            self._built["reaper"] = build_takeover(self.db, registry, self.threads())
        return self._built["turns"]

    def reaper(self) -> Any:
        """The turn reaper (cluster/takeover.py), wired into `turns()`: a turn whose host died or
        hung is finished by the next claim of its thread or by the reaper, whichever comes first."""
        self.turns()
        return self._built["reaper"]

    async def reap_turns(self) -> None:
        """The reaper's loop, for the runtime's background tasks (one host reaps at a time)."""
        await self.reaper().run_forever()

    def kernels(self) -> tuple[Any, Any]:
        from datadesk.cluster.kernels import build_kernels

        return self._once("kernels", lambda: build_kernels(self.db, self.settings, self.layout, self.locks()))

    def close(self) -> None:
        """Close every part built (the turn registry's lock connections and listener, the event
        journal's writer, the lock connection, the caches), then the pool: no connection of this
        process stays open on the database (after `Runtime.stop` cancelled the turns)."""
        for name in CLOSE_ORDER:
            built = self._built.get(name)
            for part in built if isinstance(built, tuple) else (built,):
                closer = getattr(part, "close", None)
                if closer is None:
                    continue
                try:
                    closer()
                except Exception:
                    log.exception("closing the cluster %s failed", name)
        self.db.close()

    # -- deleting a user (`datadesk users delete`) ------------------------------------------
    def purge_user(self, uid: str) -> list[str]:
        """Remove what user `uid` (whose row is already gone) has in the other stores: every
        thread (records, documents, lines, search entries, its turn row and events), artifacts
        (rows, and every object under the user's prefix of each workspace), memory (documents
        and audit), kernel rows. Returns the prefixes `ws/<ws>/u/<uid>/` purged."""
        check_id(uid, "user")
        threads, artifacts, journal = self.threads(), self.artifacts(), self.turns().journal
        removed = []
        for ws in self._workspaces_of(uid):
            for thread in list(threads.folders(ws, uid)):
                artifacts.forget_thread(thread)  # its rows and the objects under its prefix
                journal.drop(thread.id, None)
                threads.delete(thread)  # records, documents and lines (cascade), its search entries
            prefix = f"ws/{ws}/u/{uid}/"
            try:  # what no row names any more (outputs, an interrupted upload's objects)
                self.blobs().delete_prefix(prefix)
            except BlobUnavailable as exc:
                log.warning("user %s: the objects under %s stay in the store for now: %s", uid, prefix, exc)
            removed.append(prefix)
        table, _ = self.kernels()
        for rec in table.sessions():
            if rec.key is not None and rec.key[1] == uid:
                table.remove(rec.key)
        with self.db.connection() as conn:  # the rows no store removes by user (and any a race left)
            for sql in PURGE_BY_USER:
                conn.execute(sql, {"u": uid})
        log.info("purged user %s from the cluster set: %d workspace(s)", uid, len(removed))
        return removed

    def _workspaces_of(self, uid: str) -> list[str]:
        """Every workspace where `uid` may have something: those named by its rows, and this home's."""
        with self.db.connection() as conn:
            rows = conn.execute(WORKSPACES_OF, {"u": uid}).fetchall()
        found = {r["workspace"] for r in rows} | set(Workspaces(self.layout).names())
        return sorted(ws for ws in found if ID_PATTERN.fullmatch(ws))


# closed in this order: what holds connections of its own first, the lock connection last
CLOSE_ORDER = ("reaper", "turns", "kernels", "artifacts", "search", "threads", "memory", "users", "counters",
               "blobs", "locks")
WORKSPACES_OF = """SELECT workspace FROM threads WHERE owner = %(u)s UNION SELECT workspace FROM artifacts
WHERE user_id = %(u)s UNION SELECT workspace FROM memory_docs WHERE user_id = %(u)s UNION SELECT workspace
FROM memory_audit WHERE user_id = %(u)s UNION SELECT workspace FROM kernels WHERE user_id = %(u)s UNION
SELECT workspace FROM search_marks WHERE owner = %(u)s"""
PURGE_BY_USER = (
    "DELETE FROM threads WHERE owner = %(u)s",
    "DELETE FROM artifacts WHERE user_id = %(u)s",
    "DELETE FROM search_entries WHERE owner = %(u)s",
    "DELETE FROM search_marks WHERE owner = %(u)s",
    "DELETE FROM memory_docs WHERE user_id = %(u)s",
    "DELETE FROM memory_audit WHERE user_id = %(u)s",
    "DELETE FROM kernels WHERE user_id = %(u)s",
    "DELETE FROM turn_events WHERE thread_id IN (SELECT thread_id FROM turns WHERE user_id = %(u)s)",
    "DELETE FROM turns WHERE user_id = %(u)s",
)
