"""The gateway sandbox backend against a real `jupyter-kernel-gateway` on 127.0.0.1.

The gateway is a subprocess this module owns (stopped by PID), started with a
clean environment and an auth token. The app's data dir reaches kernels
through a different path (a symlink standing for the volume mount of a kernel
pod), so every test that reads `/data` or writes `/outputs` goes through the
path mapping. No Docker needed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import msgspec
import pytest

from datadesk.composition import Runtime
from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.sandbox.base import SandboxUnavailable
from datadesk.settings import SandboxSettings, Settings, SettingsError, load_settings
from tests.conftest import free_port, parse_sse, serve_app
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox

TOKEN = "gw-" + os.urandom(12).hex()
KEY = ("demo", "alice", "t1")


@dataclass
class Gateway:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def kernels(self) -> list[str]:
        r = httpx.get(f"{self.url}/api/kernels", headers={"Authorization": f"token {self.token}"}, timeout=10)
        r.raise_for_status()
        return [k["id"] for k in r.json()]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """`jupyter kernelgateway` on a free port, token required, a clean environment (no app secrets)."""
    import importlib.util

    if importlib.util.find_spec("kernel_gateway") is None:  # a failure, not a skip: CI must run these
        pytest.fail("jupyter-kernel-gateway is missing: pip install -e '.[test]'")
    root = tmp_path_factory.mktemp("gateway")
    for sub in ("home", "ipython", "mpl", "runtime"):
        (root / sub).mkdir()
    port = free_port()
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
        "IPYTHONDIR": str(root / "ipython"),
        "MPLCONFIGDIR": str(root / "mpl"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "KG_AUTH_TOKEN": TOKEN,  # the gateway removes it from kernel environments
        # what kernels inherit from the gateway process (besides PATH and KERNEL_* of the request)
        "KG_ENV_PROCESS_WHITELIST": "HOME,LANG,IPYTHONDIR,MPLCONFIGDIR",
    }
    log_path = root / "gateway.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
             f"--KernelGatewayApp.port={port}", "--JupyterWebsocketPersonality.list_kernels=True"],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            start_new_session=True)
    gw = Gateway(url=f"http://127.0.0.1:{port}", token=TOKEN, proc=proc, log=log_path)
    try:
        deadline = time.time() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter-kernel-gateway exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{gw.url}/api/kernelspecs", headers={"Authorization": f"token {TOKEN}"},
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail(f"jupyter-kernel-gateway did not answer: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield gw
        left = gw.kernels()
        assert not left, f"kernels left running on the gateway after the tests: {left}"
    finally:
        proc.terminate()  # it shuts its kernels down on SIGTERM
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def kernel_view(home: Path) -> Path:
    """Where kernels see the app's data dir: another name for the same directory (as a pod's mount)."""
    view = home.parent / "kernel-view"
    if not view.exists():
        view.symlink_to(home, target_is_directory=True)
    return view


def gateway_settings(gw: Gateway, home: Path, **kw) -> dict:
    return {"backend": "gateway", "pool_size": 0, "run_dir": tempfile.mkdtemp(prefix="ddr-"),
            "exec_timeout_s": 30, "start_timeout_s": 60, "gateway_url": gw.url, "gateway_token": gw.token,
            "gateway_shared_dir": str(home), "gateway_kernel_shared_dir": str(kernel_view(home)), **kw}


def make_rt(gw: Gateway, home: Path, **kw) -> Runtime:
    return runtime_with_sandbox(home, gateway_settings(gw, home, **kw))


# -- execution through the python tool --------------------------------------------------------

def test_execute_stdout_result_error_and_chart(gateway: Gateway, home: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    rt = make_rt(gateway, home)
    c = ctx(rt)

    async def body():
        out = await py(rt, c, "print('hello from the gateway')\nx = 20\nx * 2 + 2")
        err = await py(rt, c, "def f():\n    return 1 / 0\nf()")
        chart = await py(rt, c, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
        env = await py(rt, c, "import os, json\nprint(json.dumps(dict(os.environ)))")
        flood = await py(rt, c, "for i in range(100000):\n    print('line', i)")
        return out, err, chart, env, flood

    out, err, chart, env, flood = run_with(rt, body)
    assert not out.is_error and "hello from the gateway" in out.content and "42" in out.content
    assert err.is_error and "ZeroDivisionError: division by zero" in err.content and "f()" in err.content
    assert "\x1b[" not in err.content and "ipykernel" not in err.content
    (img,) = chart.meta.images
    art = rt.artifacts.load(c.thread, img)
    assert (c.thread.artifacts_dir / art.file).read_bytes()[:4] == b"\x89PNG"
    assert art.title == "t" and chart.meta.dark_images == {img: art.dark_variant}  # the house style
    kernel_env = json.loads(env.content.split("stdout:\n", 1)[1].strip())
    assert kernel_env["KERNEL_DATADESK_DATA_DIR"].startswith(str(kernel_view(home)))
    assert not any(TOKEN in v for v in kernel_env.values()) and "KG_AUTH_TOKEN" not in kernel_env
    assert "chars cut" in flood.content and "line 99999" in flood.content and "line 0" in flood.content
    out_art = next(a for a in flood.meta.artifacts if a.file == "output.txt")
    assert (c.thread.artifacts_dir / f"{out_art.id}.txt").read_text().count("\n") == 100_000
    assert TOKEN not in caplog.text  # not in any log record, websocket debug included


def test_timeout_interrupts_and_the_kernel_stays_usable(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home)
    c = ctx(rt)

    async def body():
        loop = await py(rt, c, "x = 41\nwhile True:\n    pass", timeout_s=1)
        alive = await py(rt, c, "x + 1")
        return loop, alive

    loop, alive = run_with(rt, body)
    assert loop.is_error and "TIMEOUT" in loop.content and "still there" in loop.content
    assert not alive.is_error and "42" in alive.content


def test_restart_gives_a_fresh_interpreter(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home)
    c = ctx(rt)

    async def body():
        await py(rt, c, "x = 1")
        backend = rt.kernels.sessions[KEY].kernel
        before = backend.remote_id
        await backend.restart()
        after = await py(rt, c, "print('x' in globals())\nopen('after.txt', 'w').write('cwd = outputs')")
        return before, backend.remote_id, after

    before, after_id, after = run_with(rt, body)
    assert before == after_id  # the gateway's restart: same kernel, new process
    assert not after.is_error and "False" in after.content
    # the working dir (the outputs dir) is set again after the restart
    assert [a.file for a in after.meta.artifacts] == ["after.txt"]


def test_kernel_killed_is_reported_and_replaced_with_notice(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home)
    c = ctx(rt)

    async def body():
        await py(rt, c, "x = 1")
        died = await py(rt, c, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        fresh = await py(rt, c, "print('x' in globals())")
        return died, fresh

    died, fresh = run_with(rt, body)
    assert died.is_error and "died" in died.content.lower()
    assert "a new Python kernel was started" in fresh.content and "False" in fresh.content


def test_reaper_reclaims_and_the_gateway_no_longer_lists_the_kernel(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home, idle_timeout_s=0.5, max_lifetime_s=600, reap_interval_s=0.2)
    c = ctx(rt)

    async def body():
        await py(rt, c, "y = 5")
        remote = rt.kernels.sessions[KEY].kernel.remote_id
        listed = remote in await asyncio.to_thread(gateway.kernels)
        for _ in range(100):  # the real reaper task runs every 0.2 s
            still = remote in await asyncio.to_thread(gateway.kernels)
            if not still:
                break
            await asyncio.sleep(0.1)
        again = await py(rt, c, "print('y' in globals())")
        return listed, still, again

    listed, still, again = run_with(rt, body)
    assert listed and not still
    assert "reclaimed: idle for more than" in again.content and "False" in again.content


# -- two app workers: the second reaches the first one's gateway kernel --------------------------

WORKER = """
import asyncio, json, sys
from pathlib import Path
import msgspec
from datadesk.sandbox.backends import build_kernel_registry
from datadesk.settings import Settings
from datadesk.store.layout import Layout

