"""Clear chat and user deletion: one operation each, nothing resurrected, memory kept on clear."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from datadesk.llm.scripted import ScriptedModel, ScriptStep, tool_step
from datadesk.store.layout import Layout
from tests.conftest import parse_sse, serve_app, wait_until
from tests.fakes.sandbox import FakeSandbox


def kept_of(h, handle) -> list[str]:
    """What of a thread is kept besides its records: the files of its folder (the embedded set),
    or its row ("meta.json") and its objects in the object store (the cluster set)."""
    if h.rt.cluster is None:
        return sorted(p.name for p in handle.dir.iterdir())
    from datadesk.store.interfaces.blobs import thread_prefix

    prefix = thread_prefix(handle.workspace, handle.meta.owner, handle.id)
    return ["meta.json", *sorted(h.rt.cluster.blobs().list(prefix))]


def test_clear_during_a_running_turn_resurrects_nothing(harness_factory) -> None:
    release = threading.Event()

    async def slow_sql(messages, tools):
        while not release.is_set():
            await asyncio.sleep(0.01)
        return tool_step("sql_query", {"sql": "SELECT * FROM readings"}, call_id="late_call")

    model = ScriptedModel([tool_step("sql_query", {"sql": "SELECT * FROM readings LIMIT 3000"}, call_id="c1"),
                           "first answer", slow_sql, "never recorded"])
    h = harness_factory(model)
    FakeSandbox(h.rt)
    with h.client(served=True, timeout=60) as api:
        c, tid, base = api.client, api.tid, api.base
        parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "first"}).text)
        handle = h.rt.threads.get(tid, "alice", ["demo"])
        assert any(a.format == "parquet" for a in h.rt.artifacts.list(handle))
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(
            events=parse_sse(httpx.post(f"{base}/api/threads/{tid}/messages", json={"content": "second"},
                                        headers=h.auth("alice"), timeout=60).text)))
        worker.start()
        wait_until(lambda: h.rt.turns.get(tid) is not None)
        r = c.post(f"/api/threads/{tid}/clear")
        release.set()
        worker.join(30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["epoch"] == 1 and body["memory"] == "kept"
        assert body["removed"]["records"] >= 4 and body["removed"]["artifacts"] == 1
        assert c.get(f"/api/threads/{tid}").json()["records"] == []
        assert c.get(f"/api/threads/{tid}/artifacts").json() == []
        leftovers = kept_of(h, handle)
        assert leftovers in (["meta.json"], ["meta.json", "thread.lock"]), leftovers
        # the thread works again from a clean slate
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "again"}).text)
        assert events[-1][1]["status"] == "ok"
        assert [r["content"] for r in c.get(f"/api/threads/{tid}").json()["records"]][0] == "again"


def test_stale_append_after_clear_is_refused(harness_factory) -> None:
    from datadesk.domain.records import Record
    from datadesk.store.threadlog import LogClosed

    h = harness_factory(ScriptedModel())
    handle = h.rt.threads.create("demo", "bob")
    epoch = handle.meta.epoch
    handle.log.append(lambda s: Record(seq=s, role="user", ts=1.0, content="x"), epoch=epoch)
    h.rt.threads.clear(handle)
    try:
        handle.log.append(lambda s: Record(seq=s, role="assistant", ts=1.0, content="late"), epoch=epoch)
        raise AssertionError("a stale append was accepted")
    except LogClosed:
        pass
    assert list(handle.log) == []


def test_users_delete_purges_everything(harness_factory, home: Path) -> None:
    h = harness_factory(ScriptedModel([tool_step("sql_query", {"sql": "SELECT * FROM readings LIMIT 5000"}),
                                       "done"]))
    FakeSandbox(h.rt)
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=60) as c:
        tid = c.post("/api/threads", json={"workspace": "sales"}).json()["id"]
        tid2 = c.post("/api/threads", json={}).json()["id"]
        parse_sse(c.post(f"/api/threads/{tid2}/messages", json={"content": "q"}).text)
    user_dirs = [Layout(home).user_dir(ws, "alice") for ws in ("demo", "sales")]
    assert all(d.exists() for d in user_dirs)
    env = {"DATADESK_HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[2] / "platform"),
           "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "datadesk.cli", "users", "delete", "alice"]
    refused = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = subprocess.run([*cli, "--yes"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not any(d.exists() for d in user_dirs)
    assert "alice" not in json.loads((home / "users.json").read_text())["users"]
    assert not [p for p in home.rglob("*") if "alice" in p.name]
    assert tid
