"""An edited `workspace.toml` takes effect without a restart (issue 31, the data panel):
`Workspaces.config` re-reads a changed file (one stat at most every `check_interval_s`), a bad
edit keeps the last good config and says why once, and `WorkspaceSources` rebuilds the sources
(an added SQLite source, a new view, a removed source) without breaking a running query."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.sources.errors import SQLError
from datadesk.sources.registry import WorkspaceSources
from datadesk.store.layout import Layout
from datadesk.store.workspaces import WorkspaceConfigError, Workspaces
from tests.dbkit import make_sqlite

BASE = 'name = "Shop"\nprompt = "The shop."\n'
LOCAL = '\n[sources.local]\nurl = "sqlite:///data/shop.sqlite"\ndescription = "the shop"\n'


class Reads:
    """The `check` hook of Workspaces, counting each time a file is actually read and parsed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, path: Path, cfg) -> None:
        self.count += 1


def rows(source, sql: str) -> list[tuple]:
    """Every row of `sql` on `source`, through its stream (as the SQL tool reads it)."""
    with source.record_batches(sql, "alice") as stream:
        return [row for batch in stream for row in zip(*(c.to_pylist() for c in batch.columns))]


def edit(path: Path, text: str) -> None:
    """Write `text` and make sure the file's signature moves (coarse mtime clocks)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


@pytest.fixture
def shop(tmp_path: Path) -> tuple[Layout, Path]:
    layout = Layout(tmp_path / "var")
    data = layout.workspace_data_dir("shop")
    data.mkdir(parents=True)
    make_sqlite(data / "shop.sqlite", rows=50)
    cfg = layout.workspace_config("shop")
    cfg.write_text(BASE)
    return layout, cfg


def test_unchanged_file_is_not_reread_and_looked_at_once_per_interval(shop) -> None:
    layout, cfg = shop
    reads = Reads()
    ws = Workspaces(layout, check=reads, check_interval_s=0.2)
    first = ws.config("shop")
    edit(cfg, BASE.replace("The shop.", "Edited."))
    assert all(ws.config("shop") is first for _ in range(1000))  # within the interval: no look at all
    assert reads.count == 1
    time.sleep(0.25)
    second = ws.config("shop")
    assert second is not first and second.prompt == "Edited." and reads.count == 2
    time.sleep(0.25)
    assert ws.config("shop") is second and reads.count == 2  # looked at, unchanged: not re-read
    assert ws.error("shop") is None


def test_bad_edit_keeps_the_last_good_config_and_says_why_once(shop, caplog) -> None:
    layout, cfg = shop
    ws = Workspaces(layout, check_interval_s=0)
    good = ws.config("shop")
    edit(cfg, BASE + '\n[views]\nsales = "/etc/passwd.csv"\n')
    with caplog.at_level(logging.ERROR, logger="datadesk.store.workspaces"):
        served = [ws.config("shop") for _ in range(20)]
    assert all(s is good for s in served)
    err = ws.error("shop")
    assert err and str(cfg) in err and "key 'views.sales'" in err
    logged = [r for r in caplog.records if "views.sales" in r.getMessage()]
    assert len(logged) == 1 and "last good config is still in use" in logged[0].getMessage()

    edit(cfg, BASE + "memory = 'yes'\n")  # another bad edit: said again, once
    assert ws.config("shop") is good and "key 'memory'" in (ws.error("shop") or "")
    edit(cfg, 'prompt = """unterminated\n')
    assert ws.config("shop") is good and "invalid TOML" in (ws.error("shop") or "")
    cfg.unlink()
    assert ws.config("shop") is good and "the file is gone" in (ws.error("shop") or "")
    edit(cfg, BASE + "memory = true\n")
    fixed = ws.config("shop")
    assert fixed.memory is True and ws.error("shop") is None


def test_a_file_never_good_raises_until_fixed(shop) -> None:
    layout, cfg = shop
    edit(cfg, "warehous = 1\n")
    ws = Workspaces(layout, check_interval_s=0)
    with pytest.raises(WorkspaceConfigError, match="key 'warehous'"):
        ws.config("shop")
    assert "warehous" in (ws.error("shop") or "")
    edit(cfg, BASE)
    assert ws.config("shop").name == "Shop" and ws.error("shop") is None


def test_configs_read_from_many_threads_while_the_file_changes(shop) -> None:
    layout, cfg = shop
    ws = Workspaces(layout, check_interval_s=0.001)
    seen: set[str] = set()
    failures: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.add(ws.config("shop").prompt)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                failures.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for t in threads:
        t.start()
    for i in range(30):
        edit(cfg, BASE.replace("The shop.", f"v{i}"))
        time.sleep(0.005)
    time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert not failures
    assert ws.config("shop").prompt == "v29" and len(seen) > 1


def test_sources_follow_the_file_added_view_removed(shop) -> None:
    layout, cfg = shop
    sources = WorkspaceSources(Workspaces(layout, check_interval_s=0), 30)
    before = sources.get("shop")
    assert before.names() == ["warehouse"] and sources.get("shop") is before

    edit(cfg, BASE + LOCAL)  # a new [sources.local]
    added = sources.get("shop")
    assert added is not before and added.names() == ["warehouse", "local"]
    assert rows(added.get("local"), "SELECT count(*) FROM orders") == [(50,)]
    assert added.warehouse is before.warehouse  # unchanged: kept, not reopened

    pq.write_table(pa.table({"region": ["n", "s"], "amount": [1, 2]}), layout.workspace_data_dir("shop") / "t.parquet")
    edit(cfg, BASE + LOCAL + '\n[views]\ntargets = "data/t.parquet"\n')  # a new view
    viewed = sources.get("shop")
    assert viewed.get("local") is added.get("local")  # an unchanged source keeps its pool and state
    assert viewed.warehouse is not added.warehouse
    assert viewed.get("warehouse").query_sync("SELECT sum(amount) FROM targets").rows == [[3]]

    edit(cfg, BASE.replace("The shop.", "prompt only") + LOCAL + '\n[views]\ntargets = "data/t.parquet"\n')
    assert sources.get("shop") is viewed  # the sources did not change: the same set

    edit(cfg, BASE)  # the source removed
    removed = sources.get("shop")
    assert removed.names() == ["warehouse"]
    with pytest.raises(SQLError, match="there is no source 'local'"):
        removed.get("local")
    assert viewed.get("local").status()["open_connections"] == 0  # its sessions closed
    sources.close()


def test_a_running_query_survives_its_source_being_removed(shop) -> None:
    layout, cfg = shop
    edit(cfg, BASE + LOCAL)
    sources = WorkspaceSources(Workspaces(layout, check_interval_s=0), 30)
    local = sources.get("shop").get("local")
    stream = local.record_batches("SELECT * FROM orders", "alice", batch_size=10)
    reader = iter(stream)
    first = next(reader)
    assert local.status()["open_connections"] == 1
    edit(cfg, BASE)
    assert sources.get("shop").names() == ["warehouse"]  # rebuilt while the query runs
    rest = sum(batch.num_rows for batch in reader)
    assert first.num_rows + rest == 50  # the query read to its end on its own session
    stream.close()
    assert local.status()["open_connections"] == 0  # given back after the reload: closed, not kept
    sources.close()
