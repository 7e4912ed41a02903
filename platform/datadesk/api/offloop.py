"""Heavy per-request work off the event loop, bounded and shared fairly (issue 24).

Listing a user's threads (a meta file and a turn marker per thread), rendering a page of records
(Markdown to sanitized HTML) and rendering a streamed answer are CPU or file work that grows with
the data. On the event loop it would stall every other user's request; in the loop's default
executor a flood of it would take every thread that SQL, uploads and the rest use too.

`run_off_loop(key, fn, *args)` runs `fn` in a worker thread of its own small pool: at most
`THREADS` such jobs run at once in the process, and at most `PER_KEY` of them for one key (a
user): one user's flood queues behind itself, while another user's job gets the next free thread.
A cancelled caller still waits for its job to finish (a thread cannot be stopped), so the bound
holds. The limiters are made per event loop (tests run several loops in one process).
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import Any, Callable, TypeVar

import anyio
import anyio.to_thread

THREADS = 4  # jobs in worker threads at once (all users): file reads overlap, CPU work shares the GIL
PER_KEY = 2  # jobs of one user at once: the rest of their flood waits in their own queue

T = TypeVar("T")


class _Pool:
    """The limiters of one event loop."""

    def __init__(self) -> None:
        self.threads = anyio.CapacityLimiter(THREADS)
        self.keys: dict[str, list[Any]] = {}  # key -> [semaphore, callers using it]


_pools: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool]" = weakref.WeakKeyDictionary()
_strong: dict[int, tuple[asyncio.AbstractEventLoop, _Pool]] = {}  # loops without weak references


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    try:
        pool = _pools.get(loop)
        if pool is None:
            pool = _pools[loop] = _Pool()
        return pool
    except TypeError:  # a loop type that cannot be weakly referenced: held (one per serving process)
        held = _strong.get(id(loop))
        if held is None or held[0] is not loop:
            held = _strong[id(loop)] = (loop, _Pool())
        return held[1]


async def run_off_loop(key: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a worker thread, within the process's and `key`'s share."""
    pool = _pool()
    entry = pool.keys.get(key)
    if entry is None:
        entry = pool.keys[key] = [asyncio.Semaphore(PER_KEY), 0]
    entry[1] += 1
    try:
        async with entry[0]:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=pool.threads)
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            pool.keys.pop(key, None)  # bounded: only keys with work waiting or running are kept
