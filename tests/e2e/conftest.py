"""Browser tests: the real server (`datadesk serve` in a subprocess), the fake OpenAI server,
and Playwright driving Debian's Chromium. Screenshots go to tests/e2e/screenshots/ (git-ignored)."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.conftest import free_port
from tests.fakes.openai_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@dataclass
class Server:
    base: str
    home: Path
    env: dict[str, str]
    llm: FakeOpenAIServer
    log: Path

    def cli(self, *args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "datadesk.cli", *args], env=self.env, cwd=self.home.parent,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def login_url(self, user: str = "admin") -> str:
        out = self.cli("users", "login-url", user)
        path = re.search(r"(/login\?code=\S+)", out).group(1)
        return self.base + path

    def token(self, user: str = "admin") -> str:
        return re.search(r"(ddt_\S+)", self.cli("users", "token", user)).group(1)


@contextlib.contextmanager
def run_server(tmp: Path, llm: FakeOpenAIServer | None, extra_env: dict[str, str] | None = None,
               extra_toml: str = "") -> Iterator[Server]:
    """`datadesk serve` on a fresh data dir (memory on in the demo workspace); with `llm` None
    no model is configured, so the demo model answers. `extra_env` and `extra_toml` (more of
    datadesk.toml) for a test's own server."""
    from datadesk.cli import bootstrap
    from datadesk.settings import load_settings
    from datadesk.store.layout import Layout

    home = tmp / "var"
    home.mkdir()
    (home / "datadesk.toml").write_text('[sandbox]\nbackend = "local"\npool_size = 1\n' + extra_toml)
    bootstrap(load_settings({"DATADESK_HOME": str(home)}))
    ws_toml = Layout(home).workspace_config("demo")
    if "memory = true" not in ws_toml.read_text():  # the demo workspace has it on already
        ws_toml.write_text("memory = true\n" + ws_toml.read_text())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATADESK_"))}
    env.update(PYTHONPATH=str(ROOT / "platform"), PYTHONUNBUFFERED="1", DATADESK_HOME=str(home), **(extra_env or {}))
    if llm is not None:
        env.update(DATADESK_LLM_BASE_URL=llm.base_url, DATADESK_LLM_API_KEY="sk-test",
                   DATADESK_LLM_MODEL="fake-model")
    log = tmp / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--port", str(port)],
                                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.time() < deadline, log.read_text()
            try:
                if httpx.get(base + "/api/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield Server(base=base, home=home, env=env, llm=llm, log=log)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    llm = FakeOpenAIServer().start()
    try:
        with run_server(tmp_path_factory.mktemp("web"), llm) as srv:
            yield srv
    finally:
        llm.stop()


class OtherHost:
    """Another origin on 127.0.0.1 (a different port): counts what it is asked for and serves
    one attacker page with a form that posts to the app."""

    def __init__(self, target: str) -> None:
        self.requests: list[str] = []
        self.target = target
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(self.path)
                if self.path.startswith("/attack"):
                    body = (f'<!doctype html><form id="f" method="POST" action="{outer.target}/api/threads" '
                            'enctype="text/plain"><input name=\'{"title":"csrf","x":"\' value=\'"}\'></form>'
                            '<script>document.getElementById("f").submit()</script>').encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                else:
                    body = b"GIF89a"
                    self.send_response(200)
                    self.send_header("Content-Type", "image/gif")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def other_host(server) -> Iterator[OtherHost]:
    host = OtherHost(server.base)
    try:
        yield host
    finally:
        host.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def open_page(browser, prepare=None, **context_options):
    """A page in a fresh browser context (1280x860, 30 s timeouts), its uncaught JS errors in
    `page.js_errors`; `prepare(context)` runs before the page opens (routes, permissions)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860}, **context_options)
    if prepare is not None:
        prepare(ctx)
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.js_errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        ctx.close()


@pytest.fixture
def page(browser, server):
    with open_page(browser, accept_downloads=True) as pg:
        yield pg


def shot(page, name: str, full_page: bool = False) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def login(page, server: Server) -> None:
    page.goto(server.login_url())
    page.click("#login-confirm")  # the link shows a confirm page; its form signs in
    page.wait_for_selector("#app-view:not([hidden])")
