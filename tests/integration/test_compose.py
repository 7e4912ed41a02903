"""docker-compose.yml and the app image: the file validates with a real compose tool, and the app
image, run the way the file says (socket mounted, data dir at the same path, settings from the
environment), completes a turn whose python call runs in a docker kernel, driven by the fake LLM.

The engine here runs with --bridge=none, so the containers use the host network (the app then
reaches the fake LLM on 127.0.0.1) instead of the file's published port.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import free_port, parse_sse
from tests.fakes.openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SOCKET = "/var/run/docker.sock"


def compose_tool() -> list[str]:
    """`docker compose` (v2 plugin) or `docker-compose`; fails in CI when neither is installed."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    why = "no compose tool: neither the `docker compose` plugin nor `docker-compose` is installed"
    if os.environ.get("DATADESK_REQUIRE_DOCKER") == "1":
        pytest.fail(f"DATADESK_REQUIRE_DOCKER=1 but {why} (.ci/run installs Debian's docker-compose)")
    pytest.skip(why)


def _clean_env() -> dict[str, str]:
    """The environment without our variables: they would override the env file in compose."""
    names = ("DATADESK_", "OPENAI_", "BASE_IMAGE")
    return {k: v for k, v in os.environ.items() if not k.startswith(names)}


def _bind(volume: Any) -> tuple[str, str]:
    """(source, target) of a volume in `config` output: a string (v1) or a mapping (v2)."""
    if isinstance(volume, dict):
        return volume["source"], volume["target"]
    source, target = volume.split(":")[:2]
    return source, target


def test_compose_file_validates_and_takes_llm_settings_from_an_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / "deploy.env"
    env_file.write_text("DATADESK_LLM_BASE_URL=http://llm.internal:8080/v1\n"
                        "DATADESK_LLM_API_KEY=sk-from-the-env-file\n"
                        "DATADESK_LLM_MODEL=qwen-test\n"
                        "DATADESK_DATA_DIR=/srv/dd-compose-test\n")
    tool = compose_tool()
    out = subprocess.run([*tool, "--env-file", str(env_file), "-f", str(COMPOSE), "config"],
                         capture_output=True, text=True, cwd=ROOT, env=_clean_env(), timeout=120)
    assert out.returncode == 0, f"{' '.join(tool)} config rejected docker-compose.yml:\n{out.stderr}"
    services = yaml.safe_load(out.stdout)["services"]
    assert set(services) == {"app", "sandbox-image"}

    app = services["app"]
    env = app["environment"]
    assert env["DATADESK_LLM_BASE_URL"] == "http://llm.internal:8080/v1"
    assert env["DATADESK_LLM_API_KEY"] == "sk-from-the-env-file"
    assert env["DATADESK_LLM_MODEL"] == "qwen-test"
    assert env["DATADESK_SANDBOX_BACKEND"] == "docker" and env["DATADESK_HOST"] == "0.0.0.0"
    binds = dict(_bind(v) for v in app["volumes"])
    # the data dir at the SAME path inside and outside, and it is the app's home and shared dir
    assert binds["/srv/dd-compose-test"] == "/srv/dd-compose-test"
    assert env["DATADESK_HOME"] == env["DATADESK_SANDBOX_SHARED_DIR"] == "/srv/dd-compose-test"
    assert binds[SOCKET] == SOCKET
    assert app["restart"] == "unless-stopped"
    assert "/api/health" in " ".join(app["healthcheck"]["test"])
    assert app["build"]["args"]["BASE_IMAGE"] == "datadesk-base:bookworm"
    assert app["depends_on"]["sandbox-image"]["condition"] == "service_completed_successfully"

    once = services["sandbox-image"]
    assert once["command"][:3] == ["datadesk", "sandbox", "build"]
    once_binds = dict(_bind(v) for v in once["volumes"])
    assert once_binds[SOCKET] == SOCKET and once_binds[str(ROOT / "sandbox_image")] == "/sandbox_image"
    assert once.get("restart") in ("no", None)



CLUSTER = ROOT / "docker-compose.cluster.yml"
CLUSTER_SECRETS = {"DATADESK_SECRET_KEY": "k" * 40, "POSTGRES_PASSWORD": "pg-secret",
                   "S3_ACCESS_KEY": "s3-access", "S3_SECRET_KEY": "s3-secret"}


