"""Crash consistency and tail reads of `log.jsonl`."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from datadesk.domain.records import Record, ToolCall
from datadesk.store.threadlog import LogClosed, ThreadLog


def rec(content: str, role: str = "user"):
    return lambda seq: Record(seq=seq, role=role, ts=time.time(), content=content)


def test_append_assigns_increasing_seq(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    seqs = [log.append(rec(f"m{i}")).seq for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert [r.content for r in log] == [f"m{i}" for i in range(5)]


def test_roles_and_tool_fields_round_trip(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    log.append(rec("q"))
    log.append(lambda s: Record(seq=s, role="assistant", ts=1.0, tool_calls=[ToolCall("c1", "sql_query", '{"sql":"select 1"}')],
                                provider_fields={"reasoning_content": "think"}))
    log.append(lambda s: Record(seq=s, role="tool", ts=2.0, tool_call_id="c1", name="sql_query", content="1"))
    a, b, c = log.tail(3)
    assert b.tool_calls[0].arguments == '{"sql":"select 1"}'
    assert b.provider_fields == {"reasoning_content": "think"}
    assert c.tool_call_id == "c1" and c.role == "tool"


def test_torn_last_line_is_skipped_then_repaired(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = ThreadLog(path)
    for i in range(3):
        log.append(rec(f"m{i}"))
    # simulate a crash in the middle of writing record 4
    whole = msgspec.json.encode(Record(seq=4, role="user", ts=1.0, content="half")) + b"\n"
    with open(path, "ab") as fh:
        fh.write(whole[: len(whole) // 2])
    assert [r.seq for r in log] == [1, 2, 3]
    assert [r.seq for r in log.tail(2)] == [2, 3]
    new = log.append(rec("after crash"))
    assert new.seq == 4
    assert [r.content for r in log] == ["m0", "m1", "m2", "after crash"]
    assert path.read_bytes().endswith(b"\n")
    torn = path.with_name("log.torn").read_bytes()
    assert b'"half' not in torn or b"seq" in torn  # the fragment is kept for forensics
    assert torn.strip()


def test_unreadable_complete_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = ThreadLog(path)
    log.append(rec("a"))
    with open(path, "ab") as fh:
        fh.write(b"{not json}\n")
    log.append(rec("b"))
    assert [r.content for r in log] == ["a", "b"]
    assert [r.seq for r in log.tail(5)] == [1, 2]


def test_tail_reads_only_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    lines = b"".join(msgspec.json.encode(Record(seq=i, role="user", ts=0.0, content="x" * 200)) + b"\n"
                     for i in range(1, 20_001))
    path.write_bytes(lines)
    log = ThreadLog(path)
    read_bytes = 0
    real_open = open

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n=-1):
            nonlocal read_bytes
            data = self.fh.read(n)
            read_bytes += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr("builtins.open", lambda *a, **k: Counting(real_open(*a, **k)))
    tail = log.tail(50)
    assert [r.seq for r in tail] == list(range(19_951, 20_001))
    assert read_bytes < 200_000 < len(lines)


def test_append_to_deleted_thread_fails_cleanly(tmp_path: Path) -> None:
    tdir = tmp_path / "t1"
    tdir.mkdir()
    log = ThreadLog(tdir / "log.jsonl")
    log.append(rec("a"))
    for p in tdir.iterdir():
        p.unlink()
    tdir.rmdir()
    with pytest.raises(LogClosed):
        log.append(rec("b"))


def test_concurrent_appends_from_threads_never_interleave(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    big = "y" * 70_000  # larger than a pipe buffer / block: a torn write would show

    def writer(n: int) -> None:
        for i in range(25):
            ThreadLog(tmp_path / "log.jsonl").append(rec(f"{n}-{i}-{big}"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = list(log)
    assert len(records) == 100
    assert [r.seq for r in records] == list(range(1, 101))


def _proc_writer(path: str, n: int) -> None:
    log = ThreadLog(Path(path))
    for i in range(30):
        log.append(lambda seq: Record(seq=seq, role="user", ts=0.0, content=f"{n}-{i}-" + "z" * 10_000))


def test_concurrent_appends_from_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_proc_writer, args=(str(path), n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = list(ThreadLog(path))
    assert [r.seq for r in records] == list(range(1, 91))
    assert sorted(r.content.split("-")[0] for r in records).count("0") == 30


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 120), k=st.integers(0, 150), cut=st.integers(0, 300))
def test_tail_matches_full_read_with_any_torn_tail(tmp_path_factory, n: int, k: int, cut: int) -> None:
    path = tmp_path_factory.mktemp("h") / "log.jsonl"
    log = ThreadLog(path)
    for i in range(n):
        log.append(rec("w" * (i * 37 % 3000)))
    if cut:
        with open(path, "ab") as fh:
            fh.write(b'{"seq": 99999, "role": "user", "content": "' + b"t" * cut)
    everything = list(log)
    assert [r.seq for r in everything] == list(range(1, n + 1))
    assert log.tail(k) == everything[-k:] if k else log.tail(k) == []


def test_find_reads_from_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`find` (paging an old tool result back) stops at the newest match: no full scan."""
    log = ThreadLog(tmp_path / "log.jsonl")
    for i in range(2_000):
        log.append(rec(f"m{i}"))

    def no_full_scan(self):
        raise AssertionError("find read the whole log")

    monkeypatch.setattr(ThreadLog, "__iter__", no_full_scan)
    assert [r.content for r in log.find(lambda r: r.content.startswith("m199"), limit=2)] == ["m1999", "m1998"]


