"""The cluster set's runtime (cluster/runtime.py `ClusterSet`): deleting a user removes what
they had in every store (threads with records, documents, lines and search entries; artifacts,
rows and objects; memory and its audit; kernel rows; turn rows and events) and nothing of
another user; and `Runtime.stop` leaves no connection of the process open on the database
(`pg_stat_activity`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.rows import dict_row

from datadesk.chat.loop import start_turn
from datadesk.composition import Runtime
from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.domain.records import Record
from datadesk.llm.scripted import ScriptedModel
from datadesk.sandbox.kerneltable import KernelRecord
from datadesk.settings import Settings
from datadesk.store.interfaces.threads import MANIFESTS, SUMMARY
from tests.conftest import make_harness

pytestmark = pytest.mark.cluster

# (table, the column naming the user) of every row a user's data lives in
USER_ROWS = [("threads", "owner"), ("artifacts", "user_id"), ("search_entries", "owner"), ("search_marks", "owner"),
             ("memory_docs", "user_id"), ("memory_audit", "user_id"), ("kernels", "user_id"), ("turns", "user_id")]
THREAD_ROWS = ["records", "thread_docs", "thread_lines", "turn_events"]


def _user(rt: Any, name: str) -> Any:
    return next(u for u in rt.users.list() if u.name == name)


def _fill(rt: Any, uid: str, workspace: str) -> list[str]:
    """A thread of `uid` in `workspace` with one finished turn, a summary, a manifest line, an
    artifact (row and object), memory, a kernel row; returns its thread id."""
    thread = rt.threads.create(workspace, uid)

    async def turn() -> None:
        running = await start_turn(rt.turn_services, rt.turns, thread, _user(rt, uid), "hello there", background=True)
        await asyncio.wait_for(running.task, 30)

    asyncio.run(turn())
    thread.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), content="more words"), epoch=thread.epoch)
    assert thread.write_doc(SUMMARY, {"goal": "g"}, thread.epoch)
    assert thread.append_line(MANIFESTS, b'{"step": 1}', thread.epoch)
    rt.search.search(uid, [workspace], "words")  # the index catches up on a search
    origin = ArtifactOrigin(source="tool", user=uid, thread=thread.id, workspace=workspace, tool="python")
    rt.artifacts.save_bytes(thread, b"\x89PNG" + b"x" * 100, "png", "result", "image/png", origin, thread.epoch)
    rt.memory.remember(workspace, uid, f"{uid} prefers kWh per square metre")
    table, _ = rt.cluster.kernels()
    table.save(KernelRecord(workspace=workspace, user=uid, thread=thread.id, notice="no kernel yet"))
    return [thread.id]


def _counts(url: str, uid: str, threads: list[str]) -> dict[str, int]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        out = {t: conn.execute(f"SELECT count(*) AS n FROM {t} WHERE {col} = %s", (uid,)).fetchone()["n"]
               for t, col in USER_ROWS}
        for t in THREAD_ROWS:
            out[t] = conn.execute(f"SELECT count(*) AS n FROM {t} WHERE thread_id = ANY(%s)", (threads,)).fetchone()["n"]
    return out


def _objects(s3: Any, prefix: str) -> list[str]:
    listed = s3_client(s3).list_objects_v2(Bucket=s3.bucket, Prefix=f"{s3.prefix}/{prefix}")
    return [o["Key"] for o in listed.get("Contents", [])]


def s3_client(s3: Any):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=s3.access_key,
                        aws_secret_access_key=s3.secret_key, region_name=s3.region,
                        config=Config(s3={"addressing_style": "path"}))


def test_deleting_a_user_removes_everything_of_theirs_and_nothing_else(home, state_set, cluster_db_url, s3):
    h = make_harness(home, ScriptedModel(then="ok"), state=state_set)
    rt = h.rt
    alice = _fill(rt, "alice", "demo") + _fill(rt, "alice", "sales")
    bob = _fill(rt, "bob", "demo")
    before = _counts(cluster_db_url, "alice", alice)
    assert all(before[t] > 0 for t in before), before  # every kind of row is there to be removed
    assert _objects(s3, "ws/demo/u/alice/") and _objects(s3, "ws/sales/u/alice/")
    # an object no row names any more (a kernel's output never registered): the prefix goes too
    rt.cluster.blobs().put(f"ws/demo/u/alice/t/{alice[0]}/o/stray.txt", b"stray")
    bob_before = _counts(cluster_db_url, "bob", bob)

    removed = rt.users.delete("alice")

    assert sorted(removed) == ["ws/demo/u/alice/", "ws/sales/u/alice/"]
    assert _counts(cluster_db_url, "alice", alice) == {t: 0 for t in before}
    assert _objects(s3, "ws/demo/u/alice/") == [] and _objects(s3, "ws/sales/u/alice/") == []
    assert _counts(cluster_db_url, "bob", bob) == bob_before
    assert _objects(s3, "ws/demo/u/bob/")
    assert rt.memory.facts("demo", "bob")
    asyncio.run(rt.stop())


def _connections(url: str, database: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute("SELECT pid, application_name, state, query FROM pg_stat_activity "
                            "WHERE datname = %s AND pid <> pg_backend_pid() AND application_name LIKE 'datadesk@%%'",
                            (database,)).fetchall()


def test_runtime_stop_leaves_no_connection_open(home, state_set, cluster_db_url):
    database = cluster_db_url.rsplit("/", 1)[1]
    # a Runtime of its own, as `datadesk serve` builds it (a harness keeps its set open for the test)
    settings = msgspec.convert({"home": str(home), "sandbox": {"backend": "none"}, **state_set}, Settings,
                               dec_hook=lambda t, o: Path(o))
    rt = Runtime(settings=settings, model=ScriptedModel(then="ok"))
    rt.users.add("alice", ["demo"], [])

    async def main() -> tuple[int, list[dict[str, Any]]]:
        await rt.start()
        thread = rt.threads.create("demo", "alice")
        for text in ("one", "two"):  # claims, the journal's writer and listeners, the locks
            running = await start_turn(rt.turn_services, rt.turns, thread, _user(rt, "alice"), text, background=True)
            await asyncio.wait_for(running.task, 30)
        async for _ in rt.turns.journal.follow(thread.id, running.turn_id, lambda tid: False, None):
            break  # a follower: the journal's LISTEN connection
        lease = rt.cluster.locks().try_acquire("harden:probe")
        assert lease is not None
        during = len(_connections(cluster_db_url, database))
        await rt.stop()
        # every socket is closed by now; the server's backends take a moment to exit and leave
        # pg_stat_activity (a busy machine: up to a second or so)
        deadline = time.monotonic() + 5
        while _connections(cluster_db_url, database) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return during, _connections(cluster_db_url, database)

    during, after = asyncio.run(main())
    assert during >= 2
    assert after == [], after
