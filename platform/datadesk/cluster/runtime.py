"""The cluster set, opened once per process by the composition root: the database (migrated),
the object store, and every cluster implementation of the `state/` protocols built on them."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from datadesk.cluster.database import Database
from datadesk.settings import Settings, SettingsError
from datadesk.store.layout import Layout

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
        self.settings = settings
        self.layout = layout
        self.host_id = settings.cluster.host_id or os.uname().nodename
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

        return self._once("users", lambda: build_users(self.db, purge))

    def counters(self) -> Any:
        from datadesk.cluster.counters import build_counters

        return self._once("counters", lambda: build_counters(self.db))

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

    def blobs(self) -> Any:
        from datadesk.cluster.blobs import build_blobs

        return self._once("blobs", lambda: build_blobs(self.settings, self.layout))

    def artifacts(self, open_thread: Callable[[Any], Any] | None = None) -> Any:
        from datadesk.cluster.artifacts import build_artifacts

        return self._once("artifacts", lambda: build_artifacts(self.db, self.blobs(), self.layout, open_thread))

    def turns(self, before_turn: Callable[[Any], None] | None = None) -> Any:
        from datadesk.cluster.turns import build_turns

        return self._once("turns", lambda: build_turns(self.db, self.settings, self.layout, before_turn))

    def kernels(self) -> tuple[Any, Any]:
        from datadesk.cluster.kernels import build_kernels

        return self._once("kernels", lambda: build_kernels(self.db, self.settings, self.layout, self.locks()))

    def close(self) -> None:
        for name in ("blobs", "locks"):
            closer = getattr(self._built.get(name), "close", None)
            if closer is not None:
                try:
                    closer()
                except Exception:
                    log.exception("closing the cluster %s failed", name)
        self.db.close()
