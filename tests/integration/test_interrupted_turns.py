"""A turn cut off by a dying server is finished on restart (issue 25): `datadesk serve` as a real
process group, the real OpenAI client against the fake server, SIGKILL mid-answer and during a
slow SQL query on the DuckDB warehouse, then a restart (one worker, or two at once).

After the restart the thread shows the answer so far marked interrupted, every cut-off tool
call has a result, the events endpoint ends with `error` + `done`, and the next turn's request
(as the fake server received it) pairs every tool call with its result.
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

from datadesk.chat.interrupted import ANSWER_NOTICE, TOOL_NOTICE
from datadesk.context.builder import CUT_OFF, NO_RESULT
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from tests.conftest import free_port, parse_sse, wait_until
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

# serial: SIGKILL at timed moments of an answer or a slow query, and a restart it waits for
pytestmark = [pytest.mark.faults, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
STORY = " ".join(f"word{i}" for i in range(600))  # streamed slowly: 600 pieces, 30 s
SLOW_SQL = "SELECT count(*) AS n FROM range(60000) a(x), range(60000) b(y) WHERE (x * y) % 7 = 1"
TOML = """
[chat]
max_turns_per_user = 20
[sandbox]
backend = "none"
[summary]
enabled = false
"""


def respond(req: dict[str, Any]) -> FakeReply:
    """A story streamed slowly, a slow SQL call, else a short answer naming the question."""
    messages = req.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and "story" in str(last.get("content")):
        return FakeReply(text=STORY, chunks=600, delay_s=0.05)
    if last.get("role") == "user" and "slow sql" in str(last.get("content")):
        return FakeReply(text="Counting. ", tool_calls=[{"id": "call_slow", "name": "sql_query",
                                                         "arguments": {"sql": SLOW_SQL}}])
    return FakeReply(text=f"Fine: {last.get('content')}", chunks=2)


@contextlib.contextmanager
def serve(home: Path, fake: FakeOpenAIServer, workers: int = 1, log_name: str = "serve.log",
          port: int | None = None) -> Iterator[tuple[str, subprocess.Popen, Path, float]]:
    """`datadesk serve` in its own process group; yields (base URL, process, log, seconds until it
    answered). Left running if the test killed it; else stopped with SIGTERM."""
    port = port or free_port()
    (home / "datadesk.toml").write_text(TOML)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}", "DATADESK_HOME": str(home),
           "DATADESK_CONFIG": str(home / "datadesk.toml"), "DATADESK_LLM_BASE_URL": fake.base_url,
           "DATADESK_LLM_API_KEY": "sk-test", "DATADESK_LLM_MODEL": "fake-model", "PYTHONUNBUFFERED": "1"}
    log = home.parent / log_name
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--workers", str(workers),
                                 "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=home.parent, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/api/health", timeout=2).status_code == 200 and \
                        log.read_text().count("Application startup complete") >= workers:
                    break
            if proc.poll() is not None or time.monotonic() - started > 120:
                raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        yield base, proc, log, time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the server and every worker: nothing gets to record anything."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


class Reader(threading.Thread):
    """Reads one turn's SSE stream in the background: (id, event, data) as they come."""

    def __init__(self, base: str, token: str, tid: str, text: str) -> None:
        super().__init__(daemon=True)
        self.base, self.token, self.tid, self.text = base, token, tid, text
        self.got: list[tuple[str | None, str, dict[str, Any]]] = []

    def run(self) -> None:
        with contextlib.suppress(httpx.HTTPError), \
                httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as c, \
                c.stream("POST", f"/api/threads/{self.tid}/messages", json={"content": self.text}) as resp:
            eid, ev = None, "message"
            for line in resp.iter_lines():
                if line.startswith("id:"):
                    eid = line[3:].strip()
                elif line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:"):
                    self.got.append((eid, ev, msgspec.json.decode(line[5:].strip())))
                    eid, ev = None, "message"

    def text_so_far(self) -> str:
        return "".join(d.get("text", "") for _, e, d in list(self.got) if e == "message.delta")

    def last_id(self) -> str:
        return [i for i, _, _ in self.got if i][-1]


