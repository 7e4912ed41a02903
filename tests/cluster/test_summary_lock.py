"""One summarizer per thread across processes and hosts: the summary job takes `summary:<thread>`
from the runtime's `LockService` (embedded: files under <home>/locks/; cluster: advisory locks).
Two services (two processes, or two hosts with their own pools and lock connections), one
thread, both refreshing at once: one job runs the summarizer, the other skips; a synchronous
refresh of the second waits for the first and returns its summary."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from datadesk.domain.records import Record
from datadesk.settings import SummarySettings
from datadesk.store.layout import Layout
from datadesk.summary.model import ThreadSummary
from datadesk.summary.service import SummaryService
from datadesk.summary.store import SummaryStore
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class SlowSummarizer:
    """Counts its calls; each waits for `gate` (so both jobs overlap)."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered: asyncio.Event | None = None
        self.gate: asyncio.Event | None = None

    async def summarize(self, previous: Any, records: Any, epoch: int, focus: str | None = None) -> ThreadSummary:
        self.calls += 1
        assert self.entered is not None and self.gate is not None
        self.entered.set()
        await self.gate.wait()
        return ThreadSummary(goal="g", epoch=epoch, covers_through_seq=max(r.seq for r in records),
                             created=time.time(), model="slow")


class Hosts(sets.Hosts):
    """Two 'hosts' of one set: each a thread store and a lock service of its own."""

    def __init__(self, kind: str, request, tmp_path: Path) -> None:
        super().__init__(kind, request, tmp_path)
        if kind == "embedded":
            from datadesk.store.locks import FileLocks
            from datadesk.store.threads import ThreadStore

            home = tmp_path / "home"
            self.stores = [ThreadStore(Layout(home)) for _ in range(2)]
            self.locks = [FileLocks(home / "locks") for _ in range(2)]
            return
        from datadesk.cluster.locks import PgLocks
        from datadesk.cluster.threads import PgThreadStore

        dbs = [self.database(f"host-{i}", max_size=4) for i in range(2)]
        self.stores = [PgThreadStore(db, Layout(tmp_path / f"home-{i}")) for i, db in enumerate(dbs)]
        self.locks = [self.closing(PgLocks(db)) for db in dbs]


hosts = sets.hosts_fixture(Hosts)


def _services(hosts: Hosts, summarizer: SlowSummarizer) -> list[SummaryService]:
    settings = SummarySettings(timeout_s=30)
    return [SummaryService(SummaryStore(), summarizer, settings, locks=locks) for locks in hosts.locks]  # type: ignore[arg-type]


def _thread_on_both(hosts: Hosts) -> list[Any]:
    first = hosts.stores[0].create("demo", "alice")
    for i in range(6):
        first.append(lambda seq, i=i: Record(seq=seq, role="user" if i % 2 == 0 else "assistant", ts=time.time(),
                                             content=f"message {i}"), epoch=first.epoch)
    return [first, hosts.stores[1].get(first.id, "alice", ["demo"])]


def test_two_services_one_thread_run_one_job(hosts: Hosts) -> None:
    summarizer = SlowSummarizer()
    a, b = _services(hosts, summarizer)
    ta, tb = _thread_on_both(hosts)

    async def main() -> tuple[Any, Any]:
        summarizer.entered, summarizer.gate = asyncio.Event(), asyncio.Event()
        job_a = a.schedule(ta, 6, ta.epoch)
        await asyncio.wait_for(summarizer.entered.wait(), 10)  # A holds summary:<thread>
        result_b = await b.refresh(tb, 6, tb.epoch)  # B, on the other host: skipped at once
        summarizer.gate.set()
        await a.drain()
        return job_a.result(), result_b

    done_a, done_b = asyncio.run(main())
    assert summarizer.calls == 1
    assert done_a is not None and done_a.covers_through_seq == 6
    assert done_b is None
    stored = SummaryStore().load_current(tb, tb.epoch)
    assert stored is not None and stored.covers_through_seq == 6
    assert hosts.locks[1].try_acquire(f"summary:{ta.id}") is not None  # released after the job


def test_a_synchronous_refresh_waits_for_the_other_hosts_job(hosts: Hosts) -> None:
    summarizer = SlowSummarizer()
    a, b = _services(hosts, summarizer)
    ta, tb = _thread_on_both(hosts)

    async def main() -> Any:
        summarizer.entered, summarizer.gate = asyncio.Event(), asyncio.Event()
        job_a = a.schedule(ta, 6, ta.epoch)
        await asyncio.wait_for(summarizer.entered.wait(), 10)
        waiting = asyncio.create_task(b.refresh(tb, 6, tb.epoch, synchronous=True))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # it waits for A's lock instead of summarizing too
        summarizer.gate.set()
        await job_a
        return await asyncio.wait_for(waiting, 10)

    got = asyncio.run(main())
    assert summarizer.calls == 1  # B found A's summary covering what it needed
    assert got is not None and got.covers_through_seq == 6
