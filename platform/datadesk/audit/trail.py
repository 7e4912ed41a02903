"""`AuditTrail`: the one front that every caller holds (`rt.audit`).

`record(...)` builds the entry, keeps secrets out of it and hands it to the set's log (the
embedded day files or the cluster table). It never raises into the caller: an entry that cannot
be written is logged (with its action, user and outcome, never its SQL) and the caller carries on;
on the cluster set it is then kept in this host's `<home>/audit-spill/` day files (`fallback`), so
a database that is down for a moment loses no entry (an admin reads them there).
The retention sweep (`audit.retention_days`) runs at start and then at most once per
`sweep_every_s`, in a short-lived background thread started by `record`, so no caller waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Protocol

from datadesk.audit.event import (ACTIONS, DETAIL_MAX_CHARS, OUTCOMES, SQL_MAX_CHARS, AuditEvent, AuditFilter,
                                  AuditPage, day_of)
from datadesk.audit.dayfiles import DayFiles
from datadesk.domain.credentials import known_secrets
from datadesk.domain.redaction import redact

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 3600.0
MAX_PAGE = 500


class AuditLog(Protocol):
    """Where a set keeps its entries: `DayFiles` (embedded) or `cluster.audit.AuditTable`."""

    def append(self, ev: AuditEvent) -> None: ...

    def page(self, flt: AuditFilter, cursor: str | None = None, limit: int = 100) -> AuditPage: ...

    def remove_before(self, day: str) -> object: ...


def _cut(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    text = redact(text, known_secrets())  # a password in a DSN, a token pasted into a query
    return text if len(text) <= limit else text[:limit] + " …[cut]"


class AuditTrail:
    """Records audited actions into `store` and reads them back for the admin view."""

    def __init__(self, store: AuditLog, retention_days: int = 0, *, host: str | None = None,
                 clock: Callable[[], float] = time.time, sweep_every_s: float = SWEEP_EVERY_S,
                 fallback: AuditLog | None = None) -> None:
        self.store = store
        self.fallback = fallback
        self.retention_days = retention_days
        self.host = host
        self.clock = clock
        self.sweep_every_s = sweep_every_s
        self._sweep_lock = threading.Lock()
        self._last_sweep = float("-inf")
        self._maybe_sweep()  # at start

    def record(self, action: str, *, user: str | None, outcome: str = "ok", workspace: str | None = None,
               thread: str | None = None, source: str | None = None, sql: str | None = None,
               rows: int | None = None, bytes: int | None = None, duration_ms: float | None = None,
               target: str | None = None, detail: str | None = None, client: str | None = None) -> None:
        """Append one entry. Never raises: a failure is logged and the caller goes on."""
        ev = None
        try:
            if action not in ACTIONS or outcome not in OUTCOMES:
                log.warning("audit: unexpected action %r / outcome %r (recorded as given)", action, outcome)
            ev = AuditEvent(ts=self.clock(), action=action, user=user, outcome=outcome, workspace=workspace,
                            thread=thread, source=source, sql=_cut(sql, SQL_MAX_CHARS), rows=rows, bytes=bytes,
                            duration_ms=None if duration_ms is None else round(float(duration_ms), 3),
                            target=_cut(target, DETAIL_MAX_CHARS), detail=_cut(detail, DETAIL_MAX_CHARS),
                            client=_cut(client, DETAIL_MAX_CHARS), host=self.host)
            self.store.append(ev)
        except Exception:
            log.exception("audit: could not record %s by %s (%s)", action, user, outcome)
            self._spill(ev)
        self._maybe_sweep()

    def _spill(self, ev: AuditEvent | None) -> None:
        if ev is None or self.fallback is None:
            return
        try:
            self.fallback.append(ev)
            log.warning("audit: the %s entry of %s was kept in this host's audit spill files instead",
                        ev.action, ev.user)
        except Exception:
            log.exception("audit: the %s entry of %s is lost (its spill file could not be written either)",
                          ev.action, ev.user)

    def page(self, flt: AuditFilter, cursor: str | None = None, limit: int = 100) -> AuditPage:
        """Entries matching `flt`, newest first; `cursor` from the previous page. ValueError for
        a cursor this log did not give."""
        return self.store.page(flt, cursor, max(1, min(int(limit), MAX_PAGE)))

    def entries(self, flt: AuditFilter) -> Iterator[AuditEvent]:
        """Every entry matching `flt`, newest first, page by page (the CSV export)."""
        cursor: str | None = None
        while True:
            page = self.store.page(flt, cursor, MAX_PAGE)
            yield from page.entries
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def sweep(self, now: float | None = None) -> object:
        """Remove the entries older than `retention_days` (whole days); nothing when it is 0."""
        if self.retention_days <= 0:
            return None
        now = self.clock() if now is None else now
        day = day_of(now - self.retention_days * 86400.0)
        if self.fallback is not None:  # the spill files keep no entry longer than the log itself
            self.fallback.remove_before(day)
        return self.store.remove_before(day)

    def _maybe_sweep(self) -> None:
        if self.retention_days <= 0:
            return
        now = time.monotonic()
        if now - self._last_sweep < self.sweep_every_s or not self._sweep_lock.acquire(blocking=False):
            return
        self._last_sweep = now
        threading.Thread(target=self._sweep_in_thread, name="audit-retention", daemon=True).start()

    def _sweep_in_thread(self) -> None:
        try:
            self.sweep()
        except Exception:
            log.exception("audit: retention sweep failed")
        finally:
            self._sweep_lock.release()


def embedded_trail(home: Path, retention_days: int, fsync: bool = False) -> AuditTrail:
    """The embedded set's trail: day files under `<home>/audit/`."""
    return AuditTrail(DayFiles(Path(home) / "audit", fsync), retention_days, host=os.uname().nodename)
