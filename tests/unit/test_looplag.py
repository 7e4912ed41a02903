"""The event-loop lag monitor (api/looplag.py) and what /api/health reports of it."""

from __future__ import annotations

import asyncio
import os
import time

from datadesk.api.looplag import BUCKETS_MS, LoopLag, quantile


def test_samples_fall_in_their_buckets_and_the_quantile_reads_them():
    lag = LoopLag()
    for ms in [0.2] * 98 + [40.0, 900.0]:
        lag.record(ms)
    assert lag.samples == 100
    assert lag.counts[BUCKETS_MS.index(1)] == 98
    assert lag.counts[BUCKETS_MS.index(50)] == 1
    assert lag.counts[BUCKETS_MS.index(1_000)] == 1
    assert quantile(lag.counts, 0.5) == 1.0
    assert quantile(lag.counts, 0.99) == 50.0
    assert quantile(lag.counts, 1.0) == 1_000.0
    assert quantile([0] * len(lag.counts), 0.99) is None
    assert lag.report()["lag_max_ms_recent"] == 900.0


def test_past_the_largest_bound_counts_in_the_last_bucket():
    lag = LoopLag()
    lag.record(120_000.0)
    assert lag.counts[-1] == 1
    assert lag.report()["lag_ms_p99_recent"] == float(BUCKETS_MS[-1])


def test_the_recent_window_forgets_slots_older_than_a_minute():
    lag = LoopLag()
    t = 1_000.0
    lag.record(500.0, now=t)
    lag.record(1.0, now=t + 61.0)
    # counts since start keep both; the minute's window only the newest slot, when read later
    assert sum(lag.counts) == 2
    recent = [s for s in lag._recent if (t + 61.0) - s[0] < 60.0]
    assert len(recent) == 1 and recent[0][1] == 1.0


def test_a_blocked_loop_is_seen_as_lag():
    async def main() -> dict:
        lag = LoopLag(interval_s=0.01)
        lag.start()
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # the loop held, as heavy work on it would
        await asyncio.sleep(0.05)
        await lag.stop()
        return lag.report()

    report = asyncio.run(main())
    assert report["pid"] == os.getpid()
    assert report["lag_max_ms_recent"] >= 100.0
    over = sum(c for b, c in zip(report["lag_buckets_ms"], report["lag_counts"]) if b is None or b >= 100)
    assert over == 1
    assert len(report["lag_counts"]) == len(report["lag_buckets_ms"])


def test_health_reports_the_loop_and_the_disk(api):
    body = api.client.get("/api/health").json()
    assert body["status"] == "ok"
    assert body["disk"]["free_mb"] > 0
    loop = body["loop"]
    assert loop["pid"] == os.getpid()
    assert loop["lag_buckets_ms"][-1] is None and len(loop["lag_counts"]) == len(loop["lag_buckets_ms"])
    again = api.client.get("/api/health").json()
    assert again["disk"] == body["disk"]


def test_health_never_waits_long_for_a_file_system_that_hangs(tmp_path, monkeypatch):
    from datadesk.store import diskspace

    class Hanging(diskspace.DiskRoom):
        hang = False

        def free_mb(self) -> float:
            if self.hang:
                time.sleep(2.0)
            return 1234.0

    async def main() -> tuple[dict, dict, float]:
        room = Hanging(tmp_path, 10)
        first = await room.recent_status()
        room.hang = True
        t0 = time.perf_counter()
        second = await room.recent_status()
        return first, second, time.perf_counter() - t0

    monkeypatch.setattr(diskspace, "FRESH_S", 0.0)  # every probe measures again
    first, second, waited = asyncio.run(main())
    assert first == {"free_mb": 1234, "min_free_mb": 10, "low": False}
    assert waited < 1.5  # the last figure, marked stale, instead of the hanging call
    assert second["free_mb"] == 1234 and second["stale_s"] >= 0


def test_a_fresh_disk_figure_is_given_at_once_and_measured_again_behind_it(tmp_path, monkeypatch):
    from datadesk.store import diskspace

    monkeypatch.setattr(diskspace, "FRESH_S", 0.2)
    measured: list[float] = []

    class Counting(diskspace.DiskRoom):
        def free_mb(self) -> float:
            measured.append(time.monotonic())
            return 1000.0 + len(measured)

    async def main() -> list[dict]:
        room = Counting(tmp_path, 10)
        got = [await room.recent_status()]  # the first one waits for its measurement
        got.append(await room.recent_status())  # fresh: the same figure, no new measurement
        assert len(measured) == 1
        await asyncio.sleep(0.12)  # past half of FRESH_S: given at once, measured again behind it
        got.append(await room.recent_status())
        await asyncio.sleep(0.05)
        got.append(await room.recent_status())
        await asyncio.sleep(0.25)  # past FRESH_S: this probe waits for a new figure
        got.append(await room.recent_status())
        return got

    got = [g["free_mb"] for g in asyncio.run(main())]
    assert got == [1001, 1001, 1001, 1002, 1003] and len(measured) == 3


def test_a_stalled_loop_is_logged_with_where_its_thread_is(monkeypatch, caplog):
    from datadesk.api import looplag

    monkeypatch.setattr(looplag, "STALL_S", 0.1)
    monkeypatch.setattr(looplag, "STALL_LOG_EVERY_S", 0.0)

    def hold_the_loop_for_a_while() -> None:
        time.sleep(0.4)

    async def main() -> dict:
        lag = LoopLag(interval_s=0.01)
        lag.start()
        await asyncio.sleep(0.05)
        hold_the_loop_for_a_while()
        await asyncio.sleep(0.05)
        await lag.stop()
        return lag.report()

    with caplog.at_level("WARNING", logger="datadesk.api.looplag"):
        report = asyncio.run(main())
    assert report["stalls"] == 1
    logged = [r.getMessage() for r in caplog.records if "has not run" in r.getMessage()]
    assert len(logged) == 1 and "hold_the_loop_for_a_while" in logged[0]
