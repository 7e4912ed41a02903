"""The python tool on real kernels: local ipykernel subprocesses and real Docker containers.

Behavioural tests run on both backends; isolation tests (network, host files,
limits) run on docker only.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from pathlib import Path

import duckdb
import httpx
import pytest

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.settings import Settings
from tests.conftest import parse_sse, serve_app, until
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def sandbox_settings(backend: str, **kw) -> dict:
    return {"backend": backend, "pool_size": 0, "run_dir": tempfile.mkdtemp(prefix="ddr-"),
            "exec_timeout_s": 20, "memory_mb": 512, **kw}


def make_rt(home: Path, backend: str, **kw) -> Runtime:
    return runtime_with_sandbox(home, sandbox_settings(backend, **kw))


# -- end to end through the API -------------------------------------------------------

def _aggregate_step(messages, tools):
    tool_msg = [m for m in messages if m["role"] == "tool"][-1]["content"]
    aid = re.search(r"artifact (a[0-9a-f]+)", tool_msg).group(1)
    code = (f"import duckdb\n"
            f"duckdb.sql(\"SELECT count(*), sum(kwh), sum(occupancy) FROM '/data/{aid}.parquet'\").fetchall()")
    return tool_step("python", {"code": code}, call_id="call_py")


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_demo_artifact_is_aggregated_in_the_kernel(harness_factory, home: Path, backend: str) -> None:
    model = ScriptedModel([tool_step("sql_query", {"sql": "SELECT * FROM readings"}, call_id="call_sql"),
                           _aggregate_step, "done"])
    h = harness_factory(model, sandbox=sandbox_settings(backend))
    with h.client(served=True, timeout=120) as api:
        c, tid = api.client, api.tid
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "total energy?"}).text)
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert fins["call_sql"]["meta"]["artifact"]["rows"] == 190_560
    out = fins["call_py"]["preview"]
    con = duckdb.connect(str(home / "workspaces/demo/data/warehouse.duckdb"), read_only=True)
    n, kwh, occ = con.execute("SELECT count(*), sum(kwh), sum(occupancy) FROM readings").fetchone()
    con.close()
    got = re.search(r"\[\((\d+), ([\d.e+]+), (\d+)\)\]", out)
    assert got, out
    assert int(got.group(1)) == n and float(got.group(2)) == pytest.approx(kwh) and int(got.group(3)) == occ


# -- behaviour on both backends ----------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_chart_and_outputs_become_artifacts(home: Path, backend: str) -> None:
    rt = make_rt(home, backend)
    c = ctx(rt)

    async def body():
        chart = await py(rt, c, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
        files = await py(rt, c, "import os\nos.makedirs('/outputs/rep', exist_ok=True)\n"
                                "open('/outputs/rep/summary.csv', 'w').write('a,b\\n1,2\\n')\n"
                                "os.symlink('/etc/passwd', '/outputs/leak')\nos.mkfifo('/outputs/pipe')\n'ok'")
        again = await py(rt, c, "1 + 1")
        return chart, files, again

    chart, files, again = run_with(rt, body)
    assert not chart.is_error, chart.content
    (img,) = chart.meta.images
    art = rt.artifacts.load(c.thread, img)
    assert art.kind == "deliverable" and (c.thread.artifacts_dir / art.file).read_bytes()[:4] == b"\x89PNG"
    assert not files.is_error, files.content
    saved = [a for a in files.meta.artifacts if a.file == "rep/summary.csv"]
    assert saved and (c.thread.artifacts_dir / f"{saved[0].id}.csv").read_text() == "a,b\n1,2\n"
    assert "leak is not a regular file" in files.content and "pipe is not a regular file" in files.content
    assert all(a.file not in ("leak", "pipe") for a in files.meta.artifacts)
    assert again.meta.artifacts is None  # unchanged files are not registered twice


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_timeouts_floods_and_exit(home: Path, backend: str) -> None:
    rt = make_rt(home, backend)
    c = ctx(rt)

    async def body():
        err = await py(rt, c, "def f():\n    return 1 / 0\nf()")
        loop = await py(rt, c, "x = 41\nwhile True:\n    pass", timeout_s=1)
        alive = await py(rt, c, "x + 1")
        flood = await py(rt, c, "for i in range(300000):\n    print('line', i)")
        exit_ = await py(rt, c, "import sys\nsys.exit(3)")
        after = await py(rt, c, "x")
        return err, loop, alive, flood, exit_, after

    err, loop, alive, flood, exit_, after = run_with(rt, body)
    assert err.is_error and "ZeroDivisionError: division by zero" in err.content and "\x1b[" not in err.content
    assert "f()" in err.content and "ipykernel" not in err.content
    assert loop.is_error and "TIMEOUT" in loop.content
    assert alive.content.count("42") == 1 and not alive.is_error
    assert "chars cut" in flood.content and "line 299999" in flood.content and "line 0" in flood.content
    out_art = next(a for a in flood.meta.artifacts if a.file == "output.txt")
    full = (c.thread.artifacts_dir / f"{out_art.id}.txt").read_text()
    assert full.count("\n") == 300_000
    assert exit_.is_error and "SystemExit" in exit_.content
    assert "41" in after.content  # the kernel survived sys.exit


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_killed_from_inside_or_outside_restarts_with_notice(home: Path, backend: str) -> None:
    rt = make_rt(home, backend)
    c = ctx(rt)

    async def body():
        await py(rt, c, "x = 1")
        died = await py(rt, c, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        fresh = await py(rt, c, "print('x' in globals())")
        session = rt.kernels.sessions[("demo", "alice", "t1")]
        if backend == "docker":
            await asyncio.to_thread(session.kernel._container.kill)
        else:
            import os as _os
            import signal as _sig
            _os.killpg(session.kernel.pid, _sig.SIGKILL)
        for _ in range(500):  # until the kernel is seen dead (at most ~10 s)
            if not await session.kernel.is_alive():
                break
            await asyncio.sleep(0.02)
        after_outside = await py(rt, c, "1")
        return died, fresh, after_outside

    died, fresh, after_outside = run_with(rt, body)
    assert died.is_error and "died" in died.content.lower()
    assert "a new Python kernel was started" in fresh.content and "False" in fresh.content
    assert "reload what you need from /data" in fresh.content
    assert not after_outside.is_error and "a new Python kernel was started" in after_outside.content


@pytest.mark.parametrize("backend", BACKENDS)
def test_reaper_reclaims_idle_and_old_kernels_with_notice(home: Path, backend: str) -> None:
    rt = make_rt(home, backend, idle_timeout_s=0.5, max_lifetime_s=600, reap_interval_s=0.2)
    c = ctx(rt)

    async def body():
        key = ("demo", "alice", "t1")
        await py(rt, c, "y = 5")
        await until(lambda: key not in rt.kernels.sessions)  # the real reaper task runs every 0.2 s
        gone = key not in rt.kernels.sessions
        idle = await py(rt, c, "print('y' in globals())")
        rt.kernels.settings.idle_timeout_s = 600
        rt.kernels.settings.max_lifetime_s = 1
        await until(lambda: key not in rt.kernels.sessions)
        old = await py(rt, c, "1")
        return gone, idle, old

    gone, idle, old = run_with(rt, body)
    assert gone
    assert "reclaimed: idle for more than" in idle.content and "False" in idle.content
    assert "lifetime" in old.content


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_and_per_user_cap(home: Path, backend: str) -> None:
    rt = make_rt(home, backend, pool_size=1, max_kernels_per_user=2)

    async def body():
        await rt.start()
        try:
            for _ in range(200):
                if rt.kernels.pool:
                    break
                await asyncio.sleep(0.05)
            pooled = rt.kernels.pool[0].placement.kernel_id
            t0 = time.perf_counter()
            first = await py(rt, ctx(rt, tid="t1"), "1")
            first_ms = (time.perf_counter() - t0) * 1000
            used = rt.kernels.sessions[("demo", "alice", "t1")].placement.kernel_id
            await py(rt, ctx(rt, tid="t2"), "2")
            third = await py(rt, ctx(rt, tid="t3"), "3")  # cap 2: t1 (LRU, idle) is reclaimed
            back = await py(rt, ctx(rt, tid="t1"), "4")
            for _ in range(200):
                if rt.kernels.pool:
                    break
                await asyncio.sleep(0.05)
            refill = rt.kernels.pool[0].placement.kernel_id if rt.kernels.pool else None
            return pooled, used, first, first_ms, third, back, refill
        finally:
            await rt.stop()

    pooled, used, first, first_ms, third, back, refill = asyncio.run(body())
    assert used == pooled and not first.is_error
    assert refill and refill != pooled  # a used kernel never returns to the pool
    assert not third.is_error
    assert "kernel limit was reached" in back.content


def test_other_threads_data_is_not_visible_and_expired_paths_offer_requery(home: Path) -> None:
    rt = make_rt(home, "local")
    mine, other = ctx(rt, tid="t1"), ctx(rt, tid="t2")
    (other.thread.artifacts_dir / "aotherthread0001.txt").write_text("secret of t2")
    (mine.thread.artifacts_dir / "amine00000000001.txt").write_text("mine")

    async def body():
        own = await py(rt, mine, "print(open('/data/amine00000000001.txt').read())")
        theirs = await py(rt, mine, "print(open('/data/aotherthread0001.txt').read())")
        return own, theirs

    own, theirs = run_with(rt, body)
    assert "mine" in own.content
    assert theirs.is_error and "secret" not in theirs.content and "no artifact aotherthread0001" in theirs.content


@pytest.mark.parametrize("backend", BACKENDS)
def test_pooled_kernel_sees_only_its_threads_data_and_expired_paths_offer_requery(home: Path, backend: str) -> None:
    rt = make_rt(home, backend, pool_size=1)
    c = ctx(rt)

    async def body():
        await rt.start()
        try:
            for _ in range(200):
                if rt.kernels.pool:
                    break
                await asyncio.sleep(0.05)
            assert rt.kernels.pool, "the pool did not fill"
            sql = json.dumps({"sql": "SELECT * FROM readings WHERE building_id = 'B03'"})
            raw = await rt.tools.run("sql_query", sql, c)
            from tests.fakes.sandbox import FakeSandbox  # noqa: F401  (real python tool registered)
            from datadesk.offload.pipeline import OffloadCapability

            out = await rt.offload.process(rt.tools.get("sql_query").spec, raw, c.thread,
                                           c.origin("tool", "sql_query", sql), OffloadCapability(True))
            aid = out.artifact.id
            read = await py(rt, c, f"import pandas as pd\nlen(pd.read_parquet('/data/{aid}.parquet'))")
            rt.artifacts.expire(c.thread, aid)
            expired = await py(rt, c, f"import os\nos.path.exists('/data/{aid}.parquet')")
            return aid, read, expired
        finally:
            await rt.stop()

    aid, read, expired = asyncio.run(body())
    assert "9528" in read.content  # 24 h x 397 days of one building
    assert f"artifact {aid} has expired" in expired.content and f'requery_artifact("{aid}")' in expired.content
    assert "False" in expired.content  # the evicted file is gone from /data too


@pytest.mark.docker
def test_orphan_containers_of_an_earlier_run_are_removed(home: Path) -> None:
    import docker

    from datadesk.sandbox.backends.docker.container import DockerSandbox
    from datadesk.settings import SandboxSettings

    client = docker.from_env()
    labels = DockerSandbox(SandboxSettings(backend="docker"), home).labels("korphan")
    labels["datadesk.owner"] = "gone-host:1"
    orphan = client.containers.run(SandboxSettings().image, ["sleep", "300"], detach=True, labels=labels,
                                   network_mode="none")
    other = client.containers.run(SandboxSettings().image, ["sleep", "300"], detach=True, network_mode="none",
                                  labels={**labels, "datadesk.home": "another-data-dir"})
    try:
        rt = make_rt(home, "docker")
        run_with(rt, lambda: asyncio.sleep(0))
        ids = {c.id for c in client.containers.list(all=True)}
        assert orphan.id not in ids
        assert other.id in ids  # another installation's containers are left alone
    finally:
        for c in (orphan, other):
            try:
                c.remove(force=True)
            except Exception:
                pass


def test_serve_refuses_the_local_sandbox_when_it_would_be_shared(tmp_path: Path) -> None:
    from datadesk.cli import local_sandbox_problem
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore

    s = Settings(home=tmp_path)
    users = UserStore(Layout(tmp_path))
    users.add("admin", ["demo"], ["code_execution", "admin"])
    assert local_sandbox_problem(s) is None
    s.server.host = "0.0.0.0"
    assert "0.0.0.0" in local_sandbox_problem(s)
    s.server.host = "127.0.0.1"
    users.add("bob", ["demo"], ["code_execution"])
    assert "2 users have code_execution" in local_sandbox_problem(s)
    s.sandbox.allow_unsafe_local = True
    assert local_sandbox_problem(s) is None
    s.sandbox.backend = "docker"
    s.sandbox.allow_unsafe_local = False
    assert local_sandbox_problem(s) is None


def test_only_code_execution_users_get_the_python_tool(harness_factory) -> None:
    model = ScriptedModel(then="ok")
    h = harness_factory(model, sandbox=sandbox_settings("local"))
    with serve_app(h.app()) as base:
        for user, expect in (("alice", True), ("bob", False)):
            with httpx.Client(base_url=base, headers=h.auth(user), timeout=60) as c:
                tid = c.post("/api/threads", json={}).json()["id"]
                c.post(f"/api/threads/{tid}/messages", json={"content": "hi"})
            names = [t["function"]["name"] for t in model.tools_seen[-1]]
            assert ("python" in names) is expect, (user, names)