def _thread(tmp_path: Path):
    from datadesk.store.layout import Layout
    from datadesk.store.threads import ThreadStore

    store = ThreadStore(Layout(tmp_path))
    return store, store.create("demo", "alice")


def test_a_clear_refuses_every_guarded_write_begun_before_it(tmp_path: Path) -> None:
    """The Thread owns the epoch: appends, manifests and guarded writes from before a clear are
    refused after it, and the cleared folder keeps only its meta and its lock."""
    store, thread = _thread(tmp_path)
    epoch = thread.epoch
    thread.append(rec("before"), epoch=epoch)
    assert thread.append_manifest(b'{"step": 1}', epoch)
    store.clear(thread)
    assert thread.cleared_since(epoch) and not thread.cleared_since(thread.epoch)
    with pytest.raises(LogClosed, match="was cleared"):
        thread.append(rec("late"), epoch=epoch)
    with pytest.raises(LogClosed):
        with thread.guarded(epoch):
            pass
    assert not thread.append_manifest(b'{"step": 2}', epoch)
    assert sorted(p.name for p in thread.dir.iterdir()) == ["meta.json", "thread.lock"]
    thread.append(rec("after"), epoch=thread.epoch)  # the new epoch writes again
    assert [r.content for r in thread.log] == ["after"]


def test_a_bare_log_cannot_guard_by_epoch(tmp_path: Path) -> None:
    """Only the owning Thread knows the epoch: an epoch check on a log opened alone is refused."""
    log = ThreadLog(tmp_path / "log.jsonl")
    with pytest.raises(ValueError, match="owning Thread"):
        log.append(rec("x"), epoch=0)
    assert list(log) == []


def test_summaries_are_rewritten_under_the_thread_lock(tmp_path: Path) -> None:
    """Memory's hard delete redacts summaries through the Thread: JSON, JSON lines and a torn line."""
    _, thread = _thread(tmp_path)
    thread.summary_path.write_text('{"goal": "secret plan", "n": 1}')
    thread.summary_revisions_path.write_text('{"goal": "secret plan"}\n{"goal": "other"}\nsecret plan torn')
    changed = thread.rewrite_summaries(lambda v: v.replace("secret plan", "[x]") if isinstance(v, str)
                                       else {k: (x.replace("secret plan", "[x]") if isinstance(x, str) else x)
                                             for k, x in v.items()})
    assert changed == 2
    assert msgspec.json.decode(thread.summary_path.read_bytes()) == {"goal": "[x]", "n": 1}
    assert "secret plan" not in thread.summary_revisions_path.read_text()
    assert thread.rewrite_summaries(lambda v: v) == 0
