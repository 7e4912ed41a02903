"""LocalKernel + messaging against real ipykernel subprocesses.

One shared kernel for most tests, driven by a single event loop (the
AsyncKernelClient sockets and the subprocess watcher are bound to it); the
memory-limit and shutdown tests start their own kernels.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Coroutine, Iterator

import pytest

from datadesk.sandbox.base import KernelPlacement, SandboxError
from datadesk.sandbox.execution import (
    HEAD_CHARS,
    TAIL_CHARS,
    _OutputCapper,
    strip_ansi,
    trim_traceback,
)
from datadesk.sandbox.backends.local import landlock
from datadesk.sandbox.backends.local.process import LocalKernel, LocalSandbox
from datadesk.sandbox.messaging import write_connection_file

SECRETS = {"DATADESK_LLM_API_KEY": "sk-secret", "OPENAI_API_KEY": "sk-openai-secret"}


def _placement(root: Path, kernel_id: str = "k") -> KernelPlacement:
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "a.txt").write_text("hello from data\n")
    return KernelPlacement(
        kernel_id=kernel_id, data_dir=data, outputs_dir=root / "outputs", run_dir=root / "run"
    )


def _short_tmp() -> Path:
    # Unix socket paths must stay short; pytest's tmp_path can be long.
    return Path(tempfile.mkdtemp(prefix="ddk-"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody reaped yet (e.g. reparented to a non-reaping PID 1) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


class Harness:
    def __init__(self, kernel: LocalKernel, loop: asyncio.AbstractEventLoop, root: Path):
        self.k = kernel
        self.loop = loop
        self.root = root

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def ex(self, code: str, timeout_s: float = 30):
        return self.run(self.k.execute(code, timeout_s))

    def ensure_alive(self) -> None:
        if not self.run(self.k.is_alive()):
            self.run(self.k.restart())


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    saved = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    root = _short_tmp()
    loop = asyncio.new_event_loop()
    (root / "users.json").write_text('{"secret": "app home"}')
    kernel = LocalKernel(_placement(root), hidden=[root])  # confined as in the app: root is its home
    try:
        loop.run_until_complete(kernel.start())
        yield Harness(kernel, loop, root)
    finally:
        loop.run_until_complete(kernel.shutdown())
        loop.close()
        shutil.rmtree(root, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- no kernel


def test_connection_file(tmp_path: Path) -> None:
    run = _short_tmp()
    try:
        kinfo, hinfo = write_connection_file(run, "/run/kernel/k")
        on_disk = (run / "connection.json").read_text()
        assert '"transport": "ipc"' in on_disk
        assert kinfo["ip"] == "/run/kernel/k" and hinfo["ip"] == str(run / "k")
        assert kinfo["key"] == hinfo["key"] and len(kinfo["key"]) >= 32
        assert kinfo["signature_scheme"] == "hmac-sha256"
        assert {kinfo[p] for p in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")} == {
            1, 2, 3, 4, 5,
        }
        assert oct((run / "connection.json").stat().st_mode & 0o777) == "0o600"
        again, _ = write_connection_file(run, "/run/kernel/k")
        assert again["key"] != kinfo["key"]
    finally:
        shutil.rmtree(run, ignore_errors=True)
    deep = tmp_path / ("x" * 90)
    with pytest.raises(SandboxError, match="too long"):
        write_connection_file(deep, str(deep / "k"))


def test_strip_ansi_and_trim_traceback() -> None:
    assert strip_ansi("\x1b[0;31mZeroDivisionError\x1b[0m: x\x1b]8;;http://a\x07l\x1b]8;;\x07") == (
        "ZeroDivisionError: xl"
    )
    tb = [
        "\x1b[0;31m---------------------------------------------------------------------------\x1b[0m",
        "\x1b[0;31mValueError\x1b[0m                         Traceback (most recent call last)",
        "Cell \x1b[0;32mIn[1], line 1\x1b[0m\n----> 1 f()\n",
        "File \x1b[0;32m/usr/lib/python3/site-packages/IPython/core/interactiveshell.py:2478\x1b[0m, in run\n  x\n",
        "  File /x/site-packages/ipykernel/ipkernel.py:1 in f\n    y\n",
        "Cell \x1b[0;32mIn[1], line 1\x1b[0m, in f()\n----> 1 def f(): raise ValueError('bad')\n",
        "\x1b[0;31mValueError\x1b[0m: bad",
    ]
    out = trim_traceback(tb)
    text = "\n".join(out)
    assert "\x1b" not in text and "IPython" not in text and "ipykernel" not in text
    assert out[0] == "Traceback (most recent call last):"
    assert "Cell In[1], line 1, in f()" in text
    assert out[-1] == "ValueError: bad"
    deep = ["Traceback (most recent call last):\n"] + [f"  File /lib/m{i}.py:1 in g\n    g()\n" for i in range(100)]
    capped = trim_traceback(deep + ["RecursionError: deep\n"])
    assert len(capped) <= 40 and capped[-1] == "RecursionError: deep"
    assert any("omitted" in line for line in capped)
    rec = trim_traceback(["  Cell In[4], line 1 in r\n    r()\n"] * 50 + ["RecursionError: x"])
    assert rec == ["  Cell In[4], line 1 in r", "    r()", "  [previous frame repeated 49 more times]", "RecursionError: x"]


def test_output_capper_memory_is_bounded(tmp_path: Path) -> None:
    cap = _OutputCapper(tmp_path, HEAD_CHARS, TAIL_CHARS, 50 << 20)
    chunk = "".join(f"{i}\n" for i in range(10_000))  # ~49 KB
    tracemalloc.start()
    try:
        for _ in range(200):  # ~10 MB in total
            cap.add("stdout", chunk)
        cap.add("stderr", "the end\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    stdout, stderr, truncated, total, path = cap.finish()
    assert truncated and total == 200 * len(chunk) + len("the end\n")
    assert stdout.startswith("0\n1\n2\n") and "characters omitted" in stdout
    assert stderr == "the end\n"
    assert len(stdout) + len(stderr) < HEAD_CHARS + TAIL_CHARS + 200
    assert path is not None and path.stat().st_size == total


def test_output_capper_head_tail_exact(tmp_path: Path) -> None:
    cap = _OutputCapper(tmp_path, head_chars=5, tail_chars=5, file_cap_bytes=1 << 20)
    cap.add("stdout", "0123456789")
    cap.add("stderr", "abc")
    stdout, stderr, truncated, total, path = cap.finish()
    assert stdout == "01234\n... [3 characters omitted] ...\n89"
    assert stderr == "abc" and truncated and total == 13
    assert path is not None and path.read_text() == "0123456789abc"
    small = _OutputCapper(tmp_path, head_chars=5, tail_chars=5, file_cap_bytes=1 << 20)
    small.add("stdout", "01234567")
    assert small.finish() == ("01234567", "", False, 8, None)  # nothing cut: no file kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output-1.txt"]


def test_without_landlock_no_local_kernel_starts_unless_allowed(tmp_path: Path) -> None:
    from datadesk.settings import SandboxSettings

    sandbox = LocalSandbox(SandboxSettings(backend="local"), tmp_path)
    sandbox.landlock_abi = 0  # a host without Landlock
    assert "no Landlock" in (sandbox.confinement_problem() or "")
    with pytest.raises(Exception, match="allow_unsafe_local"):
        sandbox.kernel(_placement(tmp_path))
    trusted = LocalSandbox(SandboxSettings(backend="local", allow_unsafe_local=True), tmp_path)
    trusted.landlock_abi = 0
    assert trusted.confinement_problem() is None and trusted.kernel(_placement(tmp_path)).hidden is None
    confined = LocalSandbox(SandboxSettings(backend="local"), tmp_path)
    if confined.landlock_abi:
        assert confined.kernel(_placement(tmp_path)).hidden == [tmp_path]


def test_rewrite_paths_without_starting(tmp_path: Path) -> None:
    k = LocalKernel(_placement(tmp_path))
    p = k.placement
    code = "a = open('/data/a.txt')\nb = \"/outputs/x.png\"\nc = Path('/outputs')\nd = '/database/x'\ne = f\"/data/{n}\""
    out = k.rewrite_paths(code)
    assert f"open('{p.data_dir}/a.txt')" in out
    assert f'"{p.outputs_dir}/x.png"' in out
    assert f"Path('{p.outputs_dir}')" in out
    assert "'/database/x'" in out  # only whole path components
    assert f'f"{p.data_dir}/{{n}}"' in out


# --------------------------------------------------------------------------- shared kernel


def test_result_stdout_stderr(h: Harness) -> None:
    r = h.ex("1+1")
    assert r.status == "ok" and r.result == "2" and r.stdout == "" and r.error is None
    r = h.ex("import sys\nprint('hello')\nprint('oops', file=sys.stderr)")
    assert r.status == "ok" and r.stdout == "hello\n" and r.stderr == "oops\n" and r.result is None
    assert not r.output_truncated and r.stdout_file is None and r.output_chars == len("hello\noops\n")


def test_error_is_trimmed_and_plain(h: Harness) -> None:
    r = h.ex("def f(x):\n    return x / 0\n\nf(1)")
    assert r.status == "error" and r.error is not None
    assert r.error.ename == "ZeroDivisionError" and r.error.evalue == "division by zero"
    tb = "\n".join(r.error.traceback)
    assert "\x1b" not in tb and "ipykernel" not in tb and "IPython" not in tb
    assert "return x / 0" in tb and r.error.traceback[-1] == "ZeroDivisionError: division by zero"
    assert h.ex("2+3").result == "5"  # the kernel carries on


def test_the_kernel_is_kept_out_of_the_apps_home_and_processes(h: Harness) -> None:
    """Landlock (issue 15): the kernel reads its data and writes its outputs, never the app's home
    (users.json), never another process's /proc entry (the app's environment), nor signals it."""
    r = h.ex(f"print(open({str(h.root / 'data' / 'a.txt')!r}).read().strip())\n"
             f"open({str(h.root / 'outputs' / 'ok.txt')!r}, 'w').write('fine')\n"
             "import os, pathlib\n"
             f"home = pathlib.Path({str(h.root)!r})\n"
             "def tries(fn):\n"
             "    try:\n        fn(); return 'allowed'\n"
             "    except PermissionError: return 'denied'\n"
             "print(tries(lambda: (home / 'users.json').read_text()))\n"
             "print(tries(lambda: (home / 'forged.json').write_text('{}')))\n"
             "print(tries(lambda: open(f'/proc/{os.getppid()}/environ').read()))\n"
             "print(tries(lambda: os.kill(os.getppid(), 0)))\n"
             "print(open('/proc/self/status').read()[:4])")
    assert r.status == "ok", r
    lines = r.stdout.split("\n")
    assert lines[0] == "hello from data"
    assert lines[1:4] == ["denied", "denied", "denied"], r.stdout
    assert lines[4] == ("denied" if landlock.abi_version() >= 6 else lines[4])  # signal scoping: ABI 6
    assert lines[5] == "Name"
    assert (h.root / "outputs" / "ok.txt").read_text() == "fine" and not (h.root / "forged.json").exists()


def test_matplotlib_png(h: Harness) -> None:
    r = h.ex("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
    assert r.status == "ok", r
    assert len(r.images) == 1 and r.images[0].startswith(b"\x89PNG")
    r = h.ex("fig, ax = plt.subplots()\nax.bar([1], [2])\ndisplay(fig)\nplt.close(fig)")
    assert r.status == "ok" and len(r.images) == 1 and r.images[0].startswith(b"\x89PNG")


def test_output_flood_is_capped(h: Harness) -> None:
    n = 200_000
    r = h.ex(f"for i in range({n}): print(i)", timeout_s=60)
    assert r.status == "ok"
    full = "".join(f"{i}\n" for i in range(n))
    assert r.output_truncated and r.output_chars == len(full)
    assert r.stdout.startswith("0\n1\n2\n3\n") and r.stdout.endswith(f"{n - 2}\n{n - 1}\n")
    assert "characters omitted" in r.stdout
    assert len(r.stdout) < HEAD_CHARS + TAIL_CHARS + 200
    assert r.stdout_file is not None and r.stdout_file.read_text() == full


def test_timeout_interrupts_and_kernel_survives(h: Harness) -> None:
    h.ensure_alive()
    assert h.ex("kept = 41").status == "ok"
    t0 = time.monotonic()
    r = h.ex("print('started')\nwhile True:\n    pass", timeout_s=1)
    assert r.status == "timeout", r
    assert time.monotonic() - t0 < 6
    assert "started" in r.stdout
    assert r.error is not None and r.error.ename == "KeyboardInterrupt"
    r = h.ex("kept + 1")
    assert r.status == "ok" and r.result == "42"  # interrupted, not restarted


def test_interrupt_ignored_means_restart(h: Harness) -> None:
    h.ensure_alive()
    assert h.ex("lost = 1").status == "ok"
    old_pid = h.k.pid
    h.k.interrupt_grace_s = 1.0
    try:
        r = h.ex("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", timeout_s=1)
    finally:
        del h.k.interrupt_grace_s
    assert r.status == "timeout" and "restarted" in r.note
    assert h.k.pid != old_pid and h.run(h.k.is_alive())
    r = h.ex("lost")
    assert r.status == "error" and r.error is not None and r.error.ename == "NameError"


def test_clean_environment_and_cwd(h: Harness) -> None:
    h.ensure_alive()
    r = h.ex("import os\nprint(dict(os.environ))\nprint(os.getcwd())")
    assert r.status == "ok"
    for name, value in SECRETS.items():
        assert os.environ[name] == value  # set in this (test) process...
        assert name not in r.stdout and value not in r.stdout  # ...but not in the kernel
    env = eval(r.stdout.splitlines()[0])  # noqa: S307 - our own kernel's dict repr
    assert env["HOME"].startswith(str(h.k.placement.run_dir))
    assert env["PYTHONNOUSERSITE"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["LC_ALL"] == "C.UTF-8" and "MPLBACKEND" in env
    assert r.stdout.splitlines()[1] == str(h.k.placement.outputs_dir)


def test_paths_map_to_placement(h: Harness) -> None:
    h.ensure_alive()
    code = 'open("/outputs/x.txt", "w").write("written")\nprint(open("/data/a.txt").read(), end="")'
    r = h.ex(h.k.rewrite_paths(code))
    assert r.status == "ok", r
    assert r.stdout == "hello from data\n"
    assert (h.k.placement.outputs_dir / "x.txt").read_text() == "written"
    r = h.ex("open('rel.txt', 'w').write('x')")  # cwd is the outputs dir
    assert (h.k.placement.outputs_dir / "rel.txt").exists()


def test_sys_exit_and_exit(h: Harness) -> None:
    h.ensure_alive()
    r = h.ex("import sys\nsys.exit(3)")
    assert r.status == "error" and r.error is not None and r.error.ename == "SystemExit"
    assert h.ex("1+1").result == "2"  # same kernel, still working
    # IPython's exit() asks ipykernel to stop: the process exits (code 0) shortly after.
    h.ex("exit()")
    deadline = time.monotonic() + 10
    while h.run(h.k.is_alive()) and time.monotonic() < deadline:
        h.run(asyncio.sleep(0.05))
    assert not h.run(h.k.is_alive())
    assert h.run(h.k.death_reason()) == "exited with code 0"
    r = h.ex("1+1")
    assert r.status == "died" and "exited with code 0" in r.note
    h.run(h.k.restart())
    assert h.ex("1+1").result == "2"


def test_kill_9_reports_died_and_restart_clears_state(h: Harness) -> None:
    h.ensure_alive()
    assert h.ex("survivor = 1").status == "ok"
    old_pid = h.k.pid
    t0 = time.monotonic()
    r = h.ex("import os\nprint('bye', flush=True)\nos.kill(os.getpid(), 9)", timeout_s=30)
    assert r.status == "died", r
    assert time.monotonic() - t0 < 5
    assert "signal 9" in r.note
    assert not h.run(h.k.is_alive())
    assert "signal 9" in h.run(h.k.death_reason())
    assert h.ex("1").status == "died"
    h.run(h.k.restart())
    assert h.run(h.k.is_alive()) and h.k.pid != old_pid
    r = h.ex("survivor")
    assert r.status == "error" and r.error is not None and r.error.ename == "NameError"
    assert h.ex("1+1").result == "2"


# --------------------------------------------------------------------------- own kernels


def test_memory_limit_gives_memory_error(caplog: pytest.LogCaptureFixture) -> None:
    root = _short_tmp()
    caplog.set_level(logging.WARNING, logger="datadesk.sandbox.backends.local.process")

    async def main() -> None:
        k = LocalKernel(_placement(root), memory_bytes=1 << 30)
        await k.start()
        try:
            r = await k.execute("x = bytearray(4 << 30)", 30)
            assert r.status == "error" and r.error is not None and r.error.ename == "MemoryError", r
            assert await k.is_alive()
            r = await k.execute("y = bytearray(100 << 20)\nlen(y)", 30)
            assert r.status == "ok" and r.result == str(100 << 20)
        finally:
            await k.shutdown()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    warnings = [r.getMessage() for r in caplog.records if "NOT a security boundary" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("local sandbox: code runs as the app's user")


def test_shutdown_leaves_nothing_behind() -> None:
    root = _short_tmp()

    async def main() -> tuple[int, int]:
        k = LocalKernel(_placement(root))
        await k.start()
        assert k.pid is not None
        pid = k.pid
        r = await k.execute("import subprocess\np = subprocess.Popen(['sleep', '60'])\nprint(p.pid)", 30)
        assert r.status == "ok", r
        child = int(r.stdout.strip())
        assert not _gone(pid) and not _gone(child)
        await k.shutdown()
        await k.shutdown()  # idempotent
        assert not await k.is_alive()
        assert not k.placement.run_dir.exists()
        assert k.placement.outputs_dir.is_dir() and (k.placement.data_dir / "a.txt").exists()
        return pid, child

    try:
        pid, child = asyncio.run(main())
        deadline = time.monotonic() + 3
        while not (_gone(pid) and _gone(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(pid) and _gone(child)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_start_failure_is_a_clear_error() -> None:
    root = _short_tmp()

    async def main() -> None:
        # 50 MB of address space is not enough for Python + ipykernel.
        k = LocalKernel(_placement(root), memory_bytes=50 << 20, ready_timeout_s=10)
        with pytest.raises(SandboxError, match="exited while starting|did not become ready"):
            await k.start()
        assert not await k.is_alive()
        await k.shutdown()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- live output, probes


def test_output_reaches_on_output_as_printed_and_the_interrupt_is_told(h: Harness) -> None:
    h.ensure_alive()
    got: list[tuple[float, str, str]] = []
    said: list[str] = []
    r = h.run(h.k.execute(
        "import sys, time\nprint('a', flush=True)\nprint('b', file=sys.stderr, flush=True)\ntime.sleep(0.6)\n"
        "print('c')\nwhile True:\n    pass", 1.5,
        on_output=lambda s, t: got.append((time.monotonic(), s, t)), on_status=said.append))
    end = time.monotonic()
    assert r.status == "timeout"
    assert [(s, t) for _, s, t in got][:3] == [("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")]
    assert got[0][0] < end - 1.0  # before the cell ended, not with the result
    assert said and "interrupting" in said[0]


def test_probe_and_the_health_checks(h: Harness) -> None:
    from datadesk.sandbox.base import io_problem

    h.ensure_alive()
    ok = h.ex("1 + 1")
    assert io_problem(ok) == "" and ok.expressions  # the checks came with the reply
    probed = h.run(h.k.probe(5))
    assert probed is not None and probed.status == "ok" and io_problem(probed) == ""
    assert h.ex("any = 3; getattr = None").status == "ok" and io_problem(h.ex("1")) == ""  # shadowed: no verdict
    h.ex("del any, getattr")
    closed = h.ex("import sys\nsys.stdout.close()")
    assert "stdout or stderr" in io_problem(closed)
    h.run(h.k.restart())
    assert h.ex("1 + 1").result == "2"


def test_live_output_is_throttled_and_capped() -> None:
    from datadesk.tools.python import LiveOutput

    class Ctx:
        def __init__(self) -> None:
            self.events: list[dict] = []

        def report(self, **fields) -> None:
            self.events.append(fields)

    c = Ctx()
    live = LiveOutput(c)  # type: ignore[arg-type]
    live.last_sent = 0.0
    live.output("stdout", "first\n")  # nothing sent for long: goes at once
    for i in range(100):
        live.output("stdout", f"line {i}\n")  # within the throttle window: buffered
    assert c.events == [{"stdout": "first\n"}]
    live.output("stderr", "x" * 10_000)
    live.flush()
    assert "line 99" in c.events[1]["stdout"] and len(c.events[1]["stderr"]) < LiveOutput.EVENT_CHARS + 60
    live.status("restarting the kernel")
    assert c.events[-1] == {"message": "restarting the kernel"}
    for _ in range(100):
        live.output("stdout", "y" * 5_000)
        live.flush()
    assert sum(len(e.get("stdout", "")) + len(e.get("stderr", "")) for e in c.events) <= LiveOutput.CALL_CHARS + 200
