"""A dead host costs its running turns, never the thread (issue 29 item 1), with two real
`datadesk serve` processes (separate homes, one database and bucket, a fake model):

- host A SIGKILLed mid-turn (its whole process group) while a client follows the turn via B:
  the follower gets `error` (host_lost) + `done` within 15 s, every record committed before
  is there with contiguous seqs, the answer so far is recorded as host_lost, and a new turn
  via B succeeds;
- host A hung (SIGSTOP) mid-turn: its lease runs out, B takes the turn over (the follower
  ends), and A, continued after the takeover, writes no record and no event into the thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import msgspec
import pytest

from datadesk.chat.interrupted import HOST_NOTICE
from datadesk.domain.records import HOST_LOST
from tests.conftest import free_port, parse_sse, wait_until
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT 5"
STORY = " ".join(f"word{i}" for i in range(400))  # 400 pieces, 0.05 s apart: 20 s
TOML = "[chat]\nmax_turns_per_user = 4\n[sandbox]\nbackend = \"none\"\n[summary]\nenabled = false\n"


def respond(req: dict[str, Any]) -> FakeReply:
    """'story': a SQL call first, then (after its result) the story streamed slowly; else short."""
    messages = req.get("messages") or []
    last = messages[-1] if messages else {}
    user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    if "story" in user and last.get("role") == "user":
        return FakeReply(text="Looking. ", tool_calls=[{"name": "sql_query", "arguments": {"sql": SQL}}])
    if "story" in user and last.get("role") == "tool":
        return FakeReply(text=STORY, chunks=400, delay_s=0.05)
    return FakeReply(text=f"Fine: {user}", chunks=2)


@contextlib.contextmanager
def host(home: Path, env: dict[str, str], log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`datadesk serve` in its own process group (so the whole host can be killed or stopped)."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=home.parent, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def hosts(tmp_path, cluster_db_url, s3):
    with FakeOpenAIServer() as fake, contextlib.ExitStack() as stack:
        fake.responder = respond
        env = {**os.environ, **s3.env(), "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
               "DATADESK_CLUSTER_DATABASE_URL": cluster_db_url, "DATADESK_SECRET_KEY": "test-secret-" + "x" * 32,
               "DATADESK_LLM_BASE_URL": fake.base_url, "DATADESK_LLM_API_KEY": "sk-test",
               "DATADESK_LLM_MODEL": "fake-model", "PYTHONUNBUFFERED": "1"}
        out = {"env": env, "root": tmp_path}
        for name in ("a", "b"):
            home = tmp_path / f"home-{name}"
            home.mkdir()
            (home / "datadesk.toml").write_text(TOML)
            host_env = {**env, "DATADESK_HOME": str(home), "DATADESK_CONFIG": str(home / "datadesk.toml")}
            out[name] = stack.enter_context(host(home, host_env, tmp_path / f"serve-{name}.log"))
        yield out


def add_user(hosts: dict[str, Any], name: str) -> str:
    env = {**hosts["env"], "DATADESK_HOME": str(hosts["root"] / "cli-home")}
    out = subprocess.run([sys.executable, "-m", "datadesk.cli", "users", "add", name, "--workspace", "demo"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return next(line.split(": ", 1)[1].strip() for line in out.stdout.splitlines() if "API token" in line)


def client(base: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)


class Stream(threading.Thread):
    """An SSE stream read in the background: (event, data, monotonic time) as they come."""

    def __init__(self, base: str, token: str, method: str, path: str, body: Any = None) -> None:
        super().__init__(daemon=True)
        self.args = (base, token, method, path, body)
        self.got: list[tuple[str, dict[str, Any], float]] = []
        self.status: int | None = None

    def run(self) -> None:
        base, token, method, path, body = self.args
        with contextlib.suppress(httpx.HTTPError), client(base, token) as c, \
                c.stream(method, path, json=body, timeout=httpx.Timeout(120, read=120)) as resp:
            self.status = resp.status_code
            ev = "message"
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:"):
                    self.got.append((ev, msgspec.json.decode(line[5:].strip()), time.monotonic()))
                    ev = "message"

    def count(self, event: str) -> int:
        return sum(1 for e, _, _ in list(self.got) if e == event)

    def ended(self) -> bool:
        return self.count("done") > 0


def start_followed_turn(hosts: dict[str, Any], token: str) -> tuple[str, Stream, Stream, list[dict[str, Any]]]:
    """A turn via A (a SQL step, then a slow answer) followed via B; returns the thread, both
    streams and the records once the answer streams (the user, the call and its result)."""
    (a, _), (b, _) = hosts["a"], hosts["b"]
    with client(a, token) as ca:
        tid = ca.post("/api/threads", json={}).json()["id"]
    started = Stream(a, token, "POST", f"/api/threads/{tid}/messages", {"content": "tell me a story"})
    started.start()
    wait_until(lambda: started.count("message.delta") >= 3 and started.count("tool.finished") == 1, timeout=60)
    follower = Stream(b, token, "GET", f"/api/threads/{tid}/events")
    follower.start()
    wait_until(lambda: follower.count("message.delta") >= 3, timeout=30)
    time.sleep(0.5)  # some of the answer has reached the turn's events
    with client(b, token) as cb:
        before = cb.get(f"/api/threads/{tid}").json()["records"]
    assert [r["role"] for r in before] == ["user", "assistant", "tool"], before
    return tid, started, follower, before


def finished_records(base: str, token: str, tid: str, timeout: float) -> list[dict[str, Any]]:
    """The thread's records once its cut-off turn has been recorded as host_lost."""
    got: list[dict[str, Any]] = []

    def done() -> bool:
        with client(base, token) as c:
            got[:] = c.get(f"/api/threads/{tid}").json()["records"]
        return bool(got) and (got[-1].get("meta") or {}).get("kind") == HOST_LOST

    wait_until(done, timeout=timeout, interval=0.3)
    return got


