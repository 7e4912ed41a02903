"""A disk that fills up (issue 25): nothing acknowledged is lost, nothing is half-kept, the error
names the disk, and the thread works again once space returns. The home is on a real tmpfs of
a few MB (root: `mount -t tmpfs`), filled by a file of the test's own."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel
from datadesk.store.threadlog import ThreadLog
from tests.conftest import make_harness, parse_sse, wait_until

pytestmark = pytest.mark.faults
ANSWER = "A long answer. " * (352_000 // 15)  # 352,000 characters


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MB tmpfs mounted for this test (skips unless root can mount one)."""
    if os.geteuid() != 0:
        if os.environ.get("DATADESK_REQUIRE_FAULTS") == "1":
            pytest.fail("DATADESK_REQUIRE_FAULTS=1 but the tests do not run as root (a tmpfs must be mounted)")
        pytest.skip("mounting a small disk needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """A filler file that leaves about `leave_bytes` free on `disk`."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    try:
        with open(filler, "ab") as fh:
            fh.write(b"\0" * max(0, free - leave_bytes))
    except OSError as exc:  # a background write (the artifact sweeper) took the last bytes first:
        if exc.errno != errno.ENOSPC:  # the disk is as full as asked
            raise
    return filler


def deleted_files_open(under: Path) -> list[str]:
    """Files of this process under `under` that were deleted but are still open (space still used)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)) and target.endswith(" (deleted)"):
            out.append(target)
    return out


def test_an_answer_on_a_full_disk_ends_with_an_error_naming_the_disk_and_loses_no_seq(small_disk) -> None:
    home = small_disk / "var"
    h = make_harness(home, ScriptedModel([ANSWER, "short answer"], chunk_size=2000), store={"min_free_mb": 0})
    with TestClient(h.app()) as c:
        tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        log = ThreadLog(h.rt.threads.get(tid, "alice", ["demo"]).dir / "log.jsonl")
        # the start-up sweep builds the artifact ledger (~100 KB of SQLite WAL) in the background:
        # filled before it is done, the disk would be too full for the question itself
        wait_until(h.rt.quota.ledger.built, timeout=10)
        filler = fill(small_disk, 40 * 1024)  # 40 KB free: room for the question, not for the answer
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "tell me everything"},
                                  headers=h.auth("alice")).text)
        errors = [d for e, d in events if e == "error"]
        assert errors and errors[0]["kind"] == "disk", events[-3:]
        assert "the disk is full" in errors[0]["message"] and "was not saved" in errors[0]["message"]
        assert not [e for e, _ in events if e == "message.completed"]  # never acknowledged
        assert events[-1][0] == "done" and events[-1][1]["status"] == "error"
        assert [r.seq for r in log] == [1] and log.path.read_bytes().endswith(b"\n")
        filler.unlink()  # space returns: the thread works again, and the next record takes seq 2
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "and now?"},
                                  headers=h.auth("alice")).text)
        done = [d for e, d in events if e == "message.completed"]
        assert done and done[0]["content"] == "short answer"
        assert [(r.seq, r.role) for r in log] == [(1, "user"), (2, "user"), (3, "assistant")]
        detail = c.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()
        assert [r["seq"] for r in detail["records"]] == [1, 2, 3]


def test_below_min_free_new_turns_and_uploads_are_refused_and_health_says_so(small_disk) -> None:
    home = small_disk / "var"
    h = make_harness(home, ScriptedModel(["fine"]), store={"min_free_mb": 20})
    with TestClient(h.app()) as c:
        tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        assert c.get("/api/health").json()["disk"]["low"] is False
        filler = fill(small_disk, 8 * 1024 * 1024)
        # health gives a disk figure up to store/diskspace.py FRESH_S old
        wait_until(lambda: c.get("/api/health").json()["disk"]["low"], timeout=5)
        health = c.get("/api/health").json()
        assert health["status"] == "degraded" and health["disk"]["low"] and health["disk"]["min_free_mb"] == 20
        r = c.post(f"/api/threads/{tid}/messages", json={"content": "hi"}, headers=h.auth("alice"))
        assert r.status_code == 507 and "store.min_free_mb = 20" in r.json()["detail"], r.text
        r = c.post(f"/api/threads/{tid}/uploads", files={"file": ("a.csv", b"a,b\n1,2\n")}, headers=h.auth("alice"))
        assert r.status_code == 507 and "store.min_free_mb" in r.json()["detail"], r.text
        assert not any(p.name.endswith(".tmp") for p in (home / "workspaces").rglob("*"))
        filler.unlink()
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "hi"},
                                  headers=h.auth("alice")).text)
        assert [d["content"] for e, d in events if e == "message.completed"] == ["fine"]
        wait_until(lambda: not c.get("/api/health").json()["disk"]["low"], timeout=5)
        assert c.get("/api/health").json()["status"] == "ok"


def test_an_upload_on_a_full_disk_is_507_and_its_temp_file_is_gone_at_once(small_disk) -> None:
    home = small_disk / "var"
    h = make_harness(home, ScriptedModel([]), store={"min_free_mb": 0})
    body = b"id,name\n" + b"".join(b"%d,name number %d\n" % (i, i) for i in range(200_000))  # ~4.6 MB
    with TestClient(h.app()) as c:
        tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        fill(small_disk, 1024 * 1024)
        r = c.post(f"/api/threads/{tid}/uploads", files={"file": ("big.csv", body)}, headers=h.auth("alice"))
        assert r.status_code == 507, r.text
        assert "the disk is full" in r.json()["detail"] and "big.csv" in r.json()["detail"], r.text
        assert not [p for p in (home / "workspaces").rglob("*") if p.name.endswith(".tmp")]
        assert deleted_files_open(small_disk) == []  # the space is free again, not held by an open file
        arts = c.get(f"/api/threads/{tid}/artifacts", headers=h.auth("alice")).json()
        assert arts["artifacts"] == [] if isinstance(arts, dict) else arts == []


def test_a_large_result_on_a_full_disk_is_a_tool_error_naming_the_disk_and_no_artifact(small_disk,
                                                                                        demo_warehouse_dir) -> None:
    import shutil

    from datadesk.llm.scripted import tool_step
    from datadesk.store.layout import Layout
    from datadesk.store.workspaces import ensure_demo_workspace
    from tests.fakes.sandbox import FakeSandbox

    home = small_disk / "var"
    data = Layout(home).workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(Layout(home))
    sql = "SELECT range AS id, md5(range::VARCHAR) AS note FROM range(200000)"  # ~6 MB of Parquet
    h = make_harness(home, ScriptedModel([tool_step("sql_query", {"sql": sql}), "done"]), store={"min_free_mb": 0})
    FakeSandbox(h.rt)  # the python tool is there: the result is offloaded to a Parquet file
    with TestClient(h.app()) as c:
        tid = c.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        filler = fill(small_disk, 256 * 1024)
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "all rows"},
                                  headers=h.auth("alice")).text)
        finished = [d for e, d in events if e == "tool.finished"]
        assert finished and not finished[0]["ok"] and "the disk is full" in finished[0]["preview"], events[-4:]
        assert not [e for e, _ in events if e == "artifact.created"]
        adir = h.rt.threads.get(tid, "alice", ["demo"]).artifacts_dir
        assert not [p for p in adir.iterdir()] if adir.exists() else True  # nothing half-written is left
        filler.unlink()
        log = ThreadLog(h.rt.threads.get(tid, "alice", ["demo"]).dir / "log.jsonl")
        roles = [r.role for r in log]
        assert roles[:3] == ["user", "assistant", "tool"]  # the call is paired with its (error) result


def test_a_memory_write_on_a_full_disk_is_507_naming_the_disk_and_memory_json_stays_whole(small_disk) -> None:
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore

    home = small_disk / "var"
    h = make_harness(home, ScriptedModel([]), store={"min_free_mb": 0})
    (Layout(home).workspace_dir("demo")).mkdir(parents=True, exist_ok=True)
    Layout(home).workspace_config("demo").write_text('name = "Demo"\nmemory = true\n')
    _, token = UserStore(h.rt.layout).add("dora", ["demo"], ["memory"])
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(h.app()) as c:
        r = c.post("/api/memory", json={"text": "The fiscal year starts in April"}, headers=auth)
        assert r.status_code == 201, r.text
        first = r.json()["id"]
        udir = Layout(home).user_dir("demo", "dora")
        memory, audit = udir / "memory.json", udir / "memory.audit.jsonl"
        before, audit_before = memory.read_bytes(), audit.read_bytes()
        filler = fill(small_disk, 0)
        st = os.statvfs(small_disk)
        assert st.f_bavail * st.f_frsize < 4096  # not one page left for the new memory.json
        r = c.post("/api/memory", json={"text": "Reports go out on Mondays"}, headers=auth)
        assert r.status_code == 507, r.text
        detail = r.json()["detail"]
        assert "the disk is full" in detail and "memory.json" in detail and "was not saved" in detail, detail
        assert memory.read_bytes() == before  # the old file, whole: the write never reached it
        assert [f["id"] for f in json.loads(before)["facts"]] == [first]
        assert audit.read_bytes() == audit_before  # no event for a fact that was not kept
        assert not [p.name for p in udir.iterdir() if p.name.endswith(".tmp")]
        assert deleted_files_open(small_disk) == []
        listed = c.get("/api/memory", headers=auth).json()["facts"]
        assert [f["id"] for f in listed["active"]] == [first]  # the app still reads it
        filler.unlink()  # room again: the same write works
        r = c.post("/api/memory", json={"text": "Reports go out on Mondays"}, headers=auth)
        assert r.status_code == 201, r.text
        texts = {f["text"] for f in json.loads(memory.read_bytes())["facts"]}
        assert texts == {"The fiscal year starts in April", "Reports go out on Mondays"}
