"""Two app workers (`datadesk serve --workers 2`, a real subprocess) hammering the same threads
through the real HTTP API, the real OpenAI client against the fake server, the local sandbox
and summaries:

- every turn is accepted (a 200 stream that ends with `done`) or refused with 409;
- every thread's log stays consistent: seqs 1..n, no torn line, each accepted turn's records
  present and contiguous, nothing of a refused turn;
- no summary job runs twice: no record reaches the summarizer twice, coverage only grows;
- the kernel started by one worker is used by the other (a counter in the kernel keeps
  counting across turns), or recreated with the fresh-kernel notice;
- cancel and clear work whichever worker the request lands on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from datadesk.sandbox.kerneltable import KernelTable
from datadesk.store.layout import Layout
from datadesk.store.threadlog import ThreadLog
from datadesk.store.users import UserStore
from tests.conftest import parse_sse, wait_until
from tests.fakes.tool_loop import ToolLoopServer
from tests.serving import serving

ROOT = Path(__file__).resolve().parents[2]
FILLER = " ".join(f"word{i}" for i in range(120))  # long user turns: history leaves a small window


@contextlib.contextmanager
def serve_workers(home: Path, fake: ToolLoopServer, workers: int, toml: str = "",
                  log_name: str = "serve.log") -> Iterator[tuple[str, Path]]:
    """`datadesk serve --workers N` on a free 127.0.0.1 port; stopped by its PID."""
    config = home / "datadesk.toml"
    config.write_text(toml)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}", "DATADESK_HOME": str(home),
           "DATADESK_CONFIG": str(config), "DATADESK_LLM_BASE_URL": fake.base_url,
           "DATADESK_LLM_API_KEY": "sk-test-secret", "DATADESK_LLM_MODEL": "fake-model"}
    log = home.parent / log_name
    with serving(home, env, log, workers, heartbeats=workers) as (base, _):
        yield base, log


def settings_toml(run_dir: str, budget: int = 1_500) -> str:
    return f"""
[chat]
max_turns_per_user = 20
[server]
streams_per_user = 40  # 12 clients of one user stream at once here; the per-user cap is not under test
[sandbox]
backend = "local"
pool_size = 1
run_dir = "{run_dir}"
max_kernels_per_user = 10
max_kernels = 20
memory_mb = 512
heartbeat_s = 1.0
[context]
history_budget_tokens = {budget}
[summary]
refresh_after_records = 4
"""


def post_turn(base: str, token: str, tid: str, text: str) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
    """One message on a fresh connection (so requests spread over the workers)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        r = c.post(f"/api/threads/{tid}/messages", json={"content": text})
        return r.status_code, (parse_sse(r.text) if r.status_code == 200 else [])


def check_log(tdir: Path, accepted: dict[str, str]) -> list[Any]:
    """The thread log is consistent; returns its records."""
    path = tdir / "log.jsonl"
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and not (tdir / "log.torn").exists(), "a torn line"
    records = list(ThreadLog(path))
    assert len(records) == raw.count(b"\n"), "an unreadable line"
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    by_turn: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        by_turn[r.turn_id].append(i)
    assert set(by_turn) == set(accepted), "records of a refused turn, or an accepted turn without records"
    for turn_id, idx in by_turn.items():
        assert idx == list(range(idx[0], idx[-1] + 1)), f"turn {turn_id} is interleaved with another"
        roles = [records[i].role for i in idx]
        if accepted[turn_id] == "ok":
            assert roles == ["user", "assistant", "tool", "assistant"], roles
    return records


def check_kernel_counter(records: list[Any]) -> tuple[int, int]:
    """The counter kept in the thread's kernel goes 1, 2, 3...; it starts again only with the
    fresh-kernel notice. Returns (turns that reused the kernel, fresh kernels after the first)."""
    expected, reused, fresh = 1, 0, 0
    for r in records:
        if r.role != "tool" or r.status != "ok":
            continue
        got = int(re.search(r"count (\d+)", r.content).group(1))
        if "a new Python kernel was started" in r.content:
            assert got == 1, r.content
            fresh += 1
        else:
            assert got == expected, f"the kernel lost its state without a notice: {r.content}"
            reused += got > 1
        expected = got + 1
    return reused, fresh


