"""`GET /api/ready`: whether this process can serve new work now (a load balancer's readiness
probe), apart from `/api/health` (liveness: the process answers; it never waits on a probe).

Embedded set: the home's disk (readable, writable, above `store.min_free_mb`). Cluster set: that,
plus a `SELECT 1` on a pooled database connection and a HEAD on the object store. Each probe runs
in a thread of its own (never on the event loop, never in the threads turns use), bounded by
PROBE_TIMEOUT_S; a probe still hanging from an earlier request is not started again (the
answer is "not ready" until it returns), so a dead database never piles up threads.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from litestar import Request, Response, get

from datadesk.domain.credentials import known_secrets
from datadesk.domain.redaction import redact

PROBE_TIMEOUT_S = 2.0
# never written (no workspace, user or thread has these ids): a HEAD answering "not found" proves the store answers
PROBE_KEY = "ws/readiness/u/probe/t/probe/a/probe.txt"
_THREADS = ThreadPoolExecutor(4, thread_name_prefix="datadesk-ready")


class Readiness:
    """The probes of one runtime `rt`, each single-flight."""

    def __init__(self, rt: Any, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.rt = rt
        self.timeout_s = timeout_s
        self._running: dict[str, Future[None]] = {}

    def probes(self) -> dict[str, Callable[[], None]]:
        found: dict[str, Callable[[], None]] = {"disk": self._disk}
        if self.rt.cluster is not None:
            found["database"] = self._database
            found["store"] = self._store
        return found

    async def check(self) -> tuple[bool, dict[str, Any]]:
        names, fns = zip(*self.probes().items())
        results = await asyncio.gather(*(self._probe(n, f) for n, f in zip(names, fns)))
        checks = dict(zip(names, results))
        return all(c["ok"] for c in checks.values()), checks

    async def _probe(self, name: str, fn: Callable[[], None]) -> dict[str, Any]:
        started = time.monotonic()
        running = self._running.get(name)
        if running is not None and not running.done():
            return {"ok": False, "error": f"the {name} probe started earlier has not answered yet"}
        fut = _THREADS.submit(fn)
        self._running[name] = fut
        waited = asyncio.wrap_future(fut)
        waited.add_done_callback(lambda f: f.cancelled() or f.exception())  # a late failure is not "never retrieved"
        try:
            await asyncio.wait_for(asyncio.shield(waited), self.timeout_s)
        except asyncio.TimeoutError:
            return {"ok": False, "error": f"no answer within {self.timeout_s:g} s"}
        except Exception as exc:
            text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            return {"ok": False, "error": redact(text, known_secrets()), "ms": _ms(started)}
        return {"ok": True, "ms": _ms(started)}

    def _disk(self) -> None:
        home = self.rt.layout.home
        if not os.access(home, os.R_OK | os.W_OK | os.X_OK):
            raise OSError(f"the data directory {home} is not readable and writable by this process")
        status = self.rt.disk.status()
        if status["low"]:
            raise OSError(f"the disk of {home} has {status['free_mb']} MB free, below store.min_free_mb = "
                          f"{status['min_free_mb']}")

    def _database(self) -> None:
        db = self.rt.cluster.db
        with db.pool.connection(timeout=self.timeout_s) as conn:  # the pool turns use: its health counts
            conn.execute("SELECT 1").fetchone()

    def _store(self) -> None:
        self.rt.cluster.blobs().exists(PROBE_KEY)  # BlobUnavailable when it does not answer


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


@get("/api/ready", include_in_schema=False)
async def ready(request: Request) -> Response[dict[str, Any]]:
    """200 with each check when every probe passed, else 503 naming what failed."""
    probes: Readiness = request.app.state.readiness
    ok, checks = await probes.check()
    body: dict[str, Any] = {"ready": ok, "checks": checks}
    if not ok:
        body["error"] = "not ready: " + "; ".join(f"{name}: {c['error']}" for name, c in checks.items() if not c["ok"])
    return Response(body, status_code=200 if ok else 503)
