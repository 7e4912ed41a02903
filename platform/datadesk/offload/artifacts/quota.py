"""Cache limits for query results and uploads: per thread, per user, global, and a TTL.

Eviction is least-recently-used first, and a user pays for their own data
first: a global overflow evicts the triggering user's oldest artifacts before
anyone else's, and a periodic sweep takes from the largest user first. An
evicted artifact keeps its metadata as a tombstone (`expired`, with the
time). Deliverables (charts, reports, files code writes) are never evicted;
their own per-user byte quota is checked when they are written.

What is counted comes from the artifact ledger (`ledger.py`), kept as artifacts are written
and removed, so recording a new artifact costs the same at 10 or 10,000 artifacts: a few
indexed reads, and only when a limit is passed (or an artifact outlived the TTL) does it pick
victims, the least recently used of the scope that overflowed, from the ledger's indexes.
The periodic sweep (`sweep_round`) reads every metadata file, corrects the ledger where it
drifted from them, and then runs the full pass over every thread and user.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable

from filelock import Timeout

from datadesk.domain.artifacts import Artifact
from datadesk.offload.artifacts.ledger import BATCH
from datadesk.offload.artifacts.tempfiles import sweep_temp_files
from datadesk.settings import OffloadSettings
from datadesk.store.interfaces.artifacts import (Artifacts, Drift, QuotaView as LedgerView, SweepBusy, ThreadKey, Victim,
                                      scope_of)

log = logging.getLogger(__name__)


class QuotaExceeded(Exception):
    """A deliverable or upload would pass a hard quota: the message says which and by how much."""


@dataclass(frozen=True)
class Eviction:
    artifact: str
    user: str
    reason: str


Claims = list[tuple[Victim, str]]  # claimed in the ledger, with the reason; their files expire next


class ArtifactQuota:
    """Enforces the cache limits; safe to call from several processes (one sweep at a time)."""

    def __init__(self, settings: OffloadSettings, store: Artifacts) -> None:
        self.settings = settings
        self.store = store
        self.ledger = store.ledger
        self._errors = store.ledger.errors  # what a failing ledger raises: logged, never fails a write
        self._lock = store.sweep_lock()  # one sweep per home (a file lock) or per cluster
        self._checked_open = -1  # the ledger connection whose file was seen built

    def after_create(self, art: Artifact, *more: Artifact) -> list[Eviction]:
        """Called when cache artifacts were written (one result, or every sheet of a workbook): the
        new ones are kept, older data makes room, their user's own first (`art.origin.user`, who
        caused it). Only the new artifacts' threads, their user and the host can have passed a
        limit: their totals are read, and nothing else unless one did."""
        arts = (art, *more)
        user = art.origin.user
        threads = sorted({scope_of(ThreadKey(a.origin.workspace, a.origin.user, a.origin.thread)) for a in arts})
        users = [scope_of(user=user)]
        protect = {a.id for a in arts}
        try:
            self._ensure_built()
            now = time.time()
            if not self._exceeded(threads, users, now):
                return []
            with self.ledger.transaction() as view:
                claims = self._claim(view, threads, users, user, protect, now)
        except self._errors as exc:  # the data is written; the next sweep enforces the limits
            log.warning("quota check after %s skipped: the artifact ledger failed (%s)", art.id, exc)
            return []
        return self._expire(claims)

    def enforce(self, trigger_user: str | None = None, protect: Iterable[str] = (),
                wait: bool = False) -> list[Eviction]:
        """The full pass over every thread and user (one at a time on the host: [] when another
        worker holds the sweep and `wait` is false)."""
        try:
            with self._lock.acquire(timeout=30 if wait else 0):
                return self._enforce_all(trigger_user, set(protect))
        except (Timeout, SweepBusy):
            return []  # another worker is sweeping right now

    def sweep_round(self, interval_s: float) -> list[Eviction] | None:
        """The periodic sweep, once per interval per host: with several workers, a worker skips the
        round (None) when another is sweeping or swept less than an interval ago. Each round
        corrects the ledger from the metadata files, runs the full pass (TTL, every thread and
        user, global), and removes what a crash left in artifacts folders (stale temp files,
        orphan data)."""
        try:
            with self._lock.acquire(timeout=0):
                last = self._lock.last_swept()
                if last is not None and time.time() - last < interval_s * 0.9:
                    return None
                self.reconcile()
                evicted = self._enforce_all(None, set())
                sweep_temp_files(self.store)
                self._lock.mark_swept()
                return evicted
        except (Timeout, SweepBusy):
            return None

    def start(self) -> None:
        """At start-up (in a worker thread): what a crash left goes, and a ledger that was never
        filled (a new file, a data directory from before it) is built from the files."""
        sweep_temp_files(self.store)
        self._ensure_built()

    # -- the ledger and the files ----------------------------------------------------------
    def reconcile(self) -> Drift:
        """Make the ledger say what the metadata files say; a difference is logged once per call."""
        built = self.ledger.built()
        started = time.time_ns()
        drift = self.ledger.reconcile(self.store.counted_rows(), started)
        if not built:
            log.info("artifact ledger built from the metadata files (%d artifacts counted)", drift.missing)
        elif drift.rows or drift.totals:
            log.warning("artifact ledger corrected from the metadata files: %d rows missing, %d stale, %d "
                        "changed, %d totals wrong (e.g. %s): a crash between a write and its bookkeeping, or "
                        "files changed outside the app", drift.missing, drift.stale, drift.changed, drift.totals,
                        ", ".join(drift.examples) or "-")
        self._checked_open = self.ledger.opens
        return drift

    def _ensure_built(self) -> None:
        """Build a ledger never filled from the files, once, under the sweep's lock (two reads of
        the files at once could undo each other's newer rows); checked once per connection."""
        if self._checked_open == self.ledger.opens and self._checked_open > 0:
            return
        if not self.ledger.built():
            try:
                with self._lock.acquire(timeout=30):
                    if not self.ledger.built():
                        self.reconcile()
            except (Timeout, SweepBusy):  # a sweep is running (it builds it): counted as far as the ledger knows
                return
        self._checked_open = self.ledger.opens

    def _exceeded(self, threads: list[str], users: list[str], now: float) -> bool:
        """Whether any of these totals is past its limit, or some artifact outlived the TTL."""
        s = self.settings
        totals, oldest = self.ledger.read([*threads, *users, "*"])
        limits = {**{t: (s.thread_max_count, s.thread_max_bytes) for t in threads},
                  **{u: (s.user_max_count, s.user_max_bytes) for u in users},
                  "*": (s.global_max_count, s.global_max_bytes)}
        return (oldest is not None and now - oldest > s.ttl_s) or any(
            totals[k].count > c or totals[k].bytes > b for k, (c, b) in limits.items())

    # -- choosing victims (inside one ledger transaction) -----------------------------------
    def _enforce_all(self, trigger_user: str | None, protect: set[str]) -> list[Eviction]:
        s = self.settings
        try:
            self._ensure_built()
            with self.ledger.transaction() as view:
                threads = view.over("t", s.thread_max_count, s.thread_max_bytes)
                users = view.over("u", s.user_max_count, s.user_max_bytes)
                claims = self._claim(view, threads, users, trigger_user, protect, time.time())
        except self._errors as exc:
            log.warning("quota pass skipped: the artifact ledger failed (%s)", exc)
            return []
        return self._expire(claims)

    def _claim(self, view: LedgerView, threads: list[str], users: list[str], trigger_user: str | None,
               protect: set[str], now: float) -> Claims:
        """TTL, then the thread and user quotas of these scopes, then the global one."""
        s = self.settings
        claims: Claims = []
        while True:
            batch = view.lru("*", protect, used_before=now - s.ttl_s)
            if not batch:
                break
            claims.extend((v, "ttl") for v in batch if self._take(view, v))
        for scope in threads:
            claims.extend(self._trim(view, scope, s.thread_max_count, s.thread_max_bytes, protect, "thread quota"))
        for scope in users:
            claims.extend(self._trim(view, scope, s.user_max_count, s.user_max_bytes, protect, "user quota"))
        claims.extend(self._trim_global(view, trigger_user, protect))
        return claims

    def _take(self, view: LedgerView, victim: Victim) -> bool:
        """Claim `victim`: True when its files are there to expire. A row whose metadata file is
        gone (a user removed, files deleted outside the app, a crash before the row was updated)
        only leaves the totals, with the rest of its thread when the thread's folder is gone, so
        that it never makes another artifact go in its place."""
        if not view.claim(victim):
            return False
        key = ThreadKey.parse(victim.thread)
        if self.store.has_artifact(key, victim.aid):
            return True
        if not self.store.has_thread(key):
            view.drop_thread(victim.thread)
        return False

    def _trim(self, view: LedgerView, scope: str, max_count: int, max_bytes: int, protect: set[str],
              reason: str) -> Claims:
        """The least recently used of `scope` until it is within both limits (never a protected one)."""
        claims: Claims = []
        while True:
            total = view.totals(scope)
            count, size = total.count, total.bytes
            if count <= max_count and size <= max_bytes:
                return claims
            # as many as the count needs (a bytes overflow: a batch at a time)
            batch = view.lru(scope, protect, limit=min(BATCH, max(1, count - max_count)))
            if not batch:
                return claims
            for v in batch:
                if count <= max_count and size <= max_bytes:
                    break
                if not self._take(view, v):
                    break  # the totals dropped by more than this one, perhaps: read them again
                claims.append((v, reason))
                count, size = count - 1, size - v.stored

    def _trim_global(self, view: LedgerView, trigger_user: str | None, protect: set[str]) -> Claims:
        """The host's limits: the triggering user pays first, then whoever holds the most."""
        s = self.settings
        claims: Claims = []
        while True:
            total = view.totals("*")
            if total.count <= s.global_max_count and total.bytes <= s.global_max_bytes:
                return claims
            mine = view.lru(scope_of(user=trigger_user), protect, limit=1) if trigger_user else []
            if not mine:
                biggest = view.biggest_user(other_than=trigger_user or "")
                mine = view.lru(scope_of(user=biggest), protect, limit=1) if biggest is not None else []
            if not mine:
                return claims
            if self._take(view, mine[0]):
                claims.append((mine[0], "global quota"))
            elif view.totals("*") == total:
                return claims  # nothing changed (never the case inside one transaction): never spin

    def _expire(self, claims: Claims) -> list[Eviction]:
        """Expire the claimed artifacts' files (tombstones stay); one already gone is skipped."""
        evicted: list[Eviction] = []
        for victim, reason in claims:
            key = ThreadKey.parse(victim.thread)
            try:
                art = self.store.expire_at(key, victim.aid)
            except Exception:  # one bad artifact never stops the others (its row is claimed: the sweep sees it)
                log.exception("evicting artifact %s of %s failed", victim.aid, victim.user)
                continue
            if art is not None:
                evicted.append(Eviction(victim.aid, victim.user, reason))
                log.info("evicted artifact %s of %s (%s)", victim.aid, victim.user, reason)
        return evicted

    # -- deliverables ----------------------------------------------------------------------
    def deliverable_bytes(self, user: str) -> int:
        """The bytes of `user`'s kept deliverables, every workspace (from the ledger; read from the
        files when the ledger fails)."""
        try:
            self._ensure_built()
            totals, _ = self.ledger.read([scope_of(user=user)])
            return totals[scope_of(user=user)].deliverable
        except self._errors as exc:
            log.warning("artifact ledger failed (%s): counting %s's deliverables from the files", exc, user)
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