def check_kept(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    """What was committed before the loss is all there, seqs contiguous, nothing twice; the
    end is the answer so far, marked host_lost with the notice."""
    seqs = [r["seq"] for r in after]
    assert seqs == list(range(1, len(after) + 1)), seqs
    assert after[: len(before)] == before
    end = after[-1]
    assert end["role"] == "assistant" and end["status"] == "error" and end["meta"]["error"] == HOST_NOTICE
    assert STORY.startswith(end["content"].strip()) and len(end["content"]) > 10, end["content"][:200]
    assert len(after) == len(before) + 1


def follower_end(follower: Stream, since: float, timeout: float) -> float:
    """Seconds from `since` until the follower got `error` (host_lost) + `done`."""
    wait_until(follower.ended, timeout=timeout)
    events = [(e, d) for e, d, _ in follower.got]
    kinds = [d.get("kind") for e, d in events if e == "error"]
    assert kinds and kinds[-1] == HOST_LOST, events[-5:]
    assert events[-1][0] == "done" and events[-1][1]["status"] == "error"
    return next(t for e, _, t in follower.got if e == "done") - since


def test_a_host_killed_mid_turn_costs_the_turn_not_the_thread(hosts) -> None:
    token = add_user(hosts, "alice")
    (_, proc_a), (b, _) = hosts["a"], hosts["b"]
    tid, _, follower, before = start_followed_turn(hosts, token)
    killed = time.monotonic()
    os.killpg(proc_a.pid, signal.SIGKILL)
    proc_a.wait(10)
    took = follower_end(follower, killed, timeout=15)
    after = finished_records(b, token, tid, timeout=15)
    check_kept(before, after)
    with client(b, token) as cb:  # the thread takes a new turn at once
        events = parse_sse(cb.post(f"/api/threads/{tid}/messages", json={"content": "hello again"}).text)
        assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events[-3:]
        records = cb.get(f"/api/threads/{tid}").json()["records"]
    assert [r["seq"] for r in records] == list(range(1, len(after) + 3))
    assert records[: len(after)] == after and records[-1]["content"] == "Fine: hello again"
    print(f"\nfollower ended {took:.2f} s after SIGKILL")


def test_a_hung_host_is_taken_over_and_writes_nothing_after(hosts, cluster_db_url) -> None:
    from datadesk.cluster.database import Database
    from datadesk.cluster.turns import LEASE_S

    token = add_user(hosts, "bob")
    (a, proc_a), (b, _) = hosts["a"], hosts["b"]
    tid, started, follower, before = start_followed_turn(hosts, token)
    stopped = time.monotonic()
    os.killpg(proc_a.pid, signal.SIGSTOP)
    try:
        took = follower_end(follower, stopped, timeout=LEASE_S + 25)
        after = finished_records(b, token, tid, timeout=15)
        check_kept(before, after)
        db = Database(cluster_db_url, max_size=1, name="test")
        try:
            with db.connection() as conn:
                events_then = conn.execute("SELECT n, type FROM turn_events WHERE thread_id = %s ORDER BY n",
                                           (tid,)).fetchall()
                row = conn.execute("SELECT state FROM turns WHERE thread_id = %s", (tid,)).fetchone()
            assert row["state"] == "failed" and events_then[-1]["type"] == "done"
        finally:
            db.close()
    finally:
        os.killpg(proc_a.pid, signal.SIGCONT)
    # A runs on: its renewal finds the claim gone, the turn stops, every write it tries is refused
    wait_until(started.ended, timeout=30)
    time.sleep(2.0)
    assert httpx.get(f"{a}/api/health", timeout=10).status_code == 200
    with client(b, token) as cb:
        assert cb.get(f"/api/threads/{tid}").json()["records"] == after
    db = Database(cluster_db_url, max_size=1, name="test")
    try:
        with db.connection() as conn:
            events_now = conn.execute("SELECT n, type FROM turn_events WHERE thread_id = %s ORDER BY n",
                                      (tid,)).fetchall()
    finally:
        db.close()
    assert events_now == events_then  # not one event of A's after the takeover
    with client(b, token) as cb:
        events = parse_sse(cb.post(f"/api/threads/{tid}/messages", json={"content": "hello again"}).text)
        assert events[-1][1]["status"] == "ok", events[-3:]
    print(f"\nfollower ended {took:.2f} s after SIGSTOP (lease {LEASE_S:.0f} s)")


# -- in one process: the claim path and the reaper, on the directory itself ---------------------

def _host_a_turn(rt: Any, db_a: Any, thread: Any, user: str, text: str) -> tuple[Any, Any]:
    """Host A's turn on `thread`: claimed on A's own connection, its user record appended under
    its fence, some of its answer in its events. Returns (A's directory, its claim)."""
    from datadesk.cluster.journal import PgEventJournal
    from datadesk.cluster.turns import PgTurnDirectory
    from datadesk.domain.records import Record
    from datadesk.store.interfaces.journal import JournalEvent

    directory = PgTurnDirectory(db_a, owner="host-a:1")
    claim = directory.claim(thread.id, user, f"turn-{thread.id[-6:]}", limit=4, events=True)
    sink = PgEventJournal(db_a).sink(thread.id, claim.turn_id, None)
    thread.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), turn_id=claim.turn_id, content=text),
                  epoch=thread.epoch, fence=claim.fence)
    for n, piece in enumerate(["Once ", "upon ", "a time"], start=1):
        sink.put(JournalEvent(n, "message.delta", {"text": piece}))
    sink.close()
    return directory, claim


