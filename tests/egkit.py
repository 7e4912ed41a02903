"""Jupyter Enterprise Gateway for tests: the real `jupyter-enterprisegateway` (3.x, from the
package index) with process kernels, started on a given address and free port, stopped by PID.

It lives in its own virtual environment (`.venv-eg`, made by `.ci/run`): it pins
jupyter_client 6 and jupyter_server 1, which the app's interpreter cannot have. Its kernels are
the app interpreter's ipykernel (pandas, pyarrow, DuckDB), listed in a kernelspec of a temp
dir; the gateway refuses user `root`, so clients send `KERNEL_USERNAME`. The kernel list stays
off (EG's default): the app keeps its own kernel table. Kernels inherit only PATH, HOME, LANG
and the KERNEL_* variables of each request: no store credentials, no token.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
EG_BIN = Path(os.environ.get("DATADESK_ENTERPRISE_GATEWAY", ROOT / ".venv-eg" / "bin" / "jupyter-enterprisegateway"))
KERNEL_USER = "datadesk"


@dataclass
class EnterpriseGateway:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def kernel_exists(self, kernel_id: str) -> bool:
        r = httpx.get(f"{self.url}/api/kernels/{kernel_id}", headers=self.headers(), timeout=10)
        if r.status_code not in (200, 404):
            r.raise_for_status()
        return r.status_code == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # it shuts its kernels down on SIGTERM
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def require_gateway() -> None:
    """Skip without the venv; under DATADESK_REQUIRE_CLUSTER=1 a missing gateway fails."""
    if EG_BIN.is_file():
        return
    why = f"Jupyter Enterprise Gateway is missing ({EG_BIN}: .ci/run makes the .venv-eg virtualenv)"
    if os.environ.get("DATADESK_REQUIRE_CLUSTER") == "1":
        pytest.fail(why)
    pytest.skip(why)


def start_gateway(root: Path, ip: str, port: int, prefix: Sequence[str] = (), python: str = sys.executable,
                  timeout_s: float = 90) -> EnterpriseGateway:
    """EG on `ip:port` with a `python3` process kernelspec of `python`; `prefix` runs it inside
    something (e.g. `ip netns exec NAME`). Waits until it answers."""
    require_gateway()
    for sub in ("home", "ipython", "runtime", "data", "kernels/python3"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (DataDesk kernels)", "language": "python"}
    (root / "kernels" / "python3" / "kernel.json").write_text(json.dumps(spec))
    token = "eg-" + secrets.token_hex(12)
    env = {"PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin", "HOME": str(root / "home"),
           "LANG": "C.UTF-8", "IPYTHONDIR": str(root / "ipython"), "JUPYTER_PATH": str(root),
           "JUPYTER_DATA_DIR": str(root / "data"), "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
           "EG_INHERITED_ENVS": "HOME,LANG,IPYTHONDIR"}
    log_path = root / "enterprise-gateway.log"
    cmd = [*prefix, str(EG_BIN), f"--ip={ip}", f"--port={port}", f"--EnterpriseGatewayApp.auth_token={token}",
           "--KernelSpecManager.whitelist=['python3']", "--EnterpriseGatewayApp.port_retries=0"]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=log_file, start_new_session=True)
    gw = EnterpriseGateway(url=f"http://{ip}:{port}", token=token, proc=proc, log=log_path)
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"Enterprise Gateway exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{gw.url}/api/kernelspecs", headers=gw.headers(), timeout=2).status_code == 200:
                return gw
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            gw.stop()
            raise RuntimeError(f"Enterprise Gateway did not answer: {log_path.read_text()[-2000:]}")
        time.sleep(0.3)