async def main():
    settings = msgspec.json.decode(sys.stdin.readline().encode(), type=Settings, dec_hook=lambda t, o: Path(o))
    reg = build_kernel_registry(settings, Layout(settings.home))
    await reg.start()
    ex = await reg.execute(("demo", "u", "t1"), "x = 41", 30, artifacts_dir=None)
    print(json.dumps({"status": ex.result.status, "remote": reg.sessions[("demo", "u", "t1")].kernel.remote_id}),
          flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # until told to stop
    await reg.stop()
    print(json.dumps({"stopped": True}), flush=True)

asyncio.run(main())
"""


def test_another_worker_attaches_to_the_gateway_kernel_its_owner_stops_it(gateway: Gateway, home: Path) -> None:
    from datadesk.sandbox.backends import build_kernel_registry
    from datadesk.store.layout import Layout

    settings = msgspec.convert({"home": str(home), "sandbox": gateway_settings(
        gateway, home, heartbeat_s=0.2, owner_stale_s=10, reap_interval_s=3600)}, Settings,
        dec_hook=lambda t, o: Path(o))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root / 'platform'}{os.pathsep}{root}"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        # the settings (with the token) go through stdin, not the command line
        worker.stdin.write(msgspec.json.encode(settings, enc_hook=str).decode() + "\n")
        worker.stdin.flush()
        first = json.loads(worker.stdout.readline())
        assert first["status"] == "ok", first

        async def second_worker():
            reg = build_kernel_registry(settings, Layout(home))
            await reg.start()
            try:
                ex = await reg.execute(("demo", "u", "t1"), "x + 1", 30, artifacts_dir=None)
                kernel = reg.sessions[("demo", "u", "t1")].kernel  # the kernel that ran it
                return ex.result.result, ex.notices, kernel.attached, kernel.remote_id
            finally:
                await reg.stop()  # lets go of the other worker's kernel, never stops it

        result, notices, attached, remote = asyncio.run(second_worker())
        assert result == "42" and notices == [] and attached and remote == first["remote"]
        assert first["remote"] in gateway.kernels()
        worker.stdin.write("stop\n")
        worker.stdin.flush()
        assert json.loads(worker.stdout.readline()) == {"stopped": True}
        worker.wait(30)
        assert first["remote"] not in gateway.kernels()  # its owner stopped it
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


# -- files: /data and /outputs through the shared volume --------------------------------------

def test_data_and_outputs_cross_through_the_path_mapping(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home)
    c = ctx(rt)
    origin = ArtifactOrigin(source="tool", user="alice", thread="t1", workspace="demo", call_id="c0")
    art = rt.artifacts.save_bytes(c.thread, b"region,sales\nnorth,3\nsouth,4\n", "csv", "result",
                                  "text/csv", origin)

    async def body():
        read = await py(rt, c, f"import pandas as pd\npath = '/data/{art.id}.csv'\nprint(path)\n"
                               "df = pd.read_csv(path)\nint(df.sales.sum())")
        wrote = await py(rt, c, "import os\nos.makedirs('/outputs/rep', exist_ok=True)\n"
                                "df.to_csv('/outputs/rep/summary.csv', index=False)\n"
                                "open('plain.txt', 'w').write('relative path lands in outputs')\n"
                                "os.symlink('/etc/passwd', '/outputs/leak')\n'ok'")
        return read, wrote

    read, wrote = run_with(rt, body)
    assert not read.is_error and "7" in read.content, read.content
    assert f"{kernel_view(home)}/sandbox/slots/" in read.content  # the kernel read it at the kernel-side path
    assert not wrote.is_error, wrote.content
    files = {a.file: a for a in wrote.meta.artifacts}
    assert (c.thread.artifacts_dir / f"{files['rep/summary.csv'].id}.csv").read_text() == \
        "region,sales\nnorth,3\nsouth,4\n"
    assert "plain.txt" in files
    assert "leak is not a regular file" in wrote.content and "leak" not in files


def test_a_wrong_kernel_side_path_is_a_clear_error(gateway: Gateway, home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "not-the-volume"
    elsewhere.mkdir()
    rt = make_rt(gateway, home, gateway_kernel_shared_dir=str(elsewhere))
    c = ctx(rt)

    async def body():
        before = set(await asyncio.to_thread(gateway.kernels))
        out = await py(rt, c, "1")
        return out, set(await asyncio.to_thread(gateway.kernels)) - before

    out, started = run_with(rt, body)
    assert out.is_error and "sandbox.gateway_kernel_shared_dir" in out.content and str(elsewhere) in out.content
    assert not started  # the kernel that could not see the files was stopped


def test_full_turn_through_the_api_aggregates_in_a_gateway_kernel(gateway: Gateway, harness_factory,
                                                                  home: Path) -> None:
    def aggregate(messages, tools):
        tool_msg = [m for m in messages if m["role"] == "tool"][-1]["content"]
        aid = re.search(r"artifact (a[0-9a-f]+)", tool_msg).group(1)
        return tool_step("python", {"code": f"import duckdb\nduckdb.sql(\"SELECT count(*) FROM "
                                             f"'/data/{aid}.parquet'\").fetchall()"}, call_id="call_py")

    model = ScriptedModel([tool_step("sql_query", {"sql": "SELECT * FROM readings"}, call_id="call_sql"),
                           aggregate, "done"])
    h = harness_factory(model, sandbox=gateway_settings(gateway, home))
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=120) as client:
        tid = client.post("/api/threads", json={}).json()["id"]
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "how many?"}).text)
    fins = {d["call_id"]: d for e, d in events if e == "tool.finished"}
    assert "[(190560,)]" in fins["call_py"]["preview"], fins["call_py"]


# -- the gateway refusing, or not there ----------------------------------------------------------

def test_a_wrong_or_missing_token_is_a_clear_error(gateway: Gateway, home: Path) -> None:
    for token, words in (("not-the-token", "rejected the token"), ("", "requires a token")):
        rt = make_rt(gateway, home, gateway_token=token)
        out = run_with(rt, lambda: py(rt, ctx(rt), "1"))
        assert out.is_error and words in out.content and "DATADESK_GATEWAY_TOKEN" in out.content
        assert TOKEN not in out.content


def test_an_unknown_kernelspec_is_named(gateway: Gateway, home: Path) -> None:
    rt = make_rt(gateway, home, gateway_kernel_name="julia-9")
    out = run_with(rt, lambda: py(rt, ctx(rt), "1"))
    assert out.is_error and "no kernelspec 'julia-9'" in out.content and "python3" in out.content


def test_an_unreachable_gateway_is_sandbox_unavailable(home: Path) -> None:
    gw = Gateway(url=f"http://127.0.0.1:{free_port()}", token="some-token", proc=None, log=Path("/dev/null"))  # type: ignore[arg-type]
    rt = make_rt(gw, home)

    async def body():
        with pytest.raises(SandboxUnavailable) as info:
            await rt.kernels.execute(KEY, "1", artifacts_dir=None)
        return str(info.value)

    message = run_with(rt, body)
    assert "the Jupyter gateway at http://127.0.0.1:" in message and "not reachable" in message
    assert rt.sandbox_health()[0] is False


# -- settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"gateway_url": ""}, "sandbox.gateway_url is required"),
    ({"gateway_url": "ftp://gw"}, "http:// or https://"),
    ({"gateway_url": "http://gw:8888/?token=abc"}, "must not carry credentials"),
    ({"gateway_kernel_shared_dir": "relative/dir"}, "sandbox.gateway_kernel_shared_dir must be an absolute path"),
    ({"gateway_kernel_shared_dir": "/mnt/it's"}, "sandbox.gateway_kernel_shared_dir"),
    ({"gateway_shared_dir": "/somewhere/else"}, "must contain the kernel slots directory"),
    ({"gateway_kernel_env": {"PATH": "/x"}}, "not a KERNEL_* variable name"),
    ({"gateway_kernel_env": {"KERNEL_DATADESK_SLOT": "x"}}, "set by DataDesk itself"),
    ({"gateway_kernel_env": {"KERNEL_X": "tok-123"}, "gateway_token": "tok-123"}, "contains the gateway token"),
    ({"gateway_kernel_name": "a b"}, "sandbox.gateway_kernel_name"),
    ({"gateway_files": "s3"}, 'sandbox.gateway_files must be "auto", "volume" or "presigned"'),
    ({"gateway_files": "presigned"}, "it needs the cluster set (cluster.database_url and storage.url)"),
    ({"gateway_kernel_files_dir": "rel/dir"}, "sandbox.gateway_kernel_files_dir must be an absolute path"),
])
def test_bad_gateway_settings_are_named(tmp_path: Path, change: dict, words: str) -> None:
    from datadesk.sandbox.backends.gateway.remote import GatewayConfig

    sb = SandboxSettings(**{"backend": "gateway", "gateway_url": "http://gw:8888", **change})
    with pytest.raises(SettingsError, match=re.escape(words)):
        GatewayConfig.from_settings(sb, tmp_path)


def test_the_token_comes_from_the_environment_and_maps_paths(tmp_path: Path) -> None:
    from datadesk.sandbox.backends.gateway.remote import GatewayConfig

    s = load_settings({"DATADESK_HOME": str(tmp_path), "DATADESK_GATEWAY_TOKEN": "from-env"})
    assert s.sandbox.gateway_token == "from-env"
    sb = SandboxSettings(backend="gateway", gateway_url="https://gw.example:8443/eg/", gateway_token="from-env",
                         gateway_kernel_shared_dir="/mnt/datadesk")
    cfg = GatewayConfig.from_settings(sb, tmp_path)
    assert cfg.headers == {"Authorization": "token from-env"}
    assert cfg.ws_url("abc-1") == "wss://gw.example:8443/eg/api/kernels/abc-1/channels"
    slot = tmp_path / "sandbox" / "slots" / "k01" / "data"
    assert cfg.kernel_path(slot) == "/mnt/datadesk/sandbox/slots/k01/data"
    with pytest.raises(SandboxUnavailable, match="outside sandbox.gateway_shared_dir"):
        cfg.kernel_path(tmp_path.parent / "elsewhere")


def test_orphan_sweep_stops_only_kernels_whose_owner_worker_is_gone(gateway: Gateway, home: Path) -> None:
    """A crashed worker's kernels are stopped; a live worker's (a fresh heartbeat) stay."""
    from datadesk.sandbox.backends.gateway.remote import GatewaySandbox
    from datadesk.sandbox.ownership import Heartbeat, this_worker

    sb = msgspec.convert(gateway_settings(gateway, home, owner_stale_s=30), SandboxSettings)
    gs = GatewaySandbox(sb, home)
    auth = {"Authorization": f"token {gateway.token}"}
    started = [httpx.post(f"{gateway.url}/api/kernels", json={"name": "python3"}, headers=auth, timeout=60).json()["id"]
               for _ in range(2)]
    try:
        Heartbeat(home, 1.0).beat()  # this worker is alive
        gs.record("slot-live", started[0])
        assert gs.owner == this_worker().id
        gs.owner = "w999999-dead00"  # a worker that never beat (crashed before, or long gone)
        gs.record("slot-dead", started[1])
        (gs.records_dir / "slot-torn.json").write_text("{not json")
        assert gs.remove_orphans() == 1
        left = gateway.kernels()
        assert started[0] in left and started[1] not in left
        assert gs.recorded("slot-live") == started[0] and gs.recorded("slot-dead") is None
        assert not (gs.records_dir / "slot-torn.json").exists()
    finally:
        for kid in started:
            httpx.delete(f"{gateway.url}/api/kernels/{kid}", headers=auth, timeout=30)