def test_two_workers_hammering_the_same_threads(home: Path) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], ["code_execution"])
    layout = Layout(home)
    run_dir = tempfile.mkdtemp(prefix="ddw-")
    with ToolLoopServer(delay_s=0.03) as fake, serve_workers(home, fake, 2, settings_toml(run_dir)) as (base, log):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            tids = [c.post("/api/threads", json={"title": f"t{i}"}).json()["id"] for i in range(4)]
        results: dict[str, list[tuple[int, list]]] = defaultdict(list)
        guard = threading.Lock()

        def poster(tid: str, who: int) -> None:
            for n in range(6):
                got = post_turn(base, token, tid, f"turn {tid} from {who} #{n}: {FILLER}")
                with guard:
                    results[tid].append(got)

        threads = [threading.Thread(target=poster, args=(tid, who)) for tid in tids for who in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        # no wait for the last turns' summary jobs: each worker drains them when it stops
        # (Runtime.stop), and every summary check below runs after the workers are gone
        server_log = log.read_text()
    # -- every attempt: accepted (a stream that ends with done) or refused with 409 ----------------
    statuses = [s for tid in tids for s, _ in results[tid]]
    assert len(statuses) == 4 * 3 * 6 and set(statuses) <= {200, 409}, sorted(set(statuses))
    assert statuses.count(409) > 0  # three clients on one thread at once: some were refused
    total_reused = total_fresh = 0
    for tid in tids:
        accepted = {}
        for status, events in results[tid]:
            if status == 200:
                assert events and events[-1][0] == "done", events[-3:]
                accepted[events[-1][1]["turn_id"]] = events[-1][1]["status"]
        assert accepted and set(accepted.values()) == {"ok"}
        records = check_log(layout.thread_dir("demo", "alice", tid), accepted)
        reused, fresh = check_kernel_counter(records)
        total_reused, total_fresh = total_reused + reused, total_fresh + fresh
    assert total_reused > 0
    print(f"\n2 workers, 4 threads x 3 clients x 6 messages: {statuses.count(200)} accepted, "
          f"{statuses.count(409)} refused with 409; {total_reused} turns reused the thread's kernel, "
          f"{total_fresh} fresh kernels after the first; {server_log.count('attached to kernel')} attaches "
          f"across workers; {len(fake.summary_requests)} summary jobs")
    # -- both workers served, and one used the other's kernel ---------------------------------------
    assert "attached to kernel" in server_log, server_log[-3000:]
    # -- no summary job ran twice -------------------------------------------------------------------
    assert fake.summary_requests, "no summary was made (the window should have been exceeded)"
    seen: dict[str, set[int]] = defaultdict(set)
    for req in fake.summary_requests:
        tid = next(t for t in tids if t in req)
        seqs = {int(s) for s in re.findall(r"^\[#(\d+) ", req, flags=re.M)}
        assert seqs and not (seqs & seen[tid]), f"records {sorted(seqs & seen[tid])} of {tid} summarized twice"
        seen[tid] |= seqs
    for tid in tids:
        tdir = layout.thread_dir("demo", "alice", tid)
        revs = [json.loads(x)["covers_through_seq"] for x in (tdir / "summary.revisions.jsonl").read_text().splitlines()] \
            if (tdir / "summary.revisions.jsonl").exists() else []
        current = json.loads((tdir / "summary.json").read_text())["covers_through_seq"] \
            if (tdir / "summary.json").exists() else None
        covers = revs + ([current] if current is not None else [])
        assert covers == sorted(set(covers)), f"summary coverage of {tid} went back or repeated: {covers}"
    # -- the workers stopped cleanly: no kernel, heartbeat or settings file left --------------------
    assert not list(KernelTable(home).kernels())
    assert not list((home / "sandbox" / "workers").glob("*.json"))
    assert not list((home / "run").glob("serve-*.json"))


def test_cancel_and_clear_reach_the_turn_on_either_worker(home: Path) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], ["code_execution"])
    run_dir = tempfile.mkdtemp(prefix="ddw-")
    slow = lambda text: "import time\ntime.sleep(60)"  # noqa: E731  (stopped by cancel/clear)
    with ToolLoopServer(code_for=slow) as fake, serve_workers(home, fake, 2, settings_toml(run_dir)) as (base, _):
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
        for round_ in range(3):
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(post_turn(base, token, tid, f"long {round_}")))
            t.start()
            deadline = time.time() + 60
            while True:  # wait until the turn runs (any worker)
                with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
                    if c.get(f"/api/threads/{tid}").json()["thread"]["running"]:
                        break
                assert time.time() < deadline
                time.sleep(0.1)

            def executing(round_: int = round_) -> bool:  # this round's python call is recorded, its kernel up
                with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
                    records = c.get(f"/api/threads/{tid}").json()["records"]
                return sum(1 for r in records if r.get("tool_calls")) > round_ and \
                    any(k.thread == tid for k in KernelTable(home).kernels())

            wait_until(executing, timeout=60, interval=0.1)
            with httpx.Client(base_url=base, headers=headers, timeout=60) as c:  # a new connection: either worker
                if round_ < 2:
                    answer = c.post(f"/api/threads/{tid}/cancel").json()
                    assert answer["cancelled"] is True
                else:
                    answer = c.post(f"/api/threads/{tid}/clear").json()
                    assert answer["removed"]["kernel"] is True
            t.join(60)
            status, events = got[0]
            assert status == 200 and events[-1][0] == "done" and events[-1][1]["status"] == "cancelled"
        with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
            detail = c.get(f"/api/threads/{tid}").json()
            assert detail["records"] == [] and not detail["thread"]["running"]  # nothing landed after the clear
            c.delete(f"/api/threads/{tid}")
    assert not (home / "locks" / "turns" / f"t-{tid}.lock").exists()