def _cluster_config(tmp_path: Path, variables: dict[str, str]) -> subprocess.CompletedProcess:
    env_file = tmp_path / "cluster.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    return subprocess.run([*compose_tool(), "--env-file", str(env_file), "-f", str(COMPOSE),
                           "-f", str(CLUSTER), "config"],
                          capture_output=True, text=True, cwd=ROOT, env=_clean_env(), timeout=120)


def test_cluster_file_runs_two_hosts_on_one_database_and_store(tmp_path: Path) -> None:
    out = _cluster_config(tmp_path, CLUSTER_SECRETS)
    assert out.returncode == 0, f"compose rejected docker-compose.cluster.yml:\n{out.stderr}"
    services = yaml.safe_load(out.stdout)["services"]
    assert {"postgres", "objects", "app-a", "app-b", "balancer", "sandbox-image"} <= set(services)
    a, b = services["app-a"]["environment"], services["app-b"]["environment"]
    assert a["DATADESK_HOME"] != b["DATADESK_HOME"]  # separate, unshared homes
    for env in (a, b):
        assert env["DATADESK_CLUSTER_DATABASE_URL"] == "postgresql://datadesk:pg-secret@postgres:5432/datadesk"
        assert env["DATADESK_STORAGE_URL"].startswith("s3://")
        assert env["DATADESK_SECRET_KEY"] == "k" * 40
        assert env["AWS_ACCESS_KEY_ID"] == "s3-access" and env["AWS_SECRET_ACCESS_KEY"] == "s3-secret"
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-secret"
    assert set(services["balancer"]["depends_on"]) == {"app-a", "app-b"}


@pytest.mark.parametrize("missing", sorted(CLUSTER_SECRETS))
def test_cluster_file_refuses_a_missing_secret_by_name(tmp_path: Path, missing: str) -> None:
    out = _cluster_config(tmp_path, {k: v for k, v in CLUSTER_SECRETS.items() if k != missing})
    assert out.returncode != 0
    assert f"set {missing} in .env" in out.stderr

# -- the app image, run as the compose file says ------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def compose_services(variables: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml's services with `${NAME:-default}` filled from `variables`, and relative
    bind sources made absolute (as compose does), without a compose tool."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return _VAR.sub(lambda m: variables.get(m[1]) or (m[2] or ""), value)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value

    services = fill(yaml.safe_load(COMPOSE.read_text())["services"])
    for service in services.values():
        vols = {}
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            vols[str((ROOT / source).resolve()) if source.startswith(".") else source] = {"bind": target,
                                                                                         "mode": "rw"}
        service["volumes"] = vols
    return services


def _token(output: bytes) -> str:
    found = re.search(r"(ddt_[A-Za-z0-9_.-]+)", output.decode())
    assert found, output.decode()
    return found.group(1)


