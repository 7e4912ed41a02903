"""Shared fixtures: a data dir with the real demo warehouse, users, the real app, a client of it.

The suite runs in two lanes (docs/getting-started.md): `pytest -n auto -m "not serial"` (pytest-xdist,
one process per worker) and then `pytest -m serial` for the tests that measure time, kill servers at
timed moments or own a port across a restart. `pytest_collection_modifyitems` below keeps the tests
that share an expensive module or session resource on one worker (`--dist loadgroup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import msgspec
import pytest

from datadesk.composition import Runtime
from datadesk.llm.base import ChatModel
from datadesk.settings import Settings
from datadesk.store.layout import Layout
from datadesk.store.workspaces import ensure_demo_workspace

# pytest imports this file as `conftest` (tests/ is not a package) and test modules import it as
# `tests.conftest`: one module object for both, so the registries below are the same for the
# fixtures and for a test that calls make_harness itself
sys.modules.setdefault("tests.conftest", sys.modules[__name__])


@pytest.fixture(scope="session")
def demo_warehouse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from datadesk.store.demo import create_demo_warehouse

    data = tmp_path_factory.mktemp("demo-data")
    create_demo_warehouse(data)
    return data


@pytest.fixture
def state_set() -> dict[str, Any]:
    """The settings that choose the state set of the harness (`make_harness`): none, the embedded
    set (the files of the home). tests/cluster/conftest.py overrides this fixture with the cluster
    set (a fresh database and bucket), so the suites it imports run again on PostgreSQL + S3."""
    return {}


@pytest.fixture(scope="module")
def module_state_set() -> dict[str, Any]:
    """`state_set` for a harness a module-scoped fixture builds (one set for the whole module)."""
    return {}


# the state set each `home` fixture was made for: `make_harness(home, ...)` called without
# `state=` (tests that build their own harness on the `home` fixture) builds on the same set
_STATE_OF_HOME: dict[Path, dict[str, Any]] = {}


@pytest.fixture
def home(tmp_path: Path, demo_warehouse_dir: Path, state_set: dict[str, Any]) -> Iterator[Path]:
    """A data dir with the demo workspace (its real warehouse) and a second, empty workspace."""
    home = tmp_path / "var"
    layout = Layout(home)
    data = layout.workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(layout)
    layout.workspace_dir("sales").mkdir(parents=True)
    (layout.workspace_dir("sales") / "workspace.toml").write_text('name = "Sales"\nprompt = "Sales team."\n')
    _STATE_OF_HOME[home] = state_set
    yield home
    _STATE_OF_HOME.pop(home, None)


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

    @contextlib.contextmanager
    def client(self, user: str = "alice", *, signed_in: bool = True, served: bool = False,
               thread: bool | dict[str, Any] = True, timeout: float = 60,
               raise_server_exceptions: bool = True) -> Iterator["AppClient"]:
        """A client of this harness's app for `user`, with a new thread of theirs when `thread`
        (True, or the JSON body of `POST /api/threads`). It carries the user's token on every
        request unless `signed_in` is False (tests of logins, cookies and CSRF); `new_thread`
        and `turn` send it either way.

        In-process (Litestar's TestClient) unless `served`: then uvicorn serves the app in a
        thread and the client is an httpx.Client over real sockets (streams, disconnects, a
        second client at the same time)."""
        from litestar.testing import TestClient

        headers = self.auth(user) if signed_in else {}
        with contextlib.ExitStack() as stack:
            if served:
                base = stack.enter_context(serve_app(self.app()))
                http = stack.enter_context(httpx.Client(base_url=base, headers=headers, timeout=timeout))
            else:
                base = ""
                http = stack.enter_context(TestClient(self.app(), timeout=timeout,
                                                      raise_server_exceptions=raise_server_exceptions))
                http.headers.update(headers)
            api = AppClient(h=self, client=http, user=user, base=base)
            if thread:
                api.tid = api.new_thread(**(thread if isinstance(thread, dict) else {}))
            yield api


@dataclass
class AppClient:
    """A client of the real app for one user (their token on every request unless opened with
    `signed_in=False`), the harness under it and, when asked for, one thread of theirs (`tid`)."""

    h: Harness
    client: httpx.Client  # litestar.testing.TestClient in-process, else over uvicorn at `base`
    user: str
    base: str = ""
    tid: str = ""

    @property
    def model(self) -> Any:
        return self.h.rt.model

    def new_thread(self, user: str | None = None, **body: Any) -> str:
        """A new thread of `user` (the client's own by default); `body` as for `POST /api/threads`."""
        r = self.client.post("/api/threads", json=body, headers=self.h.auth(user or self.user))
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def turn(self, content: str = "go", tid: str | None = None, user: str | None = None,
             **body: Any) -> list[tuple[str, dict[str, Any]]]:
        """Post a message on `tid` (the client's thread by default) and return the turn's SSE events."""
        r = self.client.post(f"/api/threads/{tid or self.tid}/messages", json={"content": content, **body},
                             headers=self.h.auth(user or self.user))
        return parse_sse(r.text)


def with_state_set(overrides: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """`overrides` on top of the state set's settings, section by section (a test's
    `server={...}` keeps the set's `server.secret_key`)."""
    merged = dict(overrides)
    for section, values in state.items():
        mine = merged.get(section)
        merged[section] = {**values, **mine} if isinstance(mine, dict) else mine if section in merged else values
    return merged


# the cluster sets harnesses opened, by database URL, until their test's set is done
_OPEN_CLUSTERS: dict[str, list[Callable[[], None]]] = {}


def _keep_cluster_open(rt: Runtime) -> None:
    """An app's shutdown closes the cluster set (Runtime.stop): right for a server, which exits
    then, but a harness serves one app after another (each client, each served app) and tests
    read its stores after; the set is closed with the test's `state_set` (close_clusters)."""
    if rt.cluster is None:
        return
    _OPEN_CLUSTERS.setdefault(rt.settings.cluster.database_url, []).append(rt.cluster.close)
    rt.cluster.close = lambda: None


def close_clusters(database_url: str) -> None:
    """Close the cluster set of every harness made on `database_url` (its pool, its lock
    connection, its object store client)."""
    for close in _OPEN_CLUSTERS.pop(database_url, []):
        close()


def make_harness(home: Path, model: ChatModel, *, state: dict[str, Any] | None = None,
                 **overrides: Any) -> Harness:
    """The real app (`Runtime`) on `home` with the three users; on the state set `state` (the
    settings of `state_set`), by default the one the `home` fixture was made for, else embedded."""
    overrides.setdefault("sandbox", {"backend": "none"})  # kernels only in the tests about them
    overrides.setdefault("summary", {"enabled": False})  # summaries only where a test gives a summarizer
    summary_model = overrides.pop("summary_model", None)
    state = _STATE_OF_HOME.get(Path(home), {}) if state is None else state
    settings = msgspec.convert({"home": str(home), **with_state_set(overrides, state)}, Settings,
                               dec_hook=lambda t, o: Path(o))
    rt = Runtime(settings=settings, model=model, summary_model=summary_model)
    _keep_cluster_open(rt)
    users = rt.users  # the set's user store: users.json in the home, or the cluster's table
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
def harness_factory(home: Path, state_set: dict[str, Any]):
    """`harness_factory(model, **settings)`: the real app on the `home` data dir and the
    `state_set` (see make_harness)."""
    return lambda model, **kw: make_harness(home, model, state=state_set, **kw)


@pytest.fixture
def api(request, home: Path, state_set: dict[str, Any]) -> Iterator[AppClient]:
    """alice's in-process client of the real app with a new thread of hers (`api.tid`), on a
    ScriptedModel answering "ok" (`api.model`: append steps to it). Settings overrides, a
    `model`, and the options of `Harness.client`, come from an indirect parameter:
    `@pytest.mark.parametrize("api", [{"limits": {"uploads": 1}}], indirect=True)`."""
    from datadesk.llm.scripted import ScriptedModel

    kw = dict(getattr(request, "param", None) or {})
    opts = {k: kw.pop(k) for k in ("user", "signed_in", "served", "thread", "timeout", "raise_server_exceptions")
            if k in kw}
    h = make_harness(home, kw.pop("model", None) or ScriptedModel(then="ok"), state=state_set, **kw)
    with h.client(**opts) as client:
        yield client


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

    # uvicorn gets a socket already bound to a port the kernel chose: no other test (or xdist
    # worker) can take that port between choosing it and listening on it
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
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
        sock.close()


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


# Module-scoped fixtures worth starting once per run, not once per xdist worker: the ones that
# start a server, a browser or a gateway, or build a large fixture table.
_ONCE_PER_MODULE = ("module", "package")


def _xdist_group(item: pytest.Item) -> str | None:
    """The group of tests that run on one xdist worker (`--dist loadgroup`), or None (any worker)."""
    if item.get_closest_marker("serial"):
        return "serial"  # even in a lane that forgot `-m "not serial"`: one after the other
    if item.get_closest_marker("databases") or {"pg", "maria"} & set(getattr(item, "fixturenames", ())):
        return "databases"  # one PostgreSQL and one MariaDB (session fixtures) for the whole run
    # the cluster tests are not one group: a worker's first one starts that worker's PostgreSQL
    # and SeaweedFS (a few seconds), and their 660 tests on one worker kept it busy for most of
    # the lane; only a module with a module-scoped fixture stays together, as below
    fixtures = getattr(item, "_fixtureinfo", None)
    defs = fixtures.name2fixturedefs.values() if fixtures else ()
    if any(d and d[-1].scope in _ONCE_PER_MODULE for d in defs):
        return item.nodeid.split("::")[0]  # the module's tests together: its fixture starts once
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    """Docker/browser tests skip without their engine, but fail when CI requires them; on an
    xdist worker each test is put in its group first."""
    if getattr(config.option, "loadgroup", False):  # set on the workers of `--dist loadgroup`
        for item in items:
            group = _xdist_group(item)
            if group and not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))
    import os

    from tests.clusterkit import cluster_problem
    from tests.dbkit import databases_problem

    needs = {"docker": (_docker_problem, "DATADESK_REQUIRE_DOCKER"),
             "browser": (_browser_problem, "DATADESK_REQUIRE_BROWSER"),
             "databases": (databases_problem, "DATADESK_REQUIRE_DATABASES"),
             "cluster": (cluster_problem, "DATADESK_REQUIRE_CLUSTER")}
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