@pytest.mark.docker
def test_docker_kernels_carry_their_owner_and_the_sweep_spares_live_workers(home: Path) -> None:
    """Containers are labelled with their worker; a worker's start-up sweep removes only those
    whose owner is gone, never the kernels of a live worker."""
    import docker

    from datadesk.sandbox.backends.docker.container import DockerSandbox
    from datadesk.settings import SandboxSettings

    _, token = UserStore(Layout(home)).add("alice", ["demo"], ["code_execution"])
    client = docker.from_env()
    sandbox = DockerSandbox(SandboxSettings(backend="docker"), home)
    dead = {**sandbox.labels("kdeadowner"), "datadesk.owner": "w999999-dead00", "datadesk.owner_pid": "999999"}
    orphan = client.containers.run(SandboxSettings().image, ["sleep", "300"], detach=True, labels=dead,
                                   network_mode="none")
    run_dir = tempfile.mkdtemp(prefix="ddw-")
    toml = settings_toml(run_dir).replace('backend = "local"', 'backend = "docker"')
    try:
        with ToolLoopServer() as fake, serve_workers(home, fake, 2, toml) as (base, _):
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
                tid = c.post("/api/threads", json={}).json()["id"]
            status, events = post_turn(base, token, tid, "count")
            assert status == 200 and events[-1][1]["status"] == "ok"
            mine = client.containers.list(filters={"label": f"datadesk.home={sandbox.home_label}"})
            owners = {c.labels["datadesk.owner"] for c in mine}
            live = {p.stem for p in (home / "sandbox" / "workers").glob("*.json")}
            assert len(live) == 2 and owners and owners <= live  # every container names a live worker
            assert all(c.labels["datadesk.owner_pid"] and c.labels["datadesk.owner_host"] for c in mine)
            ids = {c.id for c in client.containers.list(all=True)}
            assert orphan.id not in ids  # the dead owner's container went at start
            # a second sweep (as every reaper round does) leaves the live workers' kernels alone
            assert sandbox.remove_orphans() == 0
            assert {c.id for c in mine} <= {c.id for c in client.containers.list()}
            status, events = post_turn(base, token, tid, "count again")  # the kernel is still there
            assert status == 200 and "count 2" in json.dumps(events)
        left = client.containers.list(all=True, filters={"label": f"datadesk.home={sandbox.home_label}"})
        assert not left  # the workers removed their own containers when they stopped
    finally:
        with contextlib.suppress(Exception):
            orphan.remove(force=True)
