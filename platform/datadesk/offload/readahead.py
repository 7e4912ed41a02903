"""Read ahead: a source of record batches read in its own thread while the caller writes.

Offload used to read a batch (DuckDB, a text parser), then write it, then read the next:
the two costs added up (1M x 8 from DuckDB: read 0.11 s + write 0.21 s). `ReadAhead` runs
the source in a producer thread that stays at most `depth` batches ahead of the consumer (a
bounded queue), so the read of batch n+1 overlaps the Parquet encoding of batch n; both
release the GIL for most of their work (DuckDB's Arrow reader, the Parquet writer).

Memory stays bounded by the batch size: at most `depth` batches wait in the queue, plus the
one the producer is building and the one the consumer holds.

The contract is the one of a plain loop over the source:
- batches come out in the source's order, each exactly once;
- an exception raised by the source (a parse error, `SQLCancelled`, a timeout) is raised by
  the consumer's iteration, as it is, after the batches produced before it;
- `check()` (a cancel flag) is called while the consumer waits, so a cancel is noticed even
  when the source is blocked;
- `close()` (or leaving the `with` block) stops the producer: when the source was not read
  to its end, `interrupt()` stops a blocked read (a DuckDB query), the queue is drained and
  the thread is joined (bounded by `join_s`), so the caller may then close the source (its
  connection) without another thread still reading it.
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, Iterable, Iterator, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

DEPTH = 64  # at most this many batches read ahead ...
MAX_BYTES = 16 << 20  # ... and at most this much data (the offload passes one Parquet row group's size)
POLL_S = 0.05  # how often a waiting consumer looks at the cancel flag
JOIN_S = 10.0  # how long close() waits for a producer that ignores the stop


class _End:
    """The source ended normally."""


class _Failed:
    """The source raised `exc`."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _nbytes(item: object) -> int:
    return int(getattr(item, "nbytes", 0) or 0)


class ReadAhead(Generic[T]):
    """Iterate `source` in a producer thread, at most `depth` items and `max_bytes` ahead of
    the consumer (one item always fits, however big)."""

    def __init__(self, source: Iterable[T], depth: int = DEPTH, max_bytes: int = MAX_BYTES,
                 check: Callable[[], None] | None = None, interrupt: Callable[[], None] | None = None,
                 join_s: float = JOIN_S, name: str = "offload-read-ahead") -> None:
        self._source = source
        self._items: collections.deque[tuple[object, int]] = collections.deque()
        self._bytes = 0
        self._depth = max(1, int(depth))
        self._max_bytes = max(0, int(max_bytes))
        self._cond = threading.Condition()
        self._check = check
        self._interrupt = interrupt
        self._join_s = join_s
        self._stop = False
        self._ended = False  # the consumer saw the end (or the source's error)
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
        self._started = False
        self._closed = False

    # -------------------------------------------------------------- consumer side

    def __iter__(self) -> Iterator[T]:
        if self._closed:
            raise ValueError("the read-ahead is closed")
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            item = self._get()
            if isinstance(item, _End):
                self._ended = True
                return
            if isinstance(item, _Failed):
                self._ended = True
                raise item.exc
            yield item  # type: ignore[misc]

    def _get(self) -> object:
        with self._cond:
            while not self._items:
                if not self._thread.is_alive():
                    # Cannot happen (the producer always leaves _End or _Failed); never hang on it.
                    return _Failed(RuntimeError("the read-ahead thread ended without a result"))
                self._cond.wait(POLL_S)
                if not self._items and self._check is not None:
                    self._check()
            item, size = self._items.popleft()
            self._bytes -= size
            self._cond.notify_all()
            return item

    def close(self) -> None:
        """Stop the producer and wait for it; idempotent. Interrupts the source when it was
        not read to its end (an early stop, an error or a cancel on the consumer's side)."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        with self._cond:
            self._stop = True
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
        if not self._ended and self._thread.is_alive() and self._interrupt is not None:
            try:
                self._interrupt()
            except Exception:
                log.exception("interrupting the source of a stopped read-ahead failed")
        self._thread.join(self._join_s)
        with self._cond:
            self._items.clear()
        if self._thread.is_alive():
            log.warning("a read-ahead thread did not stop within %.0f s; it stops at its next batch", self._join_s)

    def __enter__(self) -> "ReadAhead[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- producer side

    def _produce(self) -> None:
        try:
            for item in self._source:
                if not self._put(item, _nbytes(item)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failed(exc), 0, force=True)
            return
        self._put(_End(), 0, force=True)

    def _put(self, item: object, size: int, force: bool = False) -> bool:
        """Queue `item`, waiting while the queue is full; False once the consumer stopped.
        `force`: the end marker always goes in (it holds no data)."""
        with self._cond:
            while not self._stop and not force and self._items and (
                    len(self._items) >= self._depth or self._bytes + size > self._max_bytes):
                self._cond.wait()
            if self._stop:
                return False
            self._items.append((item, size))
            self._bytes += size
            self._cond.notify_all()
            return True


WORKERS = 2  # pieces worked on at once by `ordered_map`
AHEAD = 4  # pieces submitted ahead of the one being handed on


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int = WORKERS, ahead: int = AHEAD,
                name: str = "offload-piece") -> Iterator[tuple[T, R]]:
    """(item, fn(item)) for each item, in order, with up to `workers` items worked on at once
    in threads and at most `ahead` results waiting (memory: that many pieces). For work that
    releases the GIL for much of its time (pyarrow's parsers and casts). Leaving the loop
    early cancels the pieces not started and waits for the running ones."""
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix=name)
    pending: collections.deque[tuple[T, Future]] = collections.deque()
    try:
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) > ahead:
                first, future = pending.popleft()
                yield first, future.result()
        while pending:
            first, future = pending.popleft()
            yield first, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
