"""The object store down (its endpoint stopped or unreachable): an offload whose upload fails
falls back to the head and a notice naming the store (no error for the model, no 500, nothing
half-registered: no row, no object, no scratch file); artifact reads answer 503 saying the store
is unreachable, naming it; an artifact's metadata (a database row) is still served."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from litestar.testing import TestClient

from datadesk.composition import Runtime
from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.llm.scripted import ScriptedModel
from datadesk.offload.pipeline import OffloadCapability
from datadesk.settings import Settings
from datadesk.tools.registry import ToolContext, ToolResult, ToolSpec
from tests.conftest import free_port, make_harness, with_state_set

pytestmark = pytest.mark.cluster

YES = OffloadCapability(True)
SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT 5000"


def dead_store(state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The state set with the bucket on an endpoint where nothing listens."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    return {**state, "storage": {**state["storage"], "endpoint": endpoint}}, endpoint


def runtime_on(home: Path, state: dict[str, Any]) -> Runtime:
    """Another host: its own home (the workspaces copied), the same database and bucket."""
    settings = msgspec.convert({"home": str(home), "sandbox": {"backend": "none"}, "summary": {"enabled": False},
                                **with_state_set({}, state)}, Settings, dec_hook=lambda t, o: Path(o))
    return Runtime(settings=settings, model=ScriptedModel(then="ok"))


def copy_workspaces(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "workspaces", dst / "workspaces")
    return dst


def ctx(thread: Any) -> ToolContext:
    return ToolContext(thread=thread, workspace="demo", user="alice", permissions=frozenset({"code_execution"}),
                       call_id="c1", epoch=thread.epoch)


def offload(rt: Runtime, thread: Any, spec: ToolSpec, args: str, result: ToolResult) -> Any:
    c = ctx(thread)
    return rt.offload.process(spec, result, thread, c.origin("tool", spec.name, args), YES, thread.epoch)


def sql_offload(rt: Runtime, thread: Any) -> Any:
    args = json.dumps({"sql": SQL})

    async def go() -> Any:
        result = await rt.tools.run("sql_query", args, ctx(thread))
        return await offload(rt, thread, rt.tools.get("sql_query").spec, args, result)

    return asyncio.run(go())


def artifact_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM artifacts").fetchone()[0]


def scratch_files(thread: Any) -> list[str]:
    d = Path(thread.artifacts_dir)
    return sorted(p.name for p in d.iterdir() if p.suffix != ".lock") if d.is_dir() else []


def test_an_offload_whose_upload_fails_gives_the_head_and_a_notice(home, state_set, cluster_db_url) -> None:
    down, endpoint = dead_store(state_set)
    h = make_harness(home, ScriptedModel(then="ok"), state=down)
    rt = h.rt
    thread = rt.threads.create("demo", "alice")
    where = rt.cluster.blobs().where

    table = sql_offload(rt, thread)
    assert table.artifact is None and not table.result.is_error
    assert "NOTICE: shown" in table.result.content and "of 5,000 rows" in table.result.content
    assert where in table.result.content and endpoint in table.result.content
    assert "unreachable" in table.result.content
    assert table.result.meta.offload_failed and table.result.meta.truncated and table.result.meta.rows == 5000

    text = "line of a long fetched page\n" * 4000
    spec = ToolSpec(name="mcp__fetch", description="", parameters={}, read_only=True)
    page = asyncio.run(offload(rt, thread, spec, "{}", ToolResult(text)))
    assert page.artifact is None and not page.result.is_error
    assert page.result.content.startswith("line of a long fetched page") and where in page.result.content
    assert page.result.meta.offload_failed

    assert rt.artifacts.list(thread) == [] and artifact_rows(cluster_db_url) == 0  # nothing registered
    assert scratch_files(thread) == []  # nor left on this host
    asyncio.run(rt.stop())


def test_artifact_reads_say_the_store_is_unreachable(home, state_set, tmp_path) -> None:
    h = make_harness(home, ScriptedModel(then="ok"), state=state_set)
    a = h.rt
    thread = a.threads.create("demo", "alice")
    table = sql_offload(a, thread).artifact
    assert table is not None
    origin = ArtifactOrigin(source="tool", user="alice", thread=thread.id, workspace="demo", tool="python")
    chart = a.artifacts.save_bytes(thread, b"\x89PNG\r\n\x1a\n" + b"x" * 64, "png", "result", "image/png", origin,
                                   thread.epoch)
    down, endpoint = dead_store(state_set)
    b = runtime_on(copy_workspaces(home, tmp_path / "host-b"), down)  # its cache is empty: reads go to the store
    try:
        from datadesk.api.app import create_app

        with TestClient(create_app(b), raise_server_exceptions=False) as client:
            client.headers.update(h.auth("alice"))
            meta = client.get(f"/api/artifacts/{table.id}")
            assert meta.status_code == 200, meta.text  # the row is in the database
            for path in (f"/api/artifacts/{table.id}/download", f"/api/artifacts/{table.id}/rows",
                         f"/api/artifacts/{chart.id}/view", f"/api/artifacts/{chart.id}/download"):
                r = client.get(path)
                assert r.status_code == 503, (path, r.status_code, r.text)
                detail = r.json()["detail"]
                assert "unreachable" in detail and endpoint in detail and b.cluster.blobs().where in detail, detail
                assert r.headers.get("retry-after")
    finally:
        asyncio.run(b.stop())
        asyncio.run(a.stop())
