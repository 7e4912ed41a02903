"""`datadesk serve` as a real subprocess on 127.0.0.1, for tests and benchmarks: started, waited
for until `/api/health` answers (and, with several workers, until each has written its
heartbeat), and stopped by its PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import httpx

from tests.conftest import free_port


def start_serve(home: Path, env: dict[str, str], port: int, log: Path, workers: int | None = None,
                args: Sequence[str] = (), heartbeats: int = 0) -> subprocess.Popen[bytes]:
    """`python -m datadesk.cli serve` on `port` (its output in `log`; `workers`: `--workers`, else
    the settings' count), once it answers; with `heartbeats`, also once that many worker
    heartbeat files exist."""
    cmd = [sys.executable, "-m", "datadesk.cli", "serve", "--port", str(port)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home.parent)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        beats = len(list((home / "sandbox" / "workers").glob("*.json"))) if heartbeats else 0
        try:
            if httpx.get(f"{base}/api/health", timeout=2).status_code == 200 and beats >= heartbeats:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            stop_serve(proc, 10)
            raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop_serve(proc: subprocess.Popen[bytes], wait_s: float = 60) -> None:
    """SIGTERM, then SIGKILL after `wait_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def serving(home: Path, env: dict[str, str], log: Path, workers: int | None = None, args: Sequence[str] = (),
            heartbeats: int = 0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`start_serve` on a free port: (base URL, process), stopped on leaving."""
    port = free_port()
    proc = start_serve(home, env, port, log, workers, args, heartbeats)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_serve(proc)
