"""Fixtures of the source tests: real PostgreSQL and MariaDB servers (one each per run, started by
tests/dbkit.py) and a SQLite file; a home whose demo workspace lists them as sources."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from datadesk.store.layout import Layout
from tests.dbkit import Server, make_sqlite, start_mariadb, start_postgres

PG_ENV, MY_ENV = "DD_TEST_PG_PASSWORD", "DD_TEST_MY_PASSWORD"
PG_OWNER_ENV, MY_OWNER_ENV = "DD_TEST_PG_OWNER_PASSWORD", "DD_TEST_MY_OWNER_PASSWORD"


def _server(start) -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="datadesk-db-"))  # under /tmp: the server's user can reach it
    root.chmod(0o755)
    try:
        srv = start(root / "srv")  # a server that fails to start is stopped by start() itself
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[Server]:
    yield from _server(start_postgres)


@pytest.fixture(scope="session")
def maria() -> Iterator[Server]:
    yield from _server(start_mariadb)


@pytest.fixture(scope="session")
def sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sqlite(tmp_path_factory.mktemp("sqlite") / "shop.sqlite")


def sources_toml(pg: Server, maria: Server, extra: str = "") -> str:
    return f'''
[sources.sales]
url = "{pg.url()}"
password = "${{env:{PG_ENV}}}"
description = "Orders and customers, EUR"
schemas = ["public"]

[sources.shop]
url = "{maria.url()}"
password = "${{env:{MY_ENV}}}"
description = "The web shop (MariaDB)"

[sources.local]
url = "sqlite:///data/shop.sqlite"
description = "A SQLite copy of the shop"
{extra}'''


def writer_sources_toml(pg: Server, maria: Server) -> str:
    """Two sources on the logins that own the tables, accepted by allow_write_privileges."""
    return f'''
[sources.sales_rw]
url = "{pg.url(user=pg.writer)}"
password = "${{env:{PG_OWNER_ENV}}}"
allow_write_privileges = true
allow_functions = ["bump"]
schemas = ["public"]

[sources.shop_rw]
url = "{maria.url(user=maria.writer)}"
password = "${{env:{MY_OWNER_ENV}}}"
allow_write_privileges = true
allow_functions = ["bump"]
'''


@pytest.fixture
def rw_sources_home(sources_home: Path, pg: Server, maria: Server, monkeypatch) -> Path:
    """`sources_home` plus `sales_rw` and `shop_rw`: the owner logins, accepted as writers."""
    monkeypatch.setenv(PG_OWNER_ENV, pg.writer_password)
    monkeypatch.setenv(MY_OWNER_ENV, maria.writer_password)
    cfg = Layout(sources_home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + writer_sources_toml(pg, maria))
    return sources_home


@pytest.fixture
def sources_home(home: Path, pg: Server, maria: Server, sqlite_file: Path, monkeypatch) -> Path:
    """The conftest home, its demo workspace with the three sources; passwords in the app's environment."""
    monkeypatch.setenv(PG_ENV, pg.password)
    monkeypatch.setenv(MY_ENV, maria.password)
    layout = Layout(home)
    shutil.copy(sqlite_file, layout.workspace_data_dir("demo") / "shop.sqlite")
    cfg = layout.workspace_config("demo")
    cfg.write_text(cfg.read_text() + sources_toml(pg, maria))
    return home
