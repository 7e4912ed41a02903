"""Operating a cluster (issue 29 item 3) against a PostgreSQL of this module's own, stopped and
started again here (never the shared test server): `/api/ready` fails while the database is
down and comes back with it, `/api/health` never waits on it; a turn running through a restart
ends with a clear error within 15 s and a new turn works within 10 s of the database."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from datadesk.llm.scripted import ScriptedModel, ScriptStep
from tests.cluster.conftest import _store_credentials, cluster_settings
from tests.clusterkit import start_cluster_postgres
from tests.conftest import close_clusters, make_harness, parse_sse
from tests.dbkit import PG_BIN, _as, _run, _stop_pid, _system_user

pytestmark = pytest.mark.cluster

ERROR_WITHIN_S = 15.0
BACK_WITHIN_S = 10.0


@pytest.fixture
def own_pg():
    """A PostgreSQL server for this test alone (it gets stopped and started)."""
    root = Path(tempfile.mkdtemp(prefix="datadesk-operate-pg-"))
    srv = start_cluster_postgres(root)
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def pg_down(srv) -> None:
    """A fast shutdown (every session ended), waited for by PID."""
    _stop_pid(srv.pid, 2)  # SIGINT: fast shutdown


def pg_up(srv) -> None:
    pg = _system_user("postgres")
    env = {"PATH": f"{PG_BIN}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    data = srv.root / "pgdata"
    _run([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(srv.root / "log"), "-w", "-t", "30", "start"],
         env=env, **_as(pg))
    srv.pid = int((data / "postmaster.pid").read_text().split()[0])


@pytest.fixture
def cluster_on_own_pg(own_pg, s3, monkeypatch):
    _store_credentials(monkeypatch, s3)
    url = own_pg.new_database()
    yield own_pg, cluster_settings(url, s3)
    close_clusters(url)


def wait_status(client, path: str, status: int, within_s: float) -> float:
    """Seconds until `path` answers `status` (fails past `within_s`)."""
    started = time.monotonic()
    while True:
        r = client.get(path)
        if r.status_code == status:
            return time.monotonic() - started
        assert time.monotonic() - started < within_s, (path, r.status_code, r.text)
        time.sleep(0.2)


def test_readiness_follows_the_database(home, cluster_on_own_pg) -> None:
    srv, state = cluster_on_own_pg
    h = make_harness(home, ScriptedModel(then="ok"), state=state)
    with h.client(thread=False) as api:
        r = api.client.get("/api/ready")
        assert r.status_code == 200, r.text
        assert set(r.json()["checks"]) == {"disk", "database", "store"}
        pg_down(srv)
        try:
            wait_status(api.client, "/api/ready", 503, 5)
            r = api.client.get("/api/ready")
            body = r.json()
            assert not body["checks"]["database"]["ok"] and body["checks"]["store"]["ok"], body
            assert "database" in body["error"] and srv.password not in r.text
            started = time.monotonic()
            assert api.client.get("/api/health").status_code == 200  # liveness never waits on a probe
            assert time.monotonic() - started < 1.0
        finally:
            pg_up(srv)
        back = wait_status(api.client, "/api/ready", 200, BACK_WITHIN_S)
        print(f"readiness back {back:.2f} s after the database")


def stream_turn(base: str, headers: dict, tid: str, out: dict) -> None:
    """POST a message and read its SSE stream to the end; `out`: the events and when it ended."""
    with httpx.Client(base_url=base, headers=headers, timeout=60) as c:
        r = c.post(f"/api/threads/{tid}/messages", json={"content": "a long one"})
        out["events"] = parse_sse(r.text)
        out["ended"] = time.monotonic()


def test_a_database_restart_ends_the_turn_then_service_returns(home, cluster_on_own_pg) -> None:
    srv, state = cluster_on_own_pg
    never = asyncio.Event()  # the model never answers: the turn runs until something ends it
    h = make_harness(home, ScriptedModel([ScriptStep(gate=never)], then="ok"), state=state)
    with h.client(served=True) as api:
        out: dict = {}
        reader = threading.Thread(target=stream_turn, args=(api.base, h.auth("alice"), api.tid, out), daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not h.rt.turns.running(api.tid):
            assert time.monotonic() < deadline, "the turn did not start"
            time.sleep(0.05)
        time.sleep(0.5)
        down_at = time.monotonic()
        pg_down(srv)
        try:
            reader.join(ERROR_WITHIN_S + 5)
            assert "ended" in out, "the turn's stream did not end"
            took = out["ended"] - down_at
            kinds = [(e, d) for e, d in out["events"] if e in ("error", "done")]
            assert [e for e, _ in kinds][-2:] == ["error", "done"], out["events"]
            error = kinds[-2][1]
            assert error["kind"] in ("lost", "database"), error
            assert "this turn stopped" in error["message"] and srv.password not in error["message"]
            assert took <= ERROR_WITHIN_S, took
            print(f"turn ended {took:.2f} s after the database went: {error['message']}")
        finally:
            pg_up(srv)
        up_at = time.monotonic()
        while True:
            try:
                events = api.turn("again")
                if events and events[-1][0] == "done" and events[-1][1]["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - up_at < BACK_WITHIN_S, events
            time.sleep(0.2)
        back = time.monotonic() - up_at
        assert back <= BACK_WITHIN_S
        print(f"a new turn worked {back:.2f} s after the database came back")
