"""`GET /metrics`: the Prometheus text format, behind `server.metrics_token` (unset: 404).

What is counted lives in telemetry.py (the turn loop, the offload pipeline, the query and upload
slots and the kernel registry count there); what is read rather than counted (kernels by state,
the database pool) is sampled here, at each scrape and every SAMPLE_S in the background, so
that under `--workers N` (prometheus_client's multiprocess mode, one directory of value files
for all workers) every worker's figures are fresh whichever worker answers the scrape.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from datadesk.telemetry import DB_POOL, HTTP_RESPONSES, KERNELS

log = logging.getLogger(__name__)

SAMPLE_S = 5.0
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")  # a worker's live gauges: dropped when it is gone


def multiprocess_dir(home: Path) -> Path:
    """A fresh directory for the value files of this supervisor's workers (`<home>/run/metrics-<pid>`)."""
    path = (Path(home) / "run" / f"metrics-{os.getpid()}").resolve()
    shutil.rmtree(path, ignore_errors=True)  # a pid reused from an earlier run: its counts are not ours
    path.mkdir(parents=True, mode=0o700)
    return path


class MetricsSampler:
    """Sets the sampled gauges from this process's runtime (`rt`): kernels by state, pool use."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        kernels = self.rt.kernels
        if kernels is not None:
            busy = sum(1 for s in kernels.sessions.values() if s.lock.locked())
            counts = {"starting": getattr(kernels, "_starting", 0), "pooled": len(kernels.pool), "busy": busy,
                      "idle": len(kernels.sessions) - busy}
            for state, n in counts.items():
                KERNELS.labels(state).set(n)
        pool = getattr(getattr(self.rt.cluster, "db", None), "pool", None)
        if pool is not None:
            stats = pool.get_stats()
            size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
            for state, n in (("size", size), ("idle", idle), ("in_use", size - idle),
                             ("max", stats.get("pool_max", 0)), ("waiting", stats.get("requests_waiting", 0))):
                DB_POOL.labels(state).set(n)

    async def start(self) -> None:
        if not self.rt.settings.server.metrics_token:
            return  # /metrics is off: nothing reads the gauges
        self._task = asyncio.create_task(self._run(), name="metrics-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a sample is advice: never the end of the sampler
                log.debug("metrics sample failed", exc_info=True)
            await asyncio.sleep(SAMPLE_S)


def exposition() -> bytes:
    """Every metric of this process, or of every worker in multiprocess mode."""
    folder = os.environ.get(MULTIPROC_ENV)
    if not folder:
        return generate_latest(REGISTRY)
    from prometheus_client import multiprocess

    _forget_dead_workers(folder, multiprocess)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    return generate_latest(registry)


def _forget_dead_workers(folder: str, multiprocess: Any) -> None:
    """A worker that exited (and was replaced by the supervisor) leaves its live gauges behind:
    they go, so `livesum` sums the workers that run now."""
    for entry in os.listdir(folder):
        m = _LIVE_FILE.match(entry)
        if m and not _alive(int(m.group(1))):
            multiprocess.mark_process_dead(int(m.group(1)), folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _token_ok(request: Request, expected: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


@get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response[Any]:
    """The metrics, for a scraper that sends `Authorization: Bearer <server.metrics_token>`."""
    rt = request.app.state.runtime
    expected = rt.settings.server.metrics_token
    if not expected:
        return Response({"error": "metrics are off on this server: set server.metrics_token (DATADESK_METRICS_TOKEN)"},
                        status_code=404)
    if not _token_ok(request, expected):
        return Response({"error": "metrics need 'Authorization: Bearer <server.metrics_token>'"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})
    sampler = request.app.state.get("metrics_sampler")
    if sampler is not None:
        sampler.sample()
    body = await asyncio.to_thread(exposition)  # multiprocess mode reads files
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class CountResponses:
    """ASGI middleware, outermost: counts every HTTP response by status (429s among them)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                HTTP_RESPONSES.labels(str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
