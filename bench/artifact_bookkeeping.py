"""Benchmark: the bookkeeping cost of recording one new artifact, by how many exist already.

    python bench/artifact_bookkeeping.py [--tiny] [--reps N] [--out PATH]

A data directory with N existing cache artifacts in one thread of the demo workspace (their
metadata written directly, quickly; N = 10, 1,000, 10,000), then, repeated:

- `after_create`: the quota's bookkeeping after a new small result (`ArtifactQuota.after_create`),
  with room under every limit ("room"), and with the thread at its count limit so that every new
  artifact evicts the oldest one ("evicts one");
- `bookkeeping`: `after_create` less the time spent expiring the victim's files (removing its
  data, writing and syncing its tombstone: the eviction itself, the same work at any size);
- `whole save`: a small result's whole save, `OffloadPipeline.write_text` (data file, metadata,
  the ledger row) plus `after_create`, with room;
- `sweep`: one periodic sweep round afterwards (`sweep_round`: every metadata file read, the
  ledger corrected from them, the full quota pass, the temp-file sweep).

Wall milliseconds (median, p90) and CPU milliseconds per call (process time; steadier on a busy
host). The script puts its own repository's `platform/` first on `sys.path`, so it measures the
code beside it (run it from another checkout to measure that one). Prints a table and writes JSON
to bench/results/artifact_bookkeeping.json. Goal (issue 27): <= 2 ms at 10,000.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))

import msgspec  # noqa: E402

from datadesk.domain.artifacts import Artifact, ArtifactOrigin  # noqa: E402
from datadesk.llm.tokens import count_tokens  # noqa: E402
from datadesk.offload.artifacts.quota import ArtifactQuota  # noqa: E402
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id  # noqa: E402
from datadesk.offload.pipeline import OffloadPipeline  # noqa: E402
from datadesk.settings import OffloadSettings  # noqa: E402
from datadesk.store.layout import Layout  # noqa: E402
from datadesk.store.threads import Thread  # noqa: E402

BIG = 10**12  # "no limit" for the limits a row does not exercise


def _origin() -> ArtifactOrigin:
    return ArtifactOrigin(source="tool", user="alice", thread="t1", workspace="demo", tool="sql_query",
                          arguments='{"sql": "select 1"}')


def make_world(home: Path, existing: int, thread_max_count: int) -> tuple[OffloadPipeline, ArtifactQuota, Thread]:
    """A data directory whose thread holds `existing` cache artifacts (metadata and a small data
    file each, least recently used first), and the store, quota and pipeline over it."""
    layout = Layout(home)
    tdir = layout.thread_dir("demo", "alice", "t1")
    adir = tdir / "artifacts"
    adir.mkdir(parents=True)
    enc = msgspec.json.Encoder()
    now = time.time()
    for i in range(existing):
        aid = new_artifact_id()
        art = Artifact(id=aid, kind="result", format="text", file=f"{aid}.txt", origin=_origin(),
                       created=now - 10_000 + i * 0.1, last_used=now - 10_000 + i * 0.1, bytes=100,
                       media_type="text/plain; charset=utf-8")
        (adir / art.file).write_bytes(b"x" * 100)
        (adir / f"{aid}.json").write_bytes(enc.encode(art))
    settings = OffloadSettings(thread_max_count=thread_max_count, thread_max_bytes=BIG, user_max_count=BIG,
                               user_max_bytes=BIG, global_max_count=BIG, global_max_bytes=BIG)
    store = ArtifactStore(layout)
    quota = ArtifactQuota(settings, store)
    return OffloadPipeline(settings, store, count_tokens), quota, Thread(tdir)


def _stats(wall: list[float], cpu: list[float]) -> dict[str, float]:
    wall = sorted(wall)
    return {"ms_median": round(statistics.median(wall) * 1000, 3),
            "ms_p90": round(wall[int(len(wall) * 0.9)] * 1000, 3) if len(wall) > 1 else round(wall[0] * 1000, 3),
            "cpu_ms_mean": round(statistics.fmean(cpu) * 1000, 3)}


def _time_expire(store: ArtifactStore) -> list[float]:
    """Time spent in `store.expire` (a victim's files: its data removed, its tombstone written and
    synced), [wall, cpu] since last reset: the part of an eviction that is not bookkeeping."""
    spent = [0.0, 0.0]
    expire = store.expire

    def timed(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        try:
            return expire(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - w
            spent[1] += time.process_time() - c

    store.expire = timed  # type: ignore[method-assign]
    return spent


def bench_case(existing: int, reps: int, evicts: bool) -> dict:
    """`after_create` (and, with room, the whole save) of `reps` new small results."""
    with tempfile.TemporaryDirectory() as tmp:
        # with "evicts one" the thread is at its count limit: each new artifact evicts the oldest
        pipeline, quota, thread = make_world(Path(tmp) / "home", existing, existing if evicts else BIG)
        warm = pipeline.write_text(thread, new_artifact_id(), "warm-up", _origin(), "result")
        quota.after_create(warm)  # first use (opens what the quota keeps; the old code: nothing)
        expiring = _time_expire(quota.store)
        after_wall, after_cpu, save_wall, save_cpu, book_wall, book_cpu = [], [], [], [], [], []
        evicted = 0
        for i in range(reps):
            w0, c0 = time.perf_counter(), time.process_time()
            art = pipeline.write_text(thread, new_artifact_id(), f"small result {i}", _origin(), "result")
            w1, c1 = time.perf_counter(), time.process_time()
            expiring[:] = [0.0, 0.0]
            evicted += len(quota.after_create(art))
            w2, c2 = time.perf_counter(), time.process_time()
            after_wall.append(w2 - w1)
            after_cpu.append(c2 - c1)
            book_wall.append(w2 - w1 - expiring[0])
            book_cpu.append(c2 - c1 - expiring[1])
            save_wall.append(w2 - w0)
            save_cpu.append(c2 - c0)
        w0, c0 = time.perf_counter(), time.process_time()
        quota.sweep_round(0)  # the periodic sweep: every metadata file read (and the ledger checked)
        sweep = {"ms": round((time.perf_counter() - w0) * 1000, 1),
                 "cpu_ms": round((time.process_time() - c0) * 1000, 1)}
    row = {"existing": existing, "case": "evicts one" if evicts else "room", "reps": reps, "evicted": evicted,
           "after_create": _stats(after_wall, after_cpu), "bookkeeping": _stats(book_wall, book_cpu),
           "sweep_round": sweep}
    if not evicts:
        row["whole_save"] = _stats(save_wall, save_cpu)
    return row


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--reps", type=int, default=None, help="new artifacts per row (default 40; --tiny 5)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "artifact_bookkeeping.json")
    args = ap.parse_args()
    sizes = (10, 1_000) if args.tiny else (10, 1_000, 10_000)
    reps = args.reps or (5 if args.tiny else 40)
    if reps < 1:
        ap.error(f"--reps must be at least 1 (got {reps})")
    rows = [bench_case(n, reps, evicts) for n in sizes for evicts in (False, True)]

    print(f"\nBookkeeping of one new artifact (code at {ROOT}, {_commit()}; {reps} new artifacts per row;"
          " ms median / p90 / CPU ms mean)")
    print(f"{'existing':>9}  {'case':<11}{'after_create':>22}{'bookkeeping':>22}{'whole save':>22}{'evicted':>9}"
          f"{'sweep ms':>10}")

    def cell(x: dict | None) -> str:
        return f"{x['ms_median']:>8} {x['ms_p90']:>6} {x['cpu_ms_mean']:>6}" if x else f"{'':>22}"

    for r in rows:
        print(f"{r['existing']:>9,}  {r['case']:<11}{cell(r['after_create'])}{cell(r['bookkeeping'])}"
              f"{cell(r.get('whole_save'))}{r['evicted']:>9}{r['sweep_round']['ms']:>10}")
    top = max(r["existing"] for r in rows)
    worst = max(r["bookkeeping"]["ms_median"] for r in rows if r["existing"] == top)
    print(f"\nbookkeeping of a new artifact at {top:,} existing: at most {worst} ms median (goal <= 2 ms at 10,000)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tiny": args.tiny, "code": str(ROOT), "commit": _commit(), "rows": rows,
                                    "python": sys.version.split()[0]}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
