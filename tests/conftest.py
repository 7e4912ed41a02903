"""Shared fixtures: a data dir with the real demo warehouse, users, the real app."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgspec
import pytest

from datadesk.composition import Runtime
from datadesk.llm.base import ChatModel
from datadesk.settings import Settings
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from datadesk.store.workspaces import ensure_demo_workspace


@pytest.fixture(scope="session")
def demo_warehouse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datadesk.store.demo import create_demo_warehouse

    data = tmp_path_factory.mktemp("demo-data")
    create_demo_warehouse(data)
    return data


@pytest.fixture
def home(tmp_path: Path, demo_warehouse_dir: Path) -> Path:
    """A data dir with the demo workspace (its real warehouse) and a second, empty workspace."""
    home = tmp_path / "var"
    layout = Layout(home)
    data = layout.workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(layout)
    layout.workspace_dir("sales").mkdir(parents=True)
    (layout.workspace_dir("sales") / "workspace.toml").write_text('name = "Sales"\nprompt = "Sales team."\n')
    return home


@dataclass
class Harness:
    """The real app over a real data dir, with tokens for a few users."""

    rt: Runtime
    tokens: dict[str, str] = field(default_factory=dict)

    def auth(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def app(self):
        from datadesk.api.app import create_app

        return create_app(self.rt)


def make_harness(home: Path, model: ChatModel, **overrides: Any) -> Harness:
    overrides.setdefault("sandbox", {"backend": "none"})  # kernels only in the tests about them
    overrides.setdefault("summary", {"enabled": False})  # summaries only where a test gives a summarizer
    summary_model = overrides.pop("summary_model", None)
    settings = msgspec.convert({"home": str(home), **overrides}, Settings, dec_hook=lambda t, o: Path(o))
    rt = Runtime(settings=settings, model=model, summary_model=summary_model)
    users = UserStore(rt.layout)
    h = Harness(rt=rt)
    for name, wss, perms in [
        ("alice", ["demo", "sales"], ["code_execution"]),
        ("bob", ["demo"], []),
        ("carol", ["demo"], ["admin"]),
    ]:
        _, h.tokens[name] = users.add(name, wss, perms)
    users.revoke("carol")
    return h


@pytest.fixture
def harness_factory(home: Path):
    return lambda model, **kw: make_harness(home, model, **kw)


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) pairs of an SSE body."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        ev, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            events.append((ev, msgspec.json.decode("\n".join(data))))
    return events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(app) -> Iterator[str]:
    """Run `app` under uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(interval)


async def until(predicate, timeout: float = 10.0, interval: float = 0.002) -> None:
    """`wait_until` inside an event loop: poll `predicate` (other tasks run meanwhile) until it holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


def run(coro):
    return asyncio.run(coro)


def _docker_problem() -> str | None:
    """Why docker tests cannot run here (None when they can)."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:
        return f"no Docker engine reachable ({exc})"
    from datadesk.settings import SandboxSettings

    try:
        client.images.get(SandboxSettings().image)
    except Exception:
        return f"sandbox image {SandboxSettings().image} missing (run `datadesk sandbox build`)"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    """Docker/browser tests skip without their engine, but fail when CI requires them."""
    import os

    from tests.dbkit import databases_problem

    needs = {"docker": (_docker_problem, "DATADESK_REQUIRE_DOCKER"),
             "browser": (_browser_problem, "DATADESK_REQUIRE_BROWSER"),
             "databases": (databases_problem, "DATADESK_REQUIRE_DATABASES")}
    for marker, (probe, required_by) in needs.items():
        marked = [i for i in items if i.get_closest_marker(marker)]
        problem = probe() if marked else None
        if not problem:
            continue
        for item in marked:
            if os.environ.get(required_by) == "1":
                item.user_properties.append(("missing", f"{required_by}=1 but {problem}"))
                item.fixturenames.insert(0, "_fail_missing_requirement")
            else:
                item.add_marker(pytest.mark.skip(reason=problem))


def _browser_problem() -> str | None:
    if not Path("/usr/bin/chromium").exists():
        return "Chromium is not installed (/usr/bin/chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


@pytest.fixture
def _fail_missing_requirement(request) -> None:
    pytest.fail(dict(request.node.user_properties)["missing"], pytrace=False)