def client(base: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def turn_end(c: httpx.Client, tid: str, after: str) -> list[tuple[str, dict[str, Any]]]:
    """What a client that re-attaches with `Last-Event-ID: after` gets."""
    r = c.get(f"/api/threads/{tid}/events", headers={"Last-Event-ID": after})
    assert r.status_code == 200, r.status_code
    events = parse_sse(r.text)
    # the text before the end gets its final rendering (a delta without text): nothing new
    assert all(d["text"] == "" for e, d in events if e == "message.delta"), events
    return [(e, d) for e, d in events if e != "message.delta"]


def check_pairing(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool call of the request has exactly one result right after it; returns the results."""
    msgs, results = request["messages"], []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [c["id"] for c in m["tool_calls"]]
            after = [x for x in msgs[i + 1:i + 1 + len(ids)] if x["role"] == "tool"]
            assert [x["tool_call_id"] for x in after] == ids, msgs
            results += after
    called = {c["id"] for m in msgs for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in called for m in msgs if m["role"] == "tool"), "an orphan result"
    assert all(m["content"] != NO_RESULT for m in results), "a synthetic result: a call had no record"
    return results


def chat_requests(fake: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r.get("tools")]


def test_sigkill_mid_answer_the_restart_keeps_the_answer_so_far_marked_interrupted(home: Path) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], [])
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        with serve(home, fake, log_name="first.log") as (base, proc, _, _):
            with client(base, token) as c:
                tid = c.post("/api/threads", json={}).json()["id"]
            reader = Reader(base, token, tid, "tell me a long story")
            reader.start()
            wait_until(lambda: len(reader.text_so_far()) > 400, timeout=30)
            seen_before = reader.text_so_far()
            time.sleep(0.6)  # the text seen so far has reached the journal (written every 0.25 s)
            kill(proc)
            reader.join(10)
        seen_at_kill, last_id = reader.text_so_far(), reader.last_id()
        assert not any(e == "done" for _, e, _ in reader.got)
        with serve(home, fake, log_name="second.log") as (base, _, log, restart_s), client(base, token) as c:
            records = c.get(f"/api/threads/{tid}").json()["records"]
            assert [r["role"] for r in records] == ["user", "assistant"]
            answer = records[-1]
            assert answer["status"] == "error" and answer["meta"] == {"error": ANSWER_NOTICE, "kind": "interrupted"}
            assert answer["content"].startswith(seen_before) and seen_at_kill.startswith(answer["content"])
            assert STORY.startswith(answer["content"]) and answer["content"] != STORY
            # a client that re-attaches with its last id gets the end; nothing runs now
            end = turn_end(c, tid, last_id)
            assert [e for e, _ in end] == ["error", "done"]
            assert end[0][1] == {"kind": "interrupted", "message": ANSWER_NOTICE}
            assert end[1][1]["status"] == "error"
            assert c.get(f"/api/threads/{tid}/events").status_code == 204
            assert not c.get(f"/api/threads/{tid}").json()["thread"]["running"]
            # the next turn works, and the model sees the reply marked as cut off
            r = c.post(f"/api/threads/{tid}/messages", json={"content": "go on"})
            assert parse_sse(r.text)[-1] == ("done", {"turn_id": parse_sse(r.text)[-1][1]["turn_id"], "status": "ok"})
            sent = chat_requests(fake)[-1]["messages"]
            assert sent[-2] == {"role": "assistant", "content": answer["content"] + "\n" + CUT_OFF}
            assert sent[-1] == {"role": "user", "content": "go on"}
            assert len(c.get(f"/api/threads/{tid}").json()["records"]) == 4
            server_log = log.read_text()
    assert "finished turn" in server_log and "characters of the answer kept" in server_log
    print(f"\nrestart after SIGKILL mid-answer: answered after {restart_s:.2f} s; "
          f"{len(answer['content']):,} of {len(seen_at_kill):,} characters seen live were kept")


def test_sigkill_during_a_slow_sql_query_two_workers_restart_and_finish_it_once(home: Path) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], [])
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        with serve(home, fake, log_name="first.log") as (base, proc, _, _):
            with client(base, token) as c:
                tid = c.post("/api/threads", json={}).json()["id"]
            reader = Reader(base, token, tid, "run the slow sql")
            reader.start()
            wait_until(lambda: any(e == "tool.started" for _, e, _ in list(reader.got)), timeout=30)
            time.sleep(0.5)  # the query runs
            kill(proc)
            reader.join(10)
        assert not any(e == "tool.finished" for _, e, _ in reader.got)
        with serve(home, fake, workers=2, log_name="second.log") as (base, _, log, restart_s), client(base, token) as c:
            records = c.get(f"/api/threads/{tid}").json()["records"]
            assert [r["role"] for r in records] == ["user", "assistant", "tool", "assistant"], records
            call, result, answer = records[1], records[2], records[3]
            assert [t["id"] for t in call["tool_calls"]] == ["call_slow"] and call["content"] == "Counting. "
            assert (result["tool_call_id"], result["status"], result["content"]) == ("call_slow", "error", TOOL_NOTICE)
            assert result["meta"]["status"] == "interrupted"
            assert answer["meta"]["kind"] == "interrupted" and answer.get("content", "") == ""
            end = turn_end(c, tid, reader.last_id())
            assert [e for e, _ in end] == ["tool.finished", "error", "done"]
            assert end[0][1]["call_id"] == "call_slow" and end[0][1]["ok"] is False
            r = c.post(f"/api/threads/{tid}/messages", json={"content": "what now?"})
            assert parse_sse(r.text)[-1][1]["status"] == "ok"
            results = check_pairing(chat_requests(fake)[-1])
            assert [x["content"] for x in results] == [TOOL_NOTICE]
            manifest = c.get(f"/api/threads/{tid}/context").json()
            assert manifest.get("synthetic_results", 0) == 0 and manifest.get("dropped_orphans", 0) == 0
            server_log = log.read_text()
    assert server_log.count("finished turn") == 1, server_log[-3000:]  # one of the two workers did it
    print(f"\nrestart (2 workers) after SIGKILL during SQL: answered after {restart_s:.2f} s")


def test_many_cut_off_turns_are_each_finished_once_when_two_workers_start(home: Path) -> None:
    _, token = UserStore(Layout(home)).add("alice", ["demo"], [])
    n = 8
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        with serve(home, fake, workers=2, log_name="first.log") as (base, proc, _, _):
            with client(base, token) as c:
                tids = [c.post("/api/threads", json={}).json()["id"] for _ in range(n)]
            readers = [Reader(base, token, tid, f"story number {i}") for i, tid in enumerate(tids)]
            for r in readers:
                r.start()
            wait_until(lambda: all(len(r.text_so_far()) > 100 for r in readers), timeout=60)
            time.sleep(0.6)
            kill(proc)
        with serve(home, fake, workers=2, log_name="second.log") as (base, _, log, restart_s), client(base, token) as c:
            for tid in tids:
                records = c.get(f"/api/threads/{tid}").json()["records"]
                assert [r["role"] for r in records] == ["user", "assistant"], records
                assert records[1]["meta"]["kind"] == "interrupted" and len(records[1]["content"]) > 100
            server_log = log.read_text()
    assert server_log.count("finished turn") == n, server_log[-3000:]
    print(f"\n{n} cut-off turns, 2 workers: the restarted server answered after {restart_s:.2f} s, "
          f"every turn finished once")


def test_a_worker_killed_mid_answer_is_finished_by_the_worker_that_replaces_it(home: Path) -> None:
    """Only the worker running the turn dies; the supervisor starts another, which finishes the
    turn before it serves, while the other worker serves on."""
    _, token = UserStore(Layout(home)).add("alice", ["demo"], [])
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        with serve(home, fake, workers=2) as (base, _, log, _), client(base, token) as c:
            tid = c.post("/api/threads", json={}).json()["id"]
            reader = Reader(base, token, tid, "tell me a long story")
            reader.start()
            wait_until(lambda: len(reader.text_so_far()) > 300, timeout=30)
            marker = home / "locks" / "turns" / f"t-{tid}.turn"
            pid = msgspec.json.decode(marker.read_bytes())["pid"]
            time.sleep(0.6)
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            reader.join(10)

            def finished() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    records = c.get(f"/api/threads/{tid}").json()["records"]
                    return len(records) == 2 and records[1]["meta"]["kind"] == "interrupted"
                return False

            wait_until(finished, timeout=90, interval=0.2)
            took = time.monotonic() - killed_at
            content = c.get(f"/api/threads/{tid}").json()["records"][1]["content"]
            assert STORY.startswith(content) and len(content) > 300
            r = c.post(f"/api/threads/{tid}/messages", json={"content": "go on"})
            assert parse_sse(r.text)[-1][1]["status"] == "ok"
            check_pairing(chat_requests(fake)[-1])
            server_log = log.read_text()
    assert server_log.count("finished turn") == 1, server_log[-3000:]
    print(f"\na worker killed mid-answer: its replacement had finished the turn {took:.2f} s after the kill")
