"""The multi-host test of issue 29 (SCALE.md section 6): three app hosts, each in its own network
namespace with its own tmpfs home and a 0.5-CPU cgroup (BENCH_CPUS while throughput is measured),
behind haproxy, sharing only PostgreSQL, SeaweedFS and Enterprise Gateway (tests/cluster/hostsim.py
builds it once for the module and stops every process by PID, removing the namespaces, in its
`finally`).

One test per "Done when" bullet; each prints its figures as a table and appends them as JSON
lines to $DATADESK_MULTIHOST_REPORT when set ($DATADESK_MULTIHOST_LOGS: a folder that gets the
log of every process of the topology):

1. a turn started via A is re-attached via B (same event ids, A-to-B delay) and cancelled via C;
2. one turn per thread, the per-user turn cap and the kernel caps hold across the hosts;
3. host A lost mid-turn (link down, SIGKILL) at 20 random points: the thread goes on via B,
   followers end, what was committed stays, and A back (restarted, or its partition healed)
   writes nothing into the threads it lost;
4. kernels any host reaches: artifacts by presigned GET, /outputs by presigned PUT, a variable
   set via A read via B;
5. a clear via C during a turn on A removes the thread's rows, objects and kernel;
6. 3 hosts vs 1 host with the fake model: turns per minute, p95 turn latency, and where the
   CPU went (so a figure limited by this machine rather than by the hosts shows as such).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any, Callable

import httpx
import pytest

from datadesk.chat.interrupted import HOST_NOTICE
from datadesk.domain.records import HOST_LOST
from tests.cluster.hostclient import (
    Feed, artifacts, ask_python, cancel, cpu_seconds, cpu_use, kept, kernel_of, ms, new_thread, p95, post_status,
    records, report, started_turn, tool_output, turn,
)
from tests.cluster.hostsim import APP_HOSTS, HOST_CPUS, Topology, topology_problem
from tests.cluster.test_takeover import client
from tests.cluster.test_two_hosts import Cluster
from tests.conftest import parse_sse, wait_until

# the serial lane: its figures (delivery and cancel delays, 3 hosts vs 1 in turns per minute) must
# measure the hosts, not the parallel lane beside them (there it gave 2.31x once instead of 3x)
pytestmark = [pytest.mark.cluster, pytest.mark.serial]

FRESH = "a new Python kernel was started"  # sandbox/sessions.py fresh_kernel_notice
SLOW = "slow:100:0.05"  # 100 pieces, 0.05 s apart (tests/cluster/fake_steps.py)


@pytest.fixture(scope="module")
def topo(demo_warehouse_dir):
    problem = topology_problem()
    if problem:
        if os.environ.get("DATADESK_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"DATADESK_REQUIRE_CLUSTER=1 but {problem}", pytrace=False)
        pytest.skip(problem)
    t = Topology(demo_warehouse_dir, max_turns=3, max_kernels=2)
    left: list[str] = []
    try:
        t.up()
        yield t
    finally:
        keep = os.environ.get("DATADESK_MULTIHOST_LOGS")  # a folder for the logs of every process
        if keep and (t.root / "logs").is_dir():
            shutil.copytree(t.root / "logs", keep, dirs_exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copy(t.root / "eg" / "enterprise-gateway.log", keep)
        left = t.down()
    assert not left, f"the topology left behind: {left}"


# --------------------------------------------------------------------------- 1 topology


def test_hosts_share_no_files_and_each_is_capped(topo) -> None:
    """Item 1: every host has the same home path, each its own tmpfs (a file written in A's
    home is in neither B's nor C's nor the root's view), its own host name and cpu cap."""
    a = topo.hosts["a"]
    probe = f"probe-{os.getpid()}"
    a.sh(f'echo from-a > "$H/{probe}"')
    assert a.sh(f'cat "$H/{probe}"').strip() == "from-a"
    for name in ("b", "c"):
        assert topo.hosts[name].sh(f'test -e "$H/{probe}" && echo yes || echo no').strip() == "no"
        assert "tmpfs" in topo.hosts[name].sh('grep " $H " /proc/self/mounts')
    assert not (topo.home / probe).exists()  # the root namespace sees the bare mount point
    a.sh(f'rm "$H/{probe}"')
    for host in topo.hosts.values():
        assert host.pid in host.cap.procs(), (host.name, host.cap.procs())
    names = {subprocess.run(["nsenter", "-t", str(h.pid), "-u", "hostname"], capture_output=True,
                            text=True).stdout.strip() for h in topo.hosts.values()}
    assert len(names) == 3, names
    report("topology", {"hosts": ", ".join(sorted(names)), "cpu cap per host": f"{HOST_CPUS} CPU",
                        "subnet": topo.net.subnet + ".0/24", "ports": topo.ports})


# --------------------------------------------------------------------------- 2 re-attach, cancel


def test_a_turn_started_via_a_is_reattached_via_b_and_cancelled_via_c(topo) -> None:
    """Items 2-3: B's stream has A's event ids from `<turn>:1` to `done`; A's delivery to B's
    (the events B got live) p95 <= 0.5 s; a cancel via C ends the turn on A within 1 s (p95 of
    20), the log shows each cancelled step and the next turn succeeds."""
    a, b, c = (topo.base(n) for n in APP_HOSTS)
    token = Cluster(topo.root, topo.local_env).add_user("follow")  # the CLI's path, once
    tid = new_thread(a, token)
    delays: list[float] = []
    cancels: list[float] = []
    for _ in range(20):
        started = started_turn(a, token, tid, SLOW, events=4)
        follow = Feed(b, token, "GET", f"/api/threads/{tid}/events")
        follow.start()
        wait_until(lambda: len(follow.got) >= 1, timeout=30)
        attached = follow.got[0][3]
        now = len(started.got)
        wait_until(lambda: len(started.got) >= now + 8, timeout=30)  # some of the turn reaches B live
        t0 = time.monotonic()
        cancel(c, token, tid)
        wait_until(started.ended, timeout=30)
        wait_until(follow.ended, timeout=30)
        cancels.append(started.when("done") - t0)
        assert started.got[-1][2]["status"] == "cancelled", started.got[-3:]
        ids = started.ids()
        assert ids[0].endswith(":1") and follow.ids() == ids, (ids[:3], follow.ids()[:3], len(ids), len(follow.ids()))
        at_a = {i: t for i, _, _, t in started.got if i}
        delays += [t - at_a[i] for i, _, _, t in follow.got if i and at_a[i] > attached]
    recs = records(c, token, tid)
    assert sum(1 for r in recs if r["role"] == "assistant" and r.get("status") == "cancelled") == 20, kept(recs)[-4:]
    events = turn(b, token, tid, "hello after the cancels")
    assert events[-1][1]["status"] == "ok", events[-3:]
    report("1 re-attach via B, cancel via C", {
        "turns": 20, "live events compared": len(delays),
        "A->B delivery p50 ms": ms(statistics.median(delays)), "A->B delivery p95 ms": ms(p95(delays)),
        "A->B delivery max ms": ms(max(delays)), "cancel via C p50 ms": ms(statistics.median(cancels)),
        "cancel via C p95 ms": ms(p95(cancels)), "cancel via C max ms": ms(max(cancels))})
    assert len(delays) >= 100, len(delays)
    assert p95(delays) <= 0.5, sorted(delays)[-10:]
    assert p95(cancels) <= 1.0, sorted(cancels)


# --------------------------------------------------------------------------- 3 caps


def turn_caps(topo: Topology) -> None:
    """409 for a second turn on a thread via B; 50 concurrent turns of one user over the three
    hosts: exactly `chat.max_turns_per_user` start, the rest get 429."""
    a, b, c = (topo.base(n) for n in APP_HOSTS)
    token = topo.add_user("caps409", code=False)
    tid = new_thread(a, token)
    running = started_turn(a, token, tid, SLOW, events=3)
    with client(b, token) as cb:
        second = cb.post(f"/api/threads/{tid}/messages", json={"content": "again"})
    assert second.status_code == 409, (second.status_code, second.text)
    cancel(c, token, tid)
    wait_until(running.ended, timeout=30)
    token = topo.add_user("caps429", code=False)
    bases = [topo.base(APP_HOSTS[i % 3]) for i in range(50)]
    tids = [new_thread(base, token) for base in bases]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(50) as pool:
        got = list(pool.map(lambda i: post_status(bases[i], token, tids[i], "slow:100:0.1"), range(50)))
    fired_s = time.monotonic() - t0
    accepted = [tids[i] for i, (status, _) in enumerate(got) if status == 200]
    for tid in accepted:
        cancel(c, token, tid)
    statuses = sorted(status for status, _ in got)
    report("2a turn caps", {"409 via B": second.status_code, "50 tries: started": len(accepted),
                            "50 tries: 429": statuses.count(429), "50 tries took s": round(fired_s, 2)})
    assert fired_s < 9, f"the 50 tries took {fired_s:.1f} s: the first turns (10 s) may have ended meanwhile"
    assert len(accepted) == topo.limits["turns"], statuses
    assert statuses.count(429) == 50 - len(accepted), got


def kernel_caps(topo: Topology) -> None:
    """50 python calls of one user from three hosts at once (three turns at a time, each via
    another host, over four threads): never more than `sandbox.max_kernels_per_user` kernels,
    counted in the kernel table and as kernel processes on the gateway."""
    import queue

    token = topo.add_user("kcaps")
    threads: queue.Queue = queue.Queue()
    for _ in range(4):
        threads.put(new_thread(topo.base("a"), token))
    baseline = set(topo.kernel_pids())
    cap = topo.limits["kernels"]
    most = {"table": 0, "kernels": 0}
    over: list[dict] = []  # the samples that found more kernel processes than the cap
    stop = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        while not stop.is_set():
            rows = topo.sql("SELECT record->>'remote' AS remote FROM kernels "
                            "WHERE user_id = 'kcaps' AND kernel_id IS NOT NULL")
            mine = sorted({kernel_of(p) for p in topo.kernel_pids() if p not in baseline})  # a fork: one kernel
            if len(mine) > cap:  # a process past the cap: is it a kernel the gateway still has?
                known = [k for k in mine if httpx.get(f"{topo.gateway}/api/kernels/{k}", timeout=10,
                                                      headers=topo.gateway_headers).status_code == 200]
                over.append({"s": round(time.monotonic() - t0, 2), "processes": len(mine), "gateway has": known,
                             "table has": [r["remote"] for r in rows]})
                mine = known
            most["table"] = max(most["table"], len(rows))
            most["kernels"] = max(most["kernels"], len(mine))
            time.sleep(0.05)

    def worker(w: int) -> list[str]:
        outcomes = []
        for k in range(w, 50, 3):
            tid = threads.get()
            try:
                host = topo.base(APP_HOSTS[(w + k) % 3])
                events = turn(host, token, tid, f"py:import time; time.sleep(0.2); print('try', {k})")
                out = tool_output(records(host, token, tid))
                outcomes.append("ok" if f"try {k}" in out else out[:160])
                assert events[-1][1]["status"] == "ok", events[-2:]
            finally:
                threads.put(tid)
        return outcomes

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with cf.ThreadPoolExecutor(3) as pool:
            outcomes = [o for part in pool.map(worker, range(3)) for o in part]
    finally:
        stop.set()
        watcher.join(5)
    refused = [o for o in outcomes if o != "ok"]
    figures = {"kernel tries": len(outcomes), "ran": len(outcomes) - len(refused), "refused": len(refused),
               "most kernels (table)": most["table"], "most kernels (gateway)": most["kernels"],
               "samples past the cap (gateway asked)": len(over), "cap": cap,
               "kernel tries took s": round(time.monotonic() - t0, 1)}
    report("2b kernel caps", figures)
    assert len(outcomes) == 50 and most["table"] <= cap and most["kernels"] <= cap, (figures, over[:5])
    assert len(refused) < 50 and all(f"limit {cap}" in o for o in refused), refused[:3]


def test_one_turn_per_thread_and_the_caps_hold_across_hosts(topo) -> None:
    """Items 4 and 11."""
    turn_caps(topo)
    kernel_caps(topo)


# --------------------------------------------------------------------------- 4 a host lost

# five losses of host A: four killed (link down, then SIGKILL; then restarted), one partition
# that heals (link down; link up after the takeover): 23 turns cut at random points in all
LOSSES = (("kill", 5), ("kill", 5), ("kill", 5), ("kill", 5), ("partition", 3))
STORY = "sqlslow:300:0.1"  # a SQL step, then 30 s of answer


def written(topo: Topology, tids: list[str]) -> dict[str, Any]:
    """Every row of these threads (what a host that lost them must not add to)."""
    out = {}
    for tid in tids:
        out[tid] = (topo.sql("SELECT seq, md5(body) AS h FROM records WHERE thread_id = %s ORDER BY seq", (tid,)),
                    topo.sql("SELECT turn_id, n, type FROM turn_events WHERE thread_id = %s ORDER BY turn_id, n",
                             (tid,)),
                    topo.sql("SELECT id, status FROM artifacts WHERE thread_id = %s ORDER BY id", (tid,)),
                    topo.sql("SELECT turn_id, fence, state, owner FROM turns WHERE thread_id = %s", (tid,)))
    return out


def cut_turns(topo: Topology, tokens: list[str], rng: random.Random) -> tuple[list, float]:
    """Turns on A (each followed via B) cut at random points; returns [(token, tid, A's stream,
    B's follower, seconds from the turn's POST to the cut)] and the moment A's link went down."""
    a, b = topo.base("a"), topo.base("b")
    tids = [new_thread(a, token) for token in tokens]
    offsets = sorted((rng.uniform(0.3, 6.5) for _ in tokens), reverse=True)
    loss_at = time.monotonic() + offsets[0] + 0.1
    cut = []
    for token, tid, offset in zip(tokens, tids, offsets):
        time.sleep(max(0.0, loss_at - offset - time.monotonic()))
        started = Feed(a, token, "POST", f"/api/threads/{tid}/messages", {"content": STORY})
        started.start()
        cut.append((token, tid, started, time.monotonic()))
    followers = []
    for token, tid, started, _ in cut:
        while not started.got and time.monotonic() < loss_at - 0.05:  # attached before the loss if it can be
            time.sleep(0.02)
        follower = Feed(b, token, "GET", f"/api/threads/{tid}/events")
        follower.start()
        followers.append(follower)
    time.sleep(max(0.0, loss_at - time.monotonic()))
    topo.net.link("a", False)
    lost_at = time.monotonic()
    return [(*c[:3], f, lost_at - c[3]) for c, f in zip(cut, followers)], lost_at


def takes_a_turn(base: str, token: str, tid: str, since: float, within: float) -> float:
    """Seconds from `since` until the thread takes a turn via `base` (409 while A still holds it)."""
    while True:
        with client(base, token) as c:
            r = c.post(f"/api/threads/{tid}/messages", json={"content": "after the loss"})
        if r.status_code == 200:
            took = time.monotonic() - since
            events = parse_sse(r.text)
            assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events[-3:]
            return took
        assert r.status_code == 409, (r.status_code, r.text[:300])
        assert time.monotonic() - since < within + 5, f"thread {tid} still refuses turns via B"
        time.sleep(0.25)


def check_thread(before: list[tuple], after: list[dict[str, Any]], follower: Feed) -> None:
    """What was committed before the loss is all there, seqs contiguous, nothing twice; the cut
    turn ends host_lost; the follower got `error` + `done`."""
    seqs = [r["seq"] for r in after]
    assert seqs == list(range(1, len(after) + 1)), seqs
    assert kept(after)[: len(before)] == before, (before, kept(after))
    lost = [r for r in after[len(before):] if (r.get("meta") or {}).get("kind") == HOST_LOST]
    assert lost, [(r["seq"], r["role"], r.get("meta")) for r in after]
    ends = [r for r in lost if (r.get("meta") or {}).get("error") == HOST_NOTICE]
    assert len(ends) == 1, [(r["seq"], r["role"], r.get("meta")) for r in after]  # finished once, by one host
    assert after[-1]["role"] == "assistant" and after[-1]["content"] == "ok: after the loss", kept(after)[-2:]
    wait_until(follower.ended, timeout=10)
    events = [(e, d) for _, e, d, _ in follower.got]
    errors = [d for e, d in events if e == "error"]
    assert errors and errors[-1].get("kind") == HOST_LOST and events[-1][0] == "done", events[-4:]


def phase(events: list[str]) -> str:
    """Where a turn was when it was cut, by what its stream had shown."""
    if "tool.finished" in events:
        return "answer streaming"
    if "tool.started" in events:
        return "in the SQL call"
    return "first model step" if events else "no event yet"


def one_loss(topo: Topology, kind: str, tokens: list[str], rng: random.Random) -> dict[str, list[float]]:
    b = topo.base("b")
    cut, lost_at = cut_turns(topo, tokens, rng)
    phases = [phase(started.events()) for _, _, started, _, _ in cut]
    before = {tid: kept(records(b, token, tid)) for token, tid, *_ in cut}
    if kind == "kill":
        topo.hosts["a"].kill()
    with cf.ThreadPoolExecutor(len(cut)) as pool:
        took = list(pool.map(lambda c: takes_a_turn(b, c[0], c[1], lost_at, 15), cut))
    ended = []
    for token, tid, started, follower, _ in cut:
        check_thread(before[tid], records(b, token, tid), follower)
        ended.append(follower.when("done") - lost_at)
    tids = [tid for _, tid, *_ in cut]
    then = written(topo, tids)
    if kind == "kill":  # A comes back: its link up, a fresh process on a fresh home
        for *_, started, _, _ in cut:
            started.abandon()
        topo.restart("a")
        time.sleep(3)
    else:  # the partition heals: A, which ran on, finds its turns taken
        topo.net.link("a", True)
        for *_, started, _, _ in cut:
            wait_until(started.ended, timeout=30)
        time.sleep(3)
    now = written(topo, tids)
    changed = [{"thread": t, "then": then[t], "now": now[t]} for t in tids if now[t] != then[t]]
    return {"takeover": took, "follower end": ended, "points": [o for *_, o in cut], "phases": phases,
            "changed": changed}


def test_a_lost_host_costs_its_turns_never_the_thread(topo) -> None:
    """Items 5-6 (see LOSSES)."""
    rng = random.Random(29)
    tokens = [topo.add_user(f"lost{i}", code=False) for i in range(5)]
    took: list[float] = []
    ended: list[float] = []
    points: list[float] = []
    phases: list[str] = []
    changed: list[dict] = []
    for kind, n in LOSSES:
        got = one_loss(topo, kind, tokens[:n], rng)
        took += got["takeover"]
        ended += got["follower end"]
        points += got["points"]
        phases += got["phases"]
        changed += got["changed"]
    report("3 host A lost mid-turn", {
        "points (turns cut)": len(took), "losses": ", ".join(k for k, _ in LOSSES),
        "cut at s after the turn's POST": f"{min(points):.2f} .. {max(points):.2f}",
        "where the turns were cut": {p: phases.count(p) for p in sorted(set(phases))},
        "takeover via B p50 s": round(statistics.median(took), 2), "takeover via B max s": round(max(took), 2),
        "followers ended p50 s": round(statistics.median(ended), 2), "followers ended max s": round(max(ended), 2),
        "threads A wrote into after losing them": len(changed)})
    assert len(took) >= 20 and max(took) <= 15, sorted(took)
    assert not changed, f"host A, back, wrote into threads it had lost: {changed[:2]}"


# --------------------------------------------------------------------------- 5 kernels


def object_sha256(topo: Topology, aid: str) -> str:
    """The sha256 of an artifact's object in the bucket (its key from the artifacts table)."""
    key = topo.sql("SELECT data_key FROM artifacts WHERE id = %s", (aid,))[0]["data_key"]
    prefix = topo.bucket.prefix + "/"
    body = topo.weed.client().get_object(Bucket=topo.bucket.bucket,
                                          Key=key if key.startswith(prefix) else prefix + key)["Body"].read()
    return hashlib.sha256(body).hexdigest()


def test_kernels_any_host_reaches(topo) -> None:
    """Items 7-9: an artifact offloaded on A is read by python on a kernel started via B after
    A's home is wiped (the same rows and sha256); a file the kernel writes to /outputs downloads
    byte-equal via C; `x = 41` via A, then `x + 1` via B: 42, no fresh-kernel notice."""
    a, b, c = (topo.base(n) for n in APP_HOSTS)
    token = topo.add_user("kern")
    tid = new_thread(a, token)
    turn(a, token, tid, "offload")
    (art,) = artifacts(a, token, tid)
    sha = object_sha256(topo, art["id"])
    topo.hosts["a"].sh('find "$H" -mindepth 1 -delete')
    assert topo.hosts["a"].sh('ls -A "$H"').strip() == ""
    payload = bytes(range(256)) * 4096
    t0 = time.monotonic()
    out = ask_python(b, token, tid, (
        "import hashlib, pyarrow.parquet as pq\n"
        f"p = '/data/{art['id']}.parquet'\n"
        "print('ROWS', pq.read_table(p).num_rows, 'SHA', hashlib.sha256(open(p, 'rb').read()).hexdigest())\n"
        "open('/outputs/multihost.bin', 'wb').write(bytes(range(256)) * 4096)"))
    first_call_s = time.monotonic() - t0
    assert f"ROWS 1000 SHA {sha}" in out, out
    made = [x for x in artifacts(c, token, tid) if "multihost" in json.dumps(x)]
    assert made, artifacts(c, token, tid)
    with client(c, token) as cc:
        got = cc.get(f"/api/artifacts/{made[0]['id']}/download")
    assert got.status_code == 200 and got.content == payload, (got.status_code, len(got.content))
    topo.restart("a")  # A back on a fresh home (the wiped one cannot serve the workspace)
    set_out = ask_python(a, token, tid, "x = 41")
    t0 = time.monotonic()
    read_out = ask_python(b, token, tid, "print(x + 1)")
    attach_s = time.monotonic() - t0
    report("4 kernels across hosts", {
        "artifact sha256 (object = kernel's /data)": sha[:16] + "...", "first call via B s": round(first_call_s, 2),
        "/outputs bytes downloaded via C": len(got.content), "x + 1 via B": read_out.strip()[-40:],
        "attached call via B s": round(attach_s, 2)})
    assert FRESH not in set_out and FRESH not in read_out, (set_out, read_out)
    assert "42" in read_out, read_out


# --------------------------------------------------------------------------- 6 clear


def test_clear_via_c_during_a_turn_on_a(topo) -> None:
    """Item 10: the turn is cancelled; the thread's records and rows, its object prefix and its
    kernel are gone within 30 s."""
    from datadesk.store.interfaces.blobs import thread_prefix

    a, c = topo.base("a"), topo.base("c")
    token = topo.add_user("clearer")
    tid = new_thread(a, token)
    turn(a, token, tid, "offload")
    out = ask_python(a, token, tid, "from ipykernel import get_connection_file; print(get_connection_file())")
    found = re.search(r"kernel-([0-9a-f-]{36})\.json", out)
    assert found, out
    kernel = f"{topo.gateway}/api/kernels/{found.group(1)}"
    assert httpx.get(kernel, headers=topo.gateway_headers, timeout=10).status_code == 200
    prefix = f"{topo.bucket.prefix}/{thread_prefix('demo', 'clearer', tid)}"
    s3 = topo.weed.client()

    def objects() -> list[str]:
        got = s3.list_objects_v2(Bucket=topo.bucket.bucket, Prefix=prefix)
        return [o["Key"] for o in got.get("Contents", [])]

    assert objects(), prefix
    running = started_turn(a, token, tid, SLOW, events=3)
    t0 = time.monotonic()
    with client(c, token) as cc:
        r = cc.post(f"/api/threads/{tid}/clear")
    assert r.status_code == 200, r.text
    took: dict[str, float] = {"clear answered": time.monotonic() - t0}
    checks: dict[str, Callable[[], bool]] = {
        "turn ended": running.ended,
        "records gone": lambda: not records(c, token, tid)
        and not topo.sql("SELECT 1 FROM records WHERE thread_id = %s", (tid,)),
        "artifact rows gone": lambda: not topo.sql("SELECT 1 FROM artifacts WHERE thread_id = %s AND live", (tid,)),
        "object prefix empty": lambda: not objects(),
        "kernel stopped": lambda: httpx.get(kernel, headers=topo.gateway_headers, timeout=10).status_code == 404}
    deadline = t0 + 30
    while checks and time.monotonic() < deadline:
        for name, check in list(checks.items()):
            if check():
                took[name] = time.monotonic() - t0
                del checks[name]
        time.sleep(0.1)
    report("5 clear via C during a turn on A", {f"{k} s": round(v, 2) for k, v in took.items()}
           | {f"{k}": "NOT within 30 s" for k in checks})
    assert not checks, f"not within 30 s: {sorted(checks)}"
    assert running.got[-1][2]["status"] == "cancelled", running.got[-3:]


# --------------------------------------------------------------------------- 7 throughput

USERS = 30
WARM_S = 5.0  # turns finished before this are not counted (connections, caches, the first turns)
WINDOW_S = 25.0
# The hosts' cap while throughput is measured. At HOST_CPUS (0.5) three busy hosts take 1.5 of
# this machine's 2 CPUs and PostgreSQL, SeaweedFS, haproxy, the fake model and the clients need
# about 0.03 CPU-seconds per turn more (~0.55 CPU at the 3-host rate): the machine, not the
# hosts, would then be the bottleneck and the figure would measure its two cores. With this cap
# the hosts stay the bottleneck; the report shows each part's CPU use to prove it.
BENCH_CPUS = 0.35


def even_threads(topo: Topology, tokens: list[str]) -> list[str]:
    """A thread for each user such that the balancer sends the same number to each host.

    haproxy hashes the thread's path (consistent hashing), so 30 random thread ids land unevenly
    (10/16/4 was seen): the busiest host then bounds the throughput and the figure measures the
    hash's luck, not what a host adds. Each user's threads are made until one lands on a host
    that still has room; the header haproxy adds (hostsim.py) names the host."""
    per_host = -(-len(tokens) // len(topo.hosts))
    room = {name: per_host for name in topo.hosts}
    tids: list[str] = []
    for token in tokens:
        for _ in range(40):
            tid = new_thread(topo.base("lb"), token)
            with client(topo.base("lb"), token) as c:
                host = c.get(f"/api/threads/{tid}").headers.get("x-served-by")
            if room.get(host, 0) > 0:
                room[host] -= 1
                tids.append(tid)
                break
        else:
            raise AssertionError(f"no thread of 40 landed on a host with room: {room}")
    return tids


def load(topo: Topology, base: str, tokens: list[str], tids: list[str] | None = None) -> dict[str, Any]:
    """USERS users, each with a thread of their own (`tids`, or new ones), posting `bench` turns
    back to back through `base` for WARM_S + WINDOW_S; the turns that finished in the window,
    per minute, their latency, and the CPUs each part of the topology used meanwhile."""
    tids = tids or [new_thread(base, token) for token in tokens]
    roots = {h.pid: f"host {n}" for n, h in topo.hosts.items()} | {os.getpid(): "clients (this test)"}
    roots |= {topo.pg.pid: "postgres", topo.weed.pid: "seaweedfs", topo.eg.proc.pid: "gateway"}
    roots |= {p.pid: name for name, p in topo.procs.started if name in ("haproxy", "fake-model")}
    start = time.monotonic()
    counted_from, end = start + WARM_S, start + WARM_S + WINDOW_S
    done: list[tuple[float, float]] = []
    failed: list[str] = []
    cpu: dict[str, dict[str, float]] = {}

    def user(i: int) -> None:
        with client(base, tokens[i]) as c:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    r = c.post(f"/api/threads/{tids[i]}/messages", json={"content": "bench"}, timeout=300)
                except httpx.HTTPError as exc:
                    failed.append(repr(exc))
                    return
                if r.status_code != 200 or '"status":"ok"' not in r.text[-200:]:
                    failed.append(f"{r.status_code} {r.text[-200:]}")
                    return
                done.append((time.monotonic(), time.monotonic() - t0))

    def sample() -> None:
        time.sleep(max(0.0, counted_from - time.monotonic()))
        cpu["from"] = cpu_seconds(roots)
        time.sleep(max(0.0, end - time.monotonic()))
        cpu["to"] = cpu_seconds(roots)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with cf.ThreadPoolExecutor(USERS) as pool:
        list(pool.map(user, range(USERS)))
    sampler.join(10)
    lat = [d for t, d in done if counted_from <= t - d and t <= end]  # started and finished in the window
    rate = sum(1 for t, _ in done if counted_from <= t <= end) / WINDOW_S * 60
    assert not failed, failed[:3]
    assert len(lat) >= 10, done
    owners = topo.sql("SELECT split_part(owner, ':', 1) AS host, count(*) AS n FROM turns WHERE thread_id = ANY(%s) "
                      "GROUP BY 1 ORDER BY 1", (tids,))
    return {"turns/min": round(rate, 1), "p50 s": round(statistics.median(lat), 2), "p95 s": round(p95(lat), 2),
            "CPUs": cpu_use(cpu["from"], cpu["to"], WINDOW_S), "threads per host": {r["host"]: r["n"] for r in owners}}


def test_three_hosts_give_more_turns_per_minute(topo) -> None:
    """Throughput: the fake model with a fixed delay per step, 3 steps per turn (one offloaded
    SQL result, a small SQL result, the answer), USERS concurrent users for a fixed time: 3
    hosts through haproxy, the users' threads spread evenly (`even_threads`), vs host A alone
    (haproxy in front of A only); see BENCH_CPUS."""
    tokens = [topo.add_user(f"load{i}") for i in range(USERS)]
    probe = new_thread(topo.base("lb"), tokens[0])
    turn(topo.base("lb"), tokens[0], probe, "bench")
    assert artifacts(topo.base("lb"), tokens[0], probe), "the bench turn offloads nothing"
    for host in topo.hosts.values():
        host.cap.set(BENCH_CPUS)
    try:
        one = load(topo, topo.base("lb-a"), tokens)
        three = load(topo, topo.base("lb"), tokens, even_threads(topo, tokens))
    finally:
        for host in topo.hosts.values():
            host.cap.set(HOST_CPUS)
    speedup = three["turns/min"] / one["turns/min"]
    slower = three["p95 s"] / one["p95 s"]
    report("6 throughput, 3 hosts vs 1", {
        "users": USERS, "step delay s": topo.step_delay, "bench rows offloaded": topo.bench_rows,
        "host cap CPUs": BENCH_CPUS, "window s": WINDOW_S,
        "1 host turns/min": one["turns/min"], "3 hosts turns/min": three["turns/min"],
        "speed-up (>= 2.4)": round(speedup, 2), "1 host p95 s": one["p95 s"], "3 hosts p95 s": three["p95 s"],
        "p95 latency 3/1 (<= 1.2)": round(slower, 2), "3 hosts: threads per host": three["threads per host"],
        "1 host CPUs used": one["CPUs"],
        "3 hosts CPUs used": three["CPUs"]})
    assert speedup >= 2.4, (one, three)
    assert slower <= 1.2, (one, three)
