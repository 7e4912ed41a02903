"""Two `datadesk serve` processes with separate, empty homes on one PostgreSQL and one bucket
behave as one server (issue 28 item 3): accounts, sessions and budgets, threads with their
records, memory and artifacts (the grid and downloads included, after the first host's home is
deleted), and a turn running on one re-attached and cancelled via the other; one turn per thread
and the per-user turn cap hold across both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import parse_sse, wait_until
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.fakes.tool_loop import SUMMARY_MARK
from tests.unit.test_summary import faithful
from tests.serving import serving

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT 20000"
SLOW = "tell me a slow story"


def respond(req: dict[str, Any]) -> FakeReply:
    """SQL for 'query ...', a slow 60-chunk answer for SLOW, else a short text; after a tool
    result, a short answer."""
    messages = req.get("messages") or []
    if messages and SUMMARY_MARK in str(messages[0].get("content", "")):
        return FakeReply(text=faithful(messages, []), chunks=1)  # the summarizer's deterministic summary
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return FakeReply(text="The result is offloaded.", chunks=2)
    user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    if user.startswith("query"):
        return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": SQL}}])
    if user == SLOW:
        return FakeReply(text=" ".join(f"word{i}" for i in range(60)), chunks=60, delay_s=0.1)
    return FakeReply(text="ok", chunks=1)


class Cluster:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env

    def cli(self, *args: str, home: Path | None = None) -> str:
        env = {**self.env, "DATADESK_HOME": str(home or self.root / "cli-home")}
        out = subprocess.run([sys.executable, "-m", "datadesk.cli", *args], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def add_user(self, name: str, *flags: str) -> str:
        out = self.cli("users", "add", name, "--workspace", "demo", *flags)
        return next(line.split(": ", 1)[1].strip() for line in out.splitlines() if "API token" in line)


@pytest.fixture
def two_hosts(tmp_path, cluster_db_url, s3):
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        env = {**os.environ, **s3.env(), "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
               "DATADESK_CLUSTER_DATABASE_URL": cluster_db_url, "DATADESK_SECRET_KEY": "test-secret-" + "x" * 32,
               "DATADESK_LLM_BASE_URL": fake.base_url, "DATADESK_LLM_API_KEY": "sk-test",
               "DATADESK_LLM_MODEL": "fake-model", "DATADESK_SANDBOX_BACKEND": "local"}
        cluster = Cluster(tmp_path, env)
        bases = []
        with contextlib_exit() as stack:
            for name in ("a", "b"):
                home = tmp_path / f"home-{name}"
                home.mkdir()
                (home / "datadesk.toml").write_text("[chat]\nmax_turns_per_user = 2\n[auth]\n"
                                                    "login_attempts_per_account = 6\n[sandbox]\npool_size = 0\n"
                                                    "[context]\nhistory_budget_tokens = 400\n"
                                                    "[summary]\nrefresh_after_records = 2\n")
                host_env = {**env, "DATADESK_HOME": str(home), "DATADESK_CONFIG": str(home / "datadesk.toml")}
                base, _ = stack.enter_context(serving(home, host_env, tmp_path / f"serve-{name}.log",
                                                      args=["--allow-unsafe-local-sandbox"]))
                bases.append((base, home))
            cluster.hosts = bases
            yield cluster


def contextlib_exit():
    import contextlib

    return contextlib.ExitStack()


def client(base: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, headers=headers, timeout=60)


def test_accounts_sessions_and_login_budget_are_one_across_hosts(two_hosts):
    (a, _), (b, _) = two_hosts.hosts
    token = two_hosts.add_user("alice")
    with client(a, token) as ca, client(b, token) as cb:
        assert ca.get("/api/me").json()["name"] == cb.get("/api/me").json()["name"] == "alice"
    code = two_hosts.cli("users", "login-url", "alice").strip().rsplit("code=", 1)[1]
    with client(a) as ca:  # a session made on A ...
        r = ca.post("/api/login", json={"code": code})
        assert r.status_code == 200, r.text
        cookies = dict(ca.cookies)
    with client(b) as cb:  # ... works on B, and a used code is refused on B
        cb.cookies.update(cookies)
        assert cb.get("/api/me").json()["name"] == "alice"
        assert cb.post("/api/login", json={"code": code}).status_code == 401
    two_hosts.cli("users", "revoke", "alice")
    with client(b, token) as cb:
        assert cb.get("/api/me").status_code == 401
    # failed logins for one account, alternating hosts: the per-account budget (6) holds in all
    # (the used code above was the first failure)
    statuses = []
    for i in range(10):
        with client((a, b)[i % 2]) as c:
            statuses.append(c.post("/api/login", json={"code": "alice.bad" + str(i)}).status_code)
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}, statuses


def test_a_thread_written_via_a_is_read_via_b_after_a_home_is_deleted(two_hosts):
    (a, home_a), (b, _) = two_hosts.hosts
    token = two_hosts.add_user("bob", "--memory", "--can-execute-code")
    with client(a, token) as ca:
        tid = ca.post("/api/threads", json={}).json()["id"]
        events = parse_sse(ca.post(f"/api/threads/{tid}/messages", json={"content": "query the readings"}).text)
        assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events
        arts = ca.get(f"/api/threads/{tid}/artifacts").json()
        assert arts, [r.get("meta") for r in ca.get(f"/api/threads/{tid}").json()["records"]]
        ca.post("/api/memory", params={"workspace": "demo"}, json={"text": "prefers kWh per m2"})
        summary_a = None
        for i in range(30):  # A's summarizer writes a summary; A's next requests carry it
            done = parse_sse(ca.post(f"/api/threads/{tid}/messages", json={"content": f"and then {i}"}).text)
            assert done[-1][1]["status"] == "ok", done
            summary_a = ca.get(f"/api/threads/{tid}/context").json().get("summary_detail")
            if summary_a:
                break
            time.sleep(0.5)
        assert summary_a and summary_a["covers_through_seq"] >= 2, summary_a
        records_a = ca.get(f"/api/threads/{tid}").json()["records"]
    aid = arts[0]["id"] if isinstance(arts, list) else arts["artifacts"][0]["id"]
    shutil.rmtree(home_a / "workspaces", ignore_errors=True)  # A's files are gone; A still runs
    with client(b, token) as cb:
        assert cb.get(f"/api/threads/{tid}").json()["records"] == records_a
        rows = cb.get(f"/api/artifacts/{aid}/rows", params={"limit": 5})
        assert rows.status_code == 200, rows.text
        csv = cb.get(f"/api/artifacts/{aid}/rows.csv")
        assert csv.status_code == 200 and csv.text.count("\n") == 20_001
        assert cb.get(f"/api/artifacts/{aid}/download").status_code == 200
        memory = cb.get("/api/memory", params={"workspace": "demo"}).json()
        assert "prefers kWh per m2" in str(memory)
        hits = cb.get("/api/search", params={"q": "readings"}).json()
        assert tid in str(hits)
        # the summary A wrote, carried by A's last request, reads the same via B
        assert cb.get(f"/api/threads/{tid}/context").json()["summary_detail"] == summary_a


class Reader(threading.Thread):
    def __init__(self, base: str, token: str, tid: str) -> None:
        super().__init__(daemon=True)
        self.base, self.token, self.tid, self.ids, self.events = base, token, tid, [], []

    def run(self) -> None:
        with client(self.base, self.token) as c, c.stream("POST", f"/api/threads/{self.tid}/messages",
                                                           json={"content": SLOW}) as r:
            for line in r.iter_lines():
                if line.startswith("id:"):
                    self.ids.append(line[3:].strip())
                elif line.startswith("event:"):
                    self.events.append(line[6:].strip())


def test_a_turn_on_a_is_followed_refused_and_cancelled_via_b(two_hosts):
    (a, _), (b, _) = two_hosts.hosts
    token = two_hosts.add_user("carol")
    with client(a, token) as ca:
        tid = ca.post("/api/threads", json={}).json()["id"]
        other = [ca.post("/api/threads", json={}).json()["id"] for _ in range(2)]
    reader = Reader(a, token, tid)
    reader.start()
    wait_until(lambda: len(reader.ids) >= 3, timeout=30)
    with client(b, token) as cb:
        assert cb.get(f"/api/threads/{tid}").json()["thread"]["running"]
        # one turn per thread across hosts
        assert cb.post(f"/api/threads/{tid}/messages", json={"content": "again"}).status_code == 409
        # the per-user cap (2) across hosts: the second concurrent turn via B is refused
        slow_b = Reader(b, token, other[0])
        slow_b.start()
        wait_until(lambda: len(slow_b.ids) >= 1, timeout=30)
        assert cb.post(f"/api/threads/{other[1]}/messages", json={"content": "x"}).status_code == 429
        # re-attach via B from the start: the same event ids as A's stream
        follow: list[str] = []
        with cb.stream("GET", f"/api/threads/{tid}/events") as r:
            assert r.status_code == 200
            started = time.monotonic()
            for line in r.iter_lines():
                if line.startswith("id:"):
                    follow.append(line[3:].strip())
                if len(follow) == 5:
                    t0 = time.monotonic()
                    assert cb.post(f"/api/threads/{tid}/cancel").status_code == 200
                if time.monotonic() - started > 60:
                    break
        cancel_s = time.monotonic() - t0
    reader.join(30)
    slow_b.join(60)
    assert reader.events[-1] == "done" and follow[: len(reader.ids)] == reader.ids[: len(follow)]
    assert follow[0].endswith(":1") and follow[-1] == reader.ids[-1]
    assert cancel_s < 5, cancel_s
    with client(b, token) as cb:
        records = cb.get(f"/api/threads/{tid}").json()["records"]
        assert records[-1]["status"] == "cancelled", records[-1]
        done = parse_sse(cb.post(f"/api/threads/{tid}/messages", json={"content": "hello"}).text)
        assert done[-1][1]["status"] == "ok"
