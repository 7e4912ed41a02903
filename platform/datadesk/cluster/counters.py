"""`PgCounters`: the cluster `store.interfaces.counters.RateCounter`, one row per (key, window length) in
`rate_counters` (migration 0003_counters.sql), shared by every host.

A hit is one statement, `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`: the row lock makes
concurrent hits from any number of hosts add up exactly, and the CASE opens a new window when
the stored one has ended. Windows are timed by the database clock, so hosts agree. Rows of
ended windows are deleted at most once per `sweep_every_s` per process (one more statement on
that hit); reads never trust them anyway (`expires_at > now()`).
"""

from __future__ import annotations

import logging
import threading
import time

from datadesk.cluster.database import Database
from datadesk.store.interfaces.counters import check_hit

log = logging.getLogger(__name__)

HIT = """
INSERT INTO rate_counters AS c (key, window_s, count, expires_at)
VALUES (%(k)s, %(w)s, %(n)s, now() + make_interval(secs => %(w)s))
ON CONFLICT (key, window_s) DO UPDATE SET
    count = CASE WHEN c.expires_at <= now() THEN EXCLUDED.count ELSE c.count + EXCLUDED.count END,
    expires_at = CASE WHEN c.expires_at <= now() THEN EXCLUDED.expires_at ELSE c.expires_at END
RETURNING count
"""
OPEN = ("SELECT count, extract(epoch FROM expires_at - now())::float8 AS left_s FROM rate_counters"
        " WHERE key = %s AND window_s = %s AND expires_at > now()")


class PgCounters:
    """Rate counters in PostgreSQL: hits from every host count into the same windows."""

    shared = True

    def __init__(self, db: Database, sweep_every_s: float = 60.0) -> None:
        self.db = db
        self.sweep_every_s = sweep_every_s
        self._next_sweep = time.monotonic() + sweep_every_s
        self._sweep_lock = threading.Lock()

    def hit(self, key: str, window_s: float, cost: int = 1) -> int:
        check_hit(key, window_s, cost)
        with self.db.autocommit() as conn:  # one statement each
            count = conn.execute(HIT, {"k": key, "w": float(window_s), "n": cost}).fetchone()["count"]
        self._maybe_sweep()
        return int(count)

    def _open(self, key: str, window_s: float) -> dict | None:
        check_hit(key, window_s)
        with self.db.autocommit() as conn:  # one statement each
            return conn.execute(OPEN, (key, float(window_s))).fetchone()

    def count(self, key: str, window_s: float) -> int:
        row = self._open(key, window_s)
        return int(row["count"]) if row else 0

    def resets_in(self, key: str, window_s: float) -> float:
        row = self._open(key, window_s)
        return max(0.0, float(row["left_s"])) if row else 0.0

    def reset(self, key: str) -> None:
        check_hit(key, 1.0)
        with self.db.autocommit() as conn:  # one statement each
            conn.execute("DELETE FROM rate_counters WHERE key = %s", (key,))

    def sweep(self) -> int:
        """Delete the rows of ended windows; returns how many."""
        with self.db.autocommit() as conn:  # one statement each
            return conn.execute("DELETE FROM rate_counters WHERE expires_at <= now()").rowcount

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep or not self._sweep_lock.acquire(blocking=False):
            return
        try:
            self._next_sweep = now + self.sweep_every_s
            self.sweep()
        except Exception:  # a failed sweep loses nothing: ended rows are never read as live
            log.warning("could not sweep ended rate counter windows", exc_info=True)
        finally:
            self._sweep_lock.release()


def build_counters(db: Database) -> PgCounters:
    """The shared rate counters on `db` (schema from migration 0003_counters.sql)."""
    return PgCounters(db)
