"""Bounded work (issue 15): a SQL bomb through the app stops at the memory limit with a message
naming it, the spill directory lies under <home>/tmp/sql and is gone afterwards, normal queries
still work; and a user cannot create threads past limits.max_threads_per_user."""

from __future__ import annotations

import resource

import pytest
from litestar.testing import TestClient

from tests.conftest import parse_sse
from datadesk.llm.scripted import ScriptedModel, tool_step

pytestmark = pytest.mark.security
BOMB = "SELECT list(a.range) FROM range(20000) a, range(20000) b"  # 400 M list entries: GBs unbounded


def test_sql_cross_join_bomb_is_refused_and_others_still_query(harness_factory, home) -> None:
    h = harness_factory(ScriptedModel([
        tool_step("sql_query", {"sql": BOMB}, call_id="bomb"),
        tool_step("sql_query", {"sql": "SELECT count(*) AS n FROM buildings"}, call_id="ok"),
        "done",
    ]), limits={"sql_memory_mb": 256, "sql_temp_mb": 128})
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"]
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "x"},
                                       headers=h.auth("bob")).text)
    finished = [d for e, d in events if e == "tool.finished"]
    assert [f["ok"] for f in finished] == [False, True], finished
    assert "more than 256 MB of memory (limits.sql_memory_mb)" in finished[0]["preview"]
    assert "filter or aggregate in SQL" in finished[0]["preview"]
    assert "20" in finished[1]["preview"]
    assert events[-1][1]["status"] == "ok"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1_500_000  # KiB, loose: bench/bombs.py measures
    spill = home / "tmp" / "sql"
    assert spill.is_dir() and not any(spill.iterdir())  # per-instance dirs removed with their connections
    data = h.rt.layout.workspace_data_dir("demo")
    assert sorted(p.name for p in data.iterdir()) == ["warehouse.duckdb"]


def test_thread_limit_per_user(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), limits={"max_threads_per_user": 3})
    with TestClient(h.app()) as client:
        for _ in range(3):
            assert client.post("/api/threads", json={}, headers=h.auth("bob")).status_code == 201
        r = client.post("/api/threads", json={}, headers=h.auth("bob"))
        assert r.status_code == 429
        assert "limits.max_threads_per_user" in r.json()["error"] and "at most 3" in r.json()["error"]
        # another user is not affected, and deleting one frees a slot
        assert client.post("/api/threads", json={}, headers=h.auth("alice")).status_code == 201
        tid = client.get("/api/threads", headers=h.auth("bob")).json()[0]["id"]
        assert client.delete(f"/api/threads/{tid}", headers=h.auth("bob")).status_code in (200, 204)
        assert client.post("/api/threads", json={}, headers=h.auth("bob")).status_code == 201


def test_near_the_memory_ceiling_queries_and_uploads_are_refused_naming_it(harness_factory) -> None:
    """limits.app_memory_mb below what the process already uses: nothing heavy is admitted, with a
    clear message (tool error for the model, 503 for an upload); nothing is stored."""
    h = harness_factory(ScriptedModel([
        tool_step("sql_query", {"sql": "SELECT count(*) AS n FROM buildings"}, call_id="q"), "done",
    ]), limits={"app_memory_mb": 16})
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"]
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "x"},
                                       headers=h.auth("bob")).text)
        finished = [d for e, d in events if e == "tool.finished"]
        assert not finished[0]["ok"] and "limits.app_memory_mb" in finished[0]["preview"]
        r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("a.csv", b"a,b\n1,2\n")},
                        headers=h.auth("bob"))
        assert r.status_code == 503 and "short of memory" in r.json()["error"]
        assert "limits.app_memory_mb" in r.json()["error"]
        assert not list(h.rt.threads.get(tid, "bob", ["demo"]).artifacts_dir.glob("*.parquet"))


def test_upload_conversions_are_bounded_per_user_and_globally(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), limits={"uploads": 1, "uploads_queue_s": 0.2})
    slots = h.rt.attachments.slots
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("bob")).json()["id"]
        held = slots.try_acquire("bob", "upload")  # bob's own conversion is running
        r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("a.csv", b"a,b\n1,2\n")}, headers=h.auth("bob"))
        assert r.status_code == 503 and "limits.uploads_per_user" in r.json()["error"]
        tid_a = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        r = client.post(f"/api/threads/{tid_a}/uploads", files={"file": ("a.csv", b"a,b\n1,2\n")},
                        headers=h.auth("alice"))  # the app's one slot is bob's: alice waits, then 503
        assert r.status_code == 503 and "limits.uploads" in r.json()["error"] and "uploads_queue_s" in r.json()["error"]
        held.release()
        r = client.post(f"/api/threads/{tid_a}/uploads", files={"file": ("a.csv", b"a,b\n1,2\n")},
                        headers=h.auth("alice"))
        assert r.status_code in (200, 201), r.text
        assert slots.running() == 0
