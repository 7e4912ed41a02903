"""Cache limits for query results and uploads: per thread, per user, global, and a TTL.

Eviction is least-recently-used first, and a user pays for their own data
first: a global overflow evicts the triggering user's oldest artifacts before
anyone else's, and a periodic sweep takes from the largest user first. An
evicted artifact keeps its metadata as a tombstone (`expired`, with the
time). Deliverables (charts, reports, files code writes) are never evicted;
their own per-user byte quota is checked when they are written.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from filelock import FileLock, Timeout

from datadesk.domain.artifacts import Artifact
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.offload.artifacts.tempfiles import sweep_temp_files
from datadesk.settings import OffloadSettings
from datadesk.store.threads import Thread

log = logging.getLogger(__name__)


class QuotaExceeded(Exception):
    """A deliverable or upload would pass a hard quota: the message says which and by how much."""


@dataclass
class Entry:
    workspace: str
    user: str
    thread: Thread
    art: Artifact


@dataclass(frozen=True)
class Eviction:
    artifact: str
    user: str
    reason: str


class ArtifactQuota:
    """Enforces the cache limits; safe to call from several processes (one sweep at a time)."""

    def __init__(self, settings: OffloadSettings, store: ArtifactStore) -> None:
        self.settings = settings
        self.store = store
        self._lock = FileLock(str(store.layout.home / ".artifact-sweep.lock"))

    def after_create(self, art: Artifact, *more: Artifact) -> list[Eviction]:
        """Called when cache artifacts were written (one result, or every sheet of a workbook): the
        new ones are kept, older data makes room, their user's own first (`art.origin.user`, who
        caused it)."""
        return self.enforce(trigger_user=art.origin.user, protect={a.id for a in (art, *more)}, wait=True)

    def enforce(self, trigger_user: str | None = None, protect: Iterable[str] = (),
                wait: bool = False) -> list[Eviction]:
        try:
            with self._lock.acquire(timeout=30 if wait else 0):
                return self._enforce(trigger_user, set(protect))
        except Timeout:
            return []  # another worker is sweeping right now

    def sweep_round(self, interval_s: float) -> list[Eviction] | None:
        """The periodic sweep, once per interval per host: with several workers, a worker skips the
        round (None) when another is sweeping or swept less than an interval ago. Each round also
        removes what a crash left in artifacts folders (stale temp files, orphan data)."""
        marker = Path(self._lock.lock_file).with_name(".artifact-sweep.last")
        try:
            with self._lock.acquire(timeout=0):
                try:
                    if time.time() - marker.stat().st_mtime < interval_s * 0.9:
                        return None
                except FileNotFoundError:
                    pass
                evicted = self._enforce(None, set())
                sweep_temp_files(self.store)
                marker.touch()
                return evicted
        except Timeout:
            return None

    def _enforce(self, trigger_user: str | None, protect: set[str]) -> list[Eviction]:
        s = self.settings
        now = time.time()
        entries = [Entry(ws, u, t, a) for ws, u, t, a in self.store.walk() if a.is_cache and a.available]
        evicted: list[Eviction] = []

        def evict(e: Entry, reason: str) -> None:
            if self.store.expire(e.thread, e.art.id) is not None:
                evicted.append(Eviction(e.art.id, e.user, reason))
                log.info("evicted artifact %s of %s (%s)", e.art.id, e.user, reason)

        live: list[Entry] = []
        for e in entries:
            if e.art.id not in protect and now - e.art.last_used > s.ttl_s:
                evict(e, "ttl")
            else:
                live.append(e)

        def trim(group: list[Entry], max_count: int, max_bytes: int, reason: str) -> None:
            group.sort(key=lambda e: e.art.last_used)
            count, size = len(group), sum(e.art.stored_bytes for e in group)
            for e in list(group):
                if count <= max_count and size <= max_bytes:
                    break
                if e.art.id in protect:
                    continue
                evict(e, reason)
                group.remove(e)
                live.remove(e)
                count, size = count - 1, size - e.art.stored_bytes

        by_thread: dict[Path, list[Entry]] = defaultdict(list)
        for e in live:
            by_thread[e.thread.dir].append(e)
        for group in by_thread.values():
            trim(group, s.thread_max_count, s.thread_max_bytes, "thread quota")

        by_user: dict[str, list[Entry]] = defaultdict(list)
        for e in live:
            by_user[e.user].append(e)
        for group in by_user.values():
            trim(group, s.user_max_count, s.user_max_bytes, "user quota")

        # Global: the triggering user pays first, then whoever holds the most.
        while len(live) > s.global_max_count or sum(e.art.stored_bytes for e in live) > s.global_max_bytes:
            candidates = [e for e in live if e.art.id not in protect]
            if not candidates:
                break
            mine = [e for e in candidates if e.user == trigger_user]
            if not mine:
                usage: dict[str, int] = defaultdict(int)
                for e in candidates:
                    usage[e.user] += e.art.stored_bytes
                biggest = max(usage, key=lambda u: usage[u])
                mine = [e for e in candidates if e.user == biggest]
            victim = min(mine, key=lambda e: e.art.last_used)
            evict(victim, "global quota")
            live.remove(victim)
        return evicted

    def deliverable_bytes(self, user: str) -> int:
        return sum(a.bytes for _, u, _, a in self.store.walk()
                   if u == user and a.kind == "deliverable" and a.available)

    def check_deliverable(self, user: str, new_bytes: int) -> None:
        """Raise QuotaExceeded when `new_bytes` more deliverable data would pass the user's quota."""
        used = self.deliverable_bytes(user)
        cap = self.settings.deliverable_user_max_bytes
        if used + new_bytes > cap:
            raise QuotaExceeded(
                f"your saved outputs use {used / 1e6:.1f} MB of {cap / 1e6:.0f} MB; "
                f"{new_bytes / 1e6:.1f} MB more does not fit. Delete old charts or files first.")
