"""`RateCounter` conformance on both sets (this process's memory; PostgreSQL rows): windows that
open at the first hit and end, costs, separate window lengths, reset, bad inputs, concurrent hits
adding up exactly, and two instances summing when the counter is shared. Then what the counter is
for: with the cluster set, two hosts' login limits and request budgets allow what one would."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from datadesk.api.guards.ratelimit import Limits, SharedBudget
from datadesk.api.guards.security import LoginFailures
from datadesk.settings import ServerSettings
from datadesk.store.interfaces.counters import MemoryCounter, RateCounter
from tests.cluster import sets

pytestmark = pytest.mark.cluster


class Hosts(sets.Hosts):
    """Makes `RateCounter`s of one set; `counter(new_host=True)` is another host (its own pool)."""

    def counter(self, new_host: bool = False) -> RateCounter:
        if self.kind == "embedded":
            return MemoryCounter()
        from datadesk.cluster.counters import build_counters

        return build_counters(self.database("host-b", max_size=8) if new_host else self.db)


hosts = sets.hosts_fixture(Hosts)


@pytest.fixture
def counter(hosts) -> RateCounter:
    return hosts.counter()


def test_both_sets_are_rate_counters(hosts) -> None:
    c = hosts.counter()
    assert isinstance(c, RateCounter) and c.shared is (hosts.kind == "cluster")


def test_hits_count_in_a_window_that_opens_at_the_first_hit(counter) -> None:
    assert counter.count("k", 60) == 0 and counter.resets_in("k", 60) == 0.0
    assert [counter.hit("k", 60) for _ in range(3)] == [1, 2, 3]
    assert counter.hit("k", 60, cost=5) == 8 and counter.count("k", 60) == 8
    assert 58.0 < counter.resets_in("k", 60) <= 60.0
    assert counter.count("other", 60) == 0  # keys are separate
    assert counter.hit("k", 30) == 1 and counter.count("k", 60) == 8  # so are window lengths
    assert counter.count("k", 60) == 8  # reading changes nothing


def test_an_ended_window_counts_nothing_and_the_next_hit_opens_a_new_one(counter) -> None:
    counter.hit("k", 0.3)
    counter.hit("k", 0.3)
    assert counter.count("k", 0.3) == 2
    time.sleep(0.45)
    assert counter.count("k", 0.3) == 0 and counter.resets_in("k", 0.3) == 0.0
    assert counter.hit("k", 0.3) == 1
    assert 0.0 < counter.resets_in("k", 0.3) <= 0.3


def test_reset_forgets_every_window_of_the_key(counter) -> None:
    counter.hit("k", 60)
    counter.hit("k", 5)
    counter.hit("keep", 60)
    counter.reset("k")
    counter.reset("never-hit")
    assert counter.count("k", 60) == 0 and counter.count("k", 5) == 0 and counter.count("keep", 60) == 1
    assert counter.hit("k", 60) == 1


@pytest.mark.parametrize("call, match", [
    (lambda c: c.hit("", 60), "non-empty string"),
    (lambda c: c.hit(None, 60), "non-empty string"),
    (lambda c: c.hit("k", 0), "positive number of seconds"),
    (lambda c: c.hit("k", -1), "positive number of seconds"),
    (lambda c: c.hit("k", float("nan")), "positive number of seconds"),
    (lambda c: c.hit("k", float("inf")), "positive number of seconds"),
    (lambda c: c.hit("k", True), "positive number of seconds"),
    (lambda c: c.hit("k", "60"), "positive number of seconds"),
    (lambda c: c.hit("k", 10 ** 9), "positive number of seconds"),
    (lambda c: c.hit("k", 60, cost=0), "whole number >= 1"),
    (lambda c: c.hit("k", 60, cost=1.5), "whole number >= 1"),
    (lambda c: c.count("k", 0), "positive number of seconds"),
    (lambda c: c.resets_in("", 60), "non-empty string"),
    (lambda c: c.reset(""), "non-empty string"),
], ids=["empty-key", "no-key", "zero-window", "negative-window", "nan-window", "inf-window", "bool-window",
        "str-window", "huge-window", "zero-cost", "fractional-cost", "count-zero-window", "resets-in-empty-key",
        "reset-empty-key"])
def test_bad_inputs_are_refused_naming_what_was_wrong(counter, call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call(counter)
    assert counter.count("k", 60) == 0  # nothing counted


def test_concurrent_hits_add_up_exactly(hosts) -> None:
    counters = [hosts.counter(), hosts.counter(new_host=True)] if hosts.kind == "cluster" else [hosts.counter()]
    start = threading.Barrier(8)
    seen: list[int] = []

    def hammer(c: RateCounter) -> None:
        start.wait()
        seen.extend(c.hit("hot", 60) for _ in range(25))

    threads = [threading.Thread(target=hammer, args=(counters[i % len(counters)],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(seen) == list(range(1, 201))  # every hit saw its own count: no lost update
    assert all(c.count("hot", 60) == 200 for c in counters)


def test_two_instances_sum_when_shared_and_not_otherwise(hosts) -> None:
    a, b = hosts.counter(), hosts.counter(new_host=True)
    a.hit("k", 60)
    b.hit("k", 60, cost=2)
    if a.shared:
        assert a.count("k", 60) == b.count("k", 60) == 3
        b.reset("k")
        assert a.count("k", 60) == 0
    else:  # per process: each worker counts alone, as LoginFailures did in memory
        assert (a.count("k", 60), b.count("k", 60)) == (1, 2)


def test_ended_windows_are_swept(hosts) -> None:
    c = hosts.counter()
    for i in range(50):
        c.hit(f"k{i}", 0.2)
    c.hit("live", 60)
    time.sleep(0.35)
    if hosts.kind == "embedded":
        c.hit("trigger", 60)  # a hit drops ended windows
        assert len(c) == 2
    else:
        assert c.sweep() == 50
        with hosts.db.connection() as conn:
            assert conn.execute("SELECT count(*) AS n FROM rate_counters").fetchone()["n"] == 1
    assert c.count("live", 60) == 1


def test_the_memory_counter_stays_bounded_with_mixed_windows() -> None:
    now = [0.0]
    c = MemoryCounter(clock=lambda: now[0], sweep_at=100)
    c.hit("long", 1_000)  # first in order: shelters the short ones behind it
    for i in range(5_000):
        now[0] = i * 0.01
        c.hit(f"short{i}", 0.05)
    assert len(c) <= 210 and c.count("long", 1_000) == 1


# -- the counter at work: two hosts allow what one would ---------------------------------------
def test_two_hosts_share_the_login_limits(hosts) -> None:
    one = LoginFailures(per_minute=3, per_account=4, trusted_proxies=[], counter=hosts.counter())
    two = LoginFailures(per_minute=3, per_account=4, trusted_proxies=[], counter=hosts.counter(new_host=True))
    one.failed("10.0.0.1")
    two.failed("10.0.0.1")
    one.failed("10.0.0.1")
    if hosts.kind == "cluster":
        for host in (one, two):
            message, wait = host.address_refusal("10.0.0.1")
            assert "from 10.0.0.1" in message and 1 <= wait <= 61
    else:  # each process alone is under its limit: N processes allow N times the attempts
        assert one.address_refusal("10.0.0.1") is None and two.address_refusal("10.0.0.1") is None
    assert one.address_refusal("10.0.0.2") is None
    for i, host in enumerate((one, two, one, two)):  # a guesser spread over addresses and hosts
        host.failed(f"192.0.2.{i}")
        host.failed_account("bob")
    if hosts.kind == "cluster":
        assert two.account_refusal("bob", "192.0.2.0") is not None  # a failing address is refused for bob
    assert two.account_refusal("bob", "198.51.100.7") is None  # the owner's clean address is not
    assert one.account_refusal("alice", "192.0.2.0") is None and one.account_refusal(None, "192.0.2.0") is None


def test_two_hosts_share_one_request_budget(hosts) -> None:
    server = ServerSettings(requests_per_minute_per_user=60, request_burst_per_user=5)
    one, two = Limits(server, hosts.counter()), Limits(server, hosts.counter(new_host=True))

    async def request(limits: Limits, key: str) -> int:
        refused = limits.admit(key, False)
        if refused is None and limits.shared is not None:
            refused = await limits.take_shared(key, False)
        if refused is not None:
            assert refused.setting == "server.requests_per_minute_per_user" and refused.retry_after >= 1
            return refused.status
        limits.release(key, False)
        return 200

    async def run() -> tuple[list[int], list[int]]:
        spread = [await request(limits, "user:alice") for limits in (one, two) * 4]
        return spread, [await request(one, "user:bob")]

    spread, bob = asyncio.run(run())
    if hosts.kind == "cluster":
        assert spread == [200] * 5 + [429] * 3  # the burst of 5 for both hosts together
        assert SharedBudget(hosts.counter(), 60, 5).window_s == 5.0
    else:  # per worker: each host's token bucket has its own burst
        assert spread == [200] * 8
    assert bob == [200] and one.total == two.total == 0  # refused requests are not left in flight


def test_a_failing_shared_counter_admits_requests() -> None:
    class Down:
        shared = True

        def hit(self, key, window_s, cost=1):
            raise ConnectionError("database gone")

    limits = Limits(ServerSettings(request_burst_per_user=1), Down())  # type: ignore[arg-type]

    async def run() -> object:
        assert limits.admit("user:a", False) is None
        return await limits.take_shared("user:a", False)

    assert asyncio.run(run()) is None and limits.total == 1