def test_the_next_claim_or_the_reaper_finishes_a_cut_off_turn(home, state_set, cluster_db_url) -> None:
    """A's lock session dies (a crash): the thread's next claim finishes A's turn before its own;
    A's other turn hangs (its lease past): the reaper ends A's session and finishes it. Either
    way the answer so far is recorded host_lost, the events end, A's fence is refused."""
    import asyncio

    from datadesk.cluster.database import Database
    from datadesk.domain.records import Record
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.store.interfaces.threads import TurnFenced
    from tests.conftest import make_harness

    rt = make_harness(home, ScriptedModel(["fine"]), state=state_set).rt
    db_a = Database(cluster_db_url, max_size=2, name="host-a")
    crashed, hung = rt.threads.create("demo", "alice"), rt.threads.create("demo", "alice")
    dir_a, claim_c = _host_a_turn(rt, db_a, crashed, "alice", "crash story")
    _, claim_h = _host_a_turn(rt, db_a, hung, "alice", "hang story")
    try:
        with rt.cluster.db.connection() as conn:  # A's lock session dies with its process
            conn.execute("SELECT pg_terminate_backend(backend_pid) FROM turns WHERE thread_id = %s", (crashed.id,))
            conn.execute("UPDATE turns SET lease_until = now() - interval '1 s' WHERE thread_id = %s", (hung.id,))

        async def claim_next() -> Any:
            turn = rt.turns.reserve(crashed.id, "alice", events_at=crashed.events_path)
            fence = turn.fence
            rt.turns.release(turn)
            return fence

        wait_until(lambda: rt.turns.directory.current(crashed.id) is None, timeout=10)
        assert asyncio.run(claim_next()) > claim_c.fence + 1  # A's fence, the takeover's, the new turn's
        assert rt.cluster.reaper().reap() == [hung.id]  # the crashed one was finished by the claim
        for thread, claim in ((crashed, claim_c), (hung, claim_h)):
            records = rt.threads.get(thread.id, "alice", ["demo"]).tail(10)
            assert [r.seq for r in records] == [1, 2]
            end = records[-1]
            assert end.content == "Once upon a time" and end.status == "error"
            assert end.meta["kind"] == HOST_LOST and end.meta["error"] == HOST_NOTICE
            with pytest.raises(TurnFenced):  # A, back, cannot write into the thread it lost
                thread.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), content="late"),
                              epoch=thread.epoch, fence=claim.fence)
        kept = rt.turns.journal.read(hung.id, None)
        assert [e.type for e in kept.events][-2:] == ["error", "done"]
        assert kept.events[-2].data["kind"] == HOST_LOST
        with rt.cluster.db.connection() as conn:
            assert conn.execute("SELECT state FROM turns WHERE thread_id = %s", (hung.id,)).fetchone()["state"] \
                == "failed"
        assert rt.cluster.reaper().reap() == []  # nothing left to finish
    finally:
        dir_a.close()
        db_a.close()
        asyncio.run(rt.stop())
