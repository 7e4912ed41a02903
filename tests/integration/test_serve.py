"""`datadesk serve` on a fresh data dir: demo workspace, first admin, login URL, a demo turn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, parse_sse, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATADESK_"))}
    env.update(PYTHONPATH=str(ROOT / "platform"), PYTHONUNBUFFERED="1")
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while "login?code=" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, log.read_text()
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        while True:
            try:
                httpx.get(base + "/api/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.time() < deadline
                time.sleep(0.1)
        yield base, log, tmp_path
    finally:
        proc.terminate()
        proc.wait(10)


def test_fresh_serve_prints_login_url_and_runs_the_demo(server) -> None:
    base, log, cwd = server
    text = log.read_text()
    assert "demo model, no LLM configured" in text
    url = re.search(r"(http://\S+/login\?code=\S+)", text).group(1)
    code = url.split("code=")[1]
    assert (cwd / "var" / "users.json").exists()
    assert (cwd / "var" / "workspaces" / "demo" / "data" / "warehouse.duckdb").exists()
    with httpx.Client(base_url=base, timeout=30) as c:
        page = c.get(url.replace(url.split("/login")[0], base), follow_redirects=False)
        assert page.status_code == 200 and "Sign in as" in page.text  # a confirm page, then its form
        confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', page.text).group(1)
        r = c.post("/login", data={"code": code, "confirm": confirm}, follow_redirects=False)
        assert r.status_code in (302, 303, 307)
        me = c.get("/api/me").json()
        assert me["id"] == "admin"
        assert c.get("/api/health").json()["model"]["demo"] is True
        c.headers["X-CSRF-Token"] = me["csrf"]  # a cookie session: state changes carry the token
        tid = c.post("/api/threads", json={}).json()["id"]
        events = parse_sse(c.post(f"/api/threads/{tid}/messages",
                                  json={"content": "Which buildings use the most energy?"}).text)
    kinds = [e for e, _ in events]
    assert "tool.started" in kinds and "tool.finished" in kinds, events
    assert kinds[-2:] == ["message.completed", "done"]
    answer = events[-2][1]["content"]
    assert "Demo model" in answer and "|" in answer  # a table of real numbers
    wait_until(lambda: "GET /login?code=" in log.read_text())  # the access log line is written
    logged = log.read_text()
    assert "GET /login?code=[REDACTED]" in logged
    assert code not in logged.split(url)[1]  # printed once at start, never in the access log


def test_a_restart_after_the_admin_logged_in_prints_no_login_url(server) -> None:
    base, log, cwd = server
    code = re.search(r"/login\?code=(\S+)", log.read_text()).group(1)
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore

    users = UserStore(Layout(cwd / "var"))
    assert users.redeem_login_code(code) is not None
    users.record_login("admin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATADESK_"))}
    env.update(PYTHONPATH=str(ROOT / "platform"), PYTHONUNBUFFERED="1")
    log2 = cwd / "second.log"
    with open(log2, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--port", str(free_port())],
                                cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "users login-url" in log2.read_text() or proc.poll() is not None, timeout=60)
        text = log2.read_text()
        assert "datadesk users login-url" in text and "login?code=" not in text, text
    finally:
        proc.terminate()
        proc.wait(10)
