"""What the app counts (Prometheus metrics, `prometheus_client`) and the turn a log line belongs
to (context variables). No I/O here: the parts that count import this module; `api/metrics.py`
serves `/metrics` and samples what is read rather than counted (kernels, the database pool);
`api/logs.py` writes the JSON lines.

Metrics are per process. Under `datadesk serve --workers N` the supervisor sets
`PROMETHEUS_MULTIPROC_DIR` before the workers start (cli.py), so each worker writes its values
to files there and any worker's `/metrics` answers for all of them (prometheus_client's
multiprocess mode); gauges are then summed over the live workers (`livesum`).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

from prometheus_client import Counter, Gauge, Histogram

# the turn (and its thread) the running code works for: set once in the turn's task, so every
# line logged by it, by the tasks it starts and by the threads it hands work to carries them
TURN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("datadesk_turn_id", default=None)
THREAD_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("datadesk_thread_id", default=None)

# seconds: a turn is a few model steps (seconds to minutes), a tool call milliseconds to minutes
TURN_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60)

TURNS_RUNNING = Gauge("datadesk_turns_running", "Turns running in this process now",
                      multiprocess_mode="livesum")
TURNS_FINISHED = Counter("datadesk_turns_finished", "Turns ended, by outcome (ok, cancelled, or the error kind)",
                         ["outcome"])
TURN_SECONDS = Histogram("datadesk_turn_duration_seconds", "Wall time of a turn, start to done, by outcome",
                         ["outcome"], buckets=TURN_BUCKETS)
TOOL_SECONDS = Histogram("datadesk_tool_duration_seconds", "Wall time of one tool call (with its offload), "
                         "by tool and outcome (ok, error)", ["tool", "outcome"], buckets=TOOL_BUCKETS)
KERNELS = Gauge("datadesk_kernels", "Kernels of this process by state (starting, pooled, idle, busy)",
                ["state"], multiprocess_mode="livesum")
KERNEL_STARTS = Counter("datadesk_kernel_starts", "Kernel starts by outcome (ok, failed)", ["outcome"])
OFFLOAD_ARTIFACTS = Counter("datadesk_offload_artifacts", "Large tool results kept as artifacts, by format",
                            ["format"])
OFFLOAD_BYTES = Counter("datadesk_offload_bytes", "Bytes of the artifacts large tool results were written to",
                        ["format"])
OFFLOAD_ROWS = Counter("datadesk_offload_rows", "Rows of the tables large tool results were written to")
OFFLOAD_FALLBACKS = Counter("datadesk_offload_fallbacks", "Large results not kept, given as the head and a notice, "
                            "by reason (store_down, disk, not_offloadable)", ["reason"])
QUEUE_WAIT = Histogram("datadesk_queue_wait_seconds", "How long work waited in line for a slot, by queue "
                       "(query, upload, offload_writer); only calls that had to wait", ["queue"],
                       buckets=WAIT_BUCKETS)
QUEUE_REFUSED = Counter("datadesk_queue_refused", "Calls refused after waiting in line past the limit, by queue",
                        ["queue"])
HTTP_RESPONSES = Counter("datadesk_http_responses", "HTTP responses by status code (429: a limit refused the "
                         "request)", ["status"])
DB_POOL = Gauge("datadesk_db_pool_connections", "The cluster database pool: connections by state "
                "(size, idle, in_use, max) and requests waiting for one (waiting)", ["state"],
                multiprocess_mode="livesum")


@contextlib.contextmanager
def turn_context(turn_id: str, thread_id: str) -> Iterator[None]:
    """Inside: log lines name `turn_id` and `thread_id` (api/logs.py), in this task and what it starts."""
    t1, t2 = TURN_ID.set(turn_id), THREAD_ID.set(thread_id)
    try:
        yield
    finally:
        TURN_ID.reset(t1)
        THREAD_ID.reset(t2)


@contextlib.contextmanager
def timed_turn() -> Iterator[list[str]]:
    """Counts one turn: running while inside, then finished with the outcome left in the list."""
    outcome = ["internal"]
    started = time.perf_counter()
    TURNS_RUNNING.inc()
    try:
        yield outcome
    finally:
        TURNS_RUNNING.dec()
        TURNS_FINISHED.labels(outcome[0]).inc()
        TURN_SECONDS.labels(outcome[0]).observe(time.perf_counter() - started)


def observe_wait(queue: str, started: float) -> None:
    """A wait in line of `queue` that began at `started` (time.monotonic()) and just ended."""
    QUEUE_WAIT.labels(queue).observe(max(0.0, time.monotonic() - started))