def _wait_healthy(container, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while True:
        container.reload()
        state = container.attrs["State"]
        if state.get("Health", {}).get("Status") == "healthy":
            return
        assert state["Status"] == "running", container.logs().decode(errors="replace")[-4000:]
        assert time.time() < deadline, "app not healthy in time:\n" + container.logs().decode(errors="replace")[-4000:]
        time.sleep(0.5)


CODE = """import os
import pandas as pd
df = pd.DataFrame({"x": [6], "y": [7]})
os.makedirs("/outputs/report", exist_ok=True)
df.assign(product=df.x * df.y).to_csv("/outputs/report/answer.csv", index=False)
print("product", int((df.x * df.y)[0]), "uid", os.getuid())
"""


@pytest.mark.docker
@pytest.mark.timeout(1500)  # a first build of the app image; later runs find it (a few seconds)
def test_app_image_completes_a_turn_with_a_docker_kernel() -> None:
    import docker

    build = subprocess.run(["bash", str(ROOT / "app_image" / "build.sh")], capture_output=True, text=True,
                           timeout=1400)
    assert build.returncode == 0, f"app image build failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    tag = build.stdout.strip().splitlines()[-1]
    assert tag.startswith("datadesk-app:")

    client = docker.from_env(timeout=120)
    home = tempfile.mkdtemp(prefix="ddc-")  # short: kernel socket paths live under it
    port = free_port()
    started: list[Any] = []
    try:
        with FakeOpenAIServer() as fake:
            services = compose_services({
                "DATADESK_DATA_DIR": home,
                "DATADESK_LLM_BASE_URL": fake.base_url,
                "DATADESK_LLM_API_KEY": "sk-compose-test",
                "DATADESK_LLM_MODEL": "fake-model",
                "DATADESK_PUBLIC_URL": f"http://127.0.0.1:{port}",
            })

            # the one-shot service: finds (or builds) the kernel image through the mounted socket
            once = services["sandbox-image"]
            job = client.containers.run(tag, once["command"], volumes=once["volumes"], network_mode="host",
                                        detach=True)
            started.append(job)
            status = job.wait(timeout=900)["StatusCode"]
            job_log = job.logs().decode(errors="replace")
            assert status == 0 and "datadesk-sandbox:" in job_log, job_log[-3000:]

            # the app service: its command, environment, mounts and healthcheck (checked every second)
            app = services["app"]
            env = {**app["environment"], "DATADESK_PORT": str(port)}
            check = app["healthcheck"]
            container = client.containers.run(
                tag, app["command"], environment=env, volumes=app["volumes"], network_mode="host", detach=True,
                healthcheck={"test": check["test"], "interval": 1_000_000_000, "timeout": 5_000_000_000,
                             "retries": 3, "start_period": 120_000_000_000},
                restart_policy={"Name": app["restart"]}, labels={"datadesk.test": "compose"})
            started.append(container)
            _wait_healthy(container)

            logs = container.logs().decode(errors="replace")
            login = re.search(r"(http://\S+/login\?code=\S+)", logs)
            assert login and login.group(1).startswith(f"http://127.0.0.1:{port}/"), logs[-3000:]
            with httpx.Client(timeout=30) as browser:
                page = browser.get(login.group(1), follow_redirects=False)  # a confirm page, then its form
                assert page.status_code == 200 and "Sign in as" in page.text, page.text[:500]
                confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', page.text).group(1)
                code = login.group(1).split("code=")[1]
                r = browser.post(f"http://127.0.0.1:{port}/login", data={"code": code, "confirm": confirm},
                                 follow_redirects=False)
                assert r.status_code in (302, 303, 307)
                assert browser.get(f"http://127.0.0.1:{port}/api/me").json()["id"] == "admin"

            added = container.exec_run(["datadesk", "users", "add", "analyst", "--workspace", "demo",
                                        "--can-execute-code"])
            assert added.exit_code == 0, added.output.decode()
            token = _token(added.output)

            fake.add_tool_calls([{"id": "call_py", "name": "python", "arguments": {"code": CODE}}])
            fake.add_text("The product is 42.")
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=180) as c:
                tid = c.post("/api/threads", json={}).json()["id"]
                events = parse_sse(c.post(f"/api/threads/{tid}/messages",
                                          json={"content": "What is 6 times 7? Save it as a report."}).text)
                # this app's kernels only: other tests (xdist workers) run kernels on the same engine
                kernels = client.containers.list(filters={"label": "datadesk.sandbox=1"})
                labels = [k.labels.get("datadesk.home") for k in kernels
                          if k.labels.get("datadesk.home") in _home_labels(home)]

            kinds = [e for e, _ in events]
            assert kinds[-2:] == ["message.completed", "done"], events
            finished = next(d for e, d in events if e == "tool.finished")
            assert finished["ok"], finished
            preview = finished["preview"]
            uid = int(re.search(r"product 42 uid (\d+)", preview).group(1))
            assert uid >= 1_900_000_000  # a kernel uid of its own (sandbox.docker_uid_base), not the app's root
            assert "file: /outputs/report/answer.csv saved as artifact" in preview  # read via docker exec
            assert events[-2][1]["content"] == "The product is 42."
            tool_msgs = [m for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
            assert "product 42" in tool_msgs[-1]["content"]
            assert labels, "no sandbox container was running for the app"

            # the data dir is the host's: the report is there, at the same path
            arts = Path(home, "workspaces/demo/users/analyst/threads", tid, "artifacts")
            csvs = [p.read_text() for p in arts.glob("*.csv")]
            assert csvs == ["x,y,product\n6,7,42\n"], csvs

            container.stop(timeout=30)  # the app removes its kernels on shutdown
    finally:
        for c in started:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
        for c in client.containers.list(all=True, filters={"label": "datadesk.sandbox=1"}):
            if c.labels.get("datadesk.home") in _home_labels(home):
                c.remove(force=True)
        shutil.rmtree(home, ignore_errors=True)


def _home_labels(home: str) -> set[str]:
    import hashlib

    return {hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:16]}
