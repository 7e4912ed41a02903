"""`datadesk migrate`: copy a file home into the cluster set (PostgreSQL and an object store),
offline (SCALE.md section 5.6).

It refuses while anything holds the home: every turn lock in `<home>/locks/turns/` is taken
with timeout 0 (and held until the end, so no turn starts meanwhile), and every worker
heartbeat in `<home>/sandbox/workers/` must be stale; the refusal names the holder. Then it
copies, reading the home through `migration/filehome.py` (nothing in the home is changed but
`migrated.json`):

- users with their token hashes and last login, unexpired sessions (`PgUserStore.import_*`);
- per thread: the `threads` row (meta, epoch, last seq), the records (`log.jsonl` in order,
  each line's bytes as they are, a torn last line skipped), the documents (summary, summary
  status, task state) and line sets (summary revisions; the newest `MANIFESTS_KEPT` manifests);
- the thread's artifacts: each available one's data (and an upload's kept original) uploaded
  after its sha256 was checked against its metadata, then its row; tombstones as rows;
- the thread's `outputs/` files, as objects under `.../o/<name>`;
- memory documents and their audit;
- the shares of threads (migration/shares.py).

**Idempotent.** Everything is written by id (upserts), after comparing with what is there
(hashes of records and lines, decoded documents, object sizes), so a second run writes
nothing and an interrupted one resumes. Until `migrated.json` names this database the home is
the truth: a row that differs is made equal to the home. Once it does, the cluster is the
truth: a rerun only fills in what is missing and lists what differs as `kept`. Either way a
thread cleared or written in the cluster (another epoch, or records past the home's) is kept.

**Verify** (`verify=True`) writes nothing: it compares counts, seqs and hashes per thread, the
objects' bytes, users, sessions and memory (migration/verify.py), one line per difference.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import resource
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import msgspec
import psycopg
from filelock import FileLock, Timeout

from datadesk.cluster.database import Database, DatabaseError
from datadesk.cluster.memory import PgMemoryDocs
from datadesk.cluster.migration.shares import copy_shares
from datadesk.cluster.migration.filehome import (FileThread, artifact_problem, output_files, read_artifacts,
                                                 read_invitations, read_memories, read_sessions, read_thread,
                                                 read_users, sha256_bytes, thread_dirs)
from datadesk.cluster.migration.report import (MIGRATED_FILE, HomeInUse, Progress, Report, artifact_keys,
                                               artifact_row, same_user)
from datadesk.cluster.threads import MANIFESTS_KEPT, jsonb_text
from datadesk.cluster.users import PgUserStore
from datadesk.sandbox.ownership import owner_alive, workers_dir
from datadesk.store.interfaces.artifacts import ThreadKey
from datadesk.store.interfaces.blobs import BlobExists, BlobNotFound, BlobStore, blob_key, thread_prefix
from datadesk.store.files import read_json_object, write_json
from datadesk.store.layout import Layout

log = logging.getLogger(__name__)

DEFAULT_STALE_S = 60.0  # sandbox.owner_stale_s when only a Layout is given
MAX_HELD = 512  # turn locks held through the run; past that they are checked and let go (file handles)









# -- the home is offline -------------------------------------------------------------------------
def _turn_lock_holder(path: Path) -> str:
    name = path.name
    if name.startswith("t-"):
        marker = read_json_object(path.with_suffix(".turn")) or {}
        pid = f" (pid {marker['pid']})" if "pid" in marker else ""
        return f"a turn is running on thread {name[2:-5]}{pid}: {path} is held"
    return f"a user's turn slot is held: {path}"


def _live_workers(home: Path, stale_s: float) -> list[str]:
    found = []
    folder = workers_dir(home)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        if owner_alive(home, path.stem, stale_s):
            info = read_json_object(path) or {}
            age = time.time() - path.stat().st_mtime
            found.append(f"worker {path.stem} (pid {info.get('pid')} on host {info.get('host')}) is alive: its "
                         f"heartbeat {path} is {age:.0f} s old (stale after {stale_s:.0f} s)")
    return found


@contextlib.contextmanager
def offline(layout: Layout, stale_s: float) -> Iterator[None]:
    """Hold the home for a migration: HomeInUse when a turn lock is held, a worker's heartbeat
    is fresh, or another migrate runs. The turn locks stay held while the block runs."""
    home = layout.home
    if not home.is_dir():
        raise FileNotFoundError(f"no file home at {home}")
    _raise_file_limit()
    locks = home / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        mine = FileLock(str(locks / "migrate.lock"), thread_local=False)
        try:
            mine.acquire(timeout=0)
        except Timeout:
            raise HomeInUse(f"another `datadesk migrate` runs on {home}") from None
        stack.callback(mine.release)
        holders: list[str] = []
        turns = locks / "turns"
        for i, path in enumerate(sorted(turns.glob("*.lock")) if turns.is_dir() else ()):
            lock = FileLock(str(path), thread_local=False)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                holders.append(_turn_lock_holder(path))
                continue
            if i < MAX_HELD:
                stack.callback(lock.release)
            else:
                lock.release()
        holders += _live_workers(home, stale_s)
        if holders:
            raise HomeInUse(f"{home} is in use; stop every DataDesk server on it first:\n  " + "\n  ".join(holders))
        yield


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


# -- the entry point ---------------------------------------------------------------------------
def home_of(settings_or_layout: Any) -> tuple[Layout, float]:
    """The home's layout and how old a heartbeat must be to count as stale."""
    if isinstance(settings_or_layout, Layout):
        return settings_or_layout, DEFAULT_STALE_S
    sandbox = getattr(settings_or_layout, "sandbox", None)
    return Layout(settings_or_layout.home), float(getattr(sandbox, "owner_stale_s", DEFAULT_STALE_S))


def migrate_home(settings_or_layout: Any, db: Database, blobs: BlobStore, verify: bool = False, *,
                 progress: Progress | None = None, index_search: bool = True) -> Report:
    """Copy the home into `db` and `blobs` (or, with `verify`, only compare); see the module doc.
    HomeInUse when the home is not offline."""
    layout, stale_s = home_of(settings_or_layout)
    report = Report(str(layout.home), db.where, blobs.where, verify)
    started = time.monotonic()
    with offline(layout, stale_s), _named(db):
        if verify:
            from datadesk.cluster.migration.verify import verify_home

            verify_home(layout, db, blobs, report, progress)
        else:
            marker = read_json_object(layout.home / MIGRATED_FILE)
            fill = marker is not None and marker.get("database") == db.where
            if marker is not None and not fill:
                report.notes.append(f"this home was migrated before, to {marker.get('database')}")
            _copy(layout, db, blobs, report, fill, progress, index_search)
            report.seconds = time.monotonic() - started
            write_marker(layout, db, blobs, report)
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def _named(db: Database) -> Iterator[None]:
    """A database error as DatabaseError naming the database (no password): callers outside
    this package never see psycopg."""
    try:
        yield
    except psycopg.Error as exc:
        raise DatabaseError(f"the cluster database {db.where} failed during the migration: {exc}") from exc


def write_marker(layout: Layout, db: Database, blobs: BlobStore, report: Report) -> None:
    """`<home>/migrated.json`: when, to which database (no password) and bucket, what was copied."""
    write_json(layout.home / MIGRATED_FILE, {
        "migrated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "database": db.where, "storage": blobs.where, "bucket": getattr(blobs, "bucket", None),
        "host": socket.gethostname(), "counts": dict(sorted(report.counts.items())),
        "not_copied": len(report.notes), "kept": len(report.kept), "seconds": round(report.seconds, 1)})


def _copy(layout: Layout, db: Database, blobs: BlobStore, report: Report, fill: bool,
          progress: Progress | None, index_search: bool) -> None:
    copy_users(layout, db, report, fill)
    threads = thread_dirs(layout, report.notes)
    owners: dict[str, set[str]] = {}
    for i, (ws, uid, tid) in enumerate(threads, 1):
        ft = read_thread(layout, ws, uid, tid, MANIFESTS_KEPT, report.notes)
        if ft is not None and copy_thread(db, blobs, ft, report, fill):
            owners.setdefault(uid, set()).add(ws)
        if progress is not None:
            progress("threads", i, len(threads))
    copy_memory(layout, db, report, fill)
    copy_shares(layout, db, report, fill)  # migration/shares.py
    if index_search:
        from datadesk.cluster.search import PgSearch

        search = PgSearch(db)
        for uid, wss in sorted(owners.items()):
            while search.sync(sorted(wss), uid):  # each call stops after its budget; 0 once caught up
                pass


# -- users ---------------------------------------------------------------------------------------


def copy_users(layout: Layout, db: Database, report: Report, fill: bool) -> None:
    users, logins = read_users(layout)
    pg = PgUserStore(db)
    known = set()
    for user in users:
        known.add(user.id)
        report.counts["users"] += 1
        report.counts["tokens"] += len(user.tokens)
        have = pg.get(user.id)
        if have is not None and same_user(have, user) and pg.has_logged_in(user.id) == (user.id in logins):
            continue
        if have is not None and fill:
            report.kept.append(f"user {user.id} differs in the cluster database: left as it is there")
            continue
        pg.import_user(user, logins.get(user.id))
        report.wrote("users")
    sessions = {d: s for d, s in read_sessions(layout).items() if s.user in known}
    with db.connection() as conn:
        there = {r["hash"] for r in conn.execute("SELECT hash FROM sessions WHERE hash = ANY(%s)", (list(sessions),))}
    for digest, sess in sessions.items():
        report.counts["sessions"] += 1
        if digest not in there and pg.import_session(digest, sess.user, sess.created, sess.expires):
            report.wrote("sessions")
    for inv in read_invitations(layout):  # open ones keep working after the move; used ones are history
        report.counts["invitations"] += 1
        if pg.import_invitation(inv):
            report.wrote("invitations")


# -- threads -------------------------------------------------------------------------------------
def copy_thread(db: Database, blobs: BlobStore, ft: FileThread, report: Report, fill: bool) -> bool:
    """Copy one thread's rows, then its artifacts and outputs; False when it was kept (changed
    in the cluster since) and nothing of it copied."""
    report.counts["threads"] += 1
    report.counts["records"] += len(ft.records)
    report.counts["documents"] += len(ft.docs)
    report.counts["lines"] += sum(len(v) for v in ft.lines.values())
    if not _thread_rows(db, ft, report, fill):
        return False
    copy_artifacts(db, blobs, ft, report, fill)
    copy_outputs(blobs, ft, report, fill)
    return True


def _thread_rows(db: Database, ft: FileThread, report: Report, fill: bool) -> bool:
    """The thread's row, records, documents and lines, in one transaction."""
    with db.connection() as conn:
        row = conn.execute("SELECT workspace, owner, epoch, last_seq FROM threads WHERE id = %s FOR UPDATE",
                           (ft.tid,)).fetchone()
        if row is not None:
            if (row["workspace"], row["owner"]) != (ft.ws, ft.uid):
                report.kept.append(f"{ft.where}: the cluster database holds thread {ft.tid} of user {row['owner']} "
                                   f"in workspace {row['workspace']}: not copied")
                return False
            if row["epoch"] != ft.meta.epoch or row["last_seq"] > ft.last_seq:
                report.kept.append(f"{ft.where}: cleared or written in the cluster since it was copied (epoch "
                                   f"{row['epoch']}, last seq {row['last_seq']}; the home: {ft.meta.epoch}, "
                                   f"{ft.last_seq}): left as it is there")
                return False
            if fill:
                return True
        report.wrote("threads", conn.execute(
            "INSERT INTO threads (id, workspace, owner, epoch, last_seq, meta, created, updated) "
            "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "epoch = excluded.epoch, last_seq = excluded.last_seq, meta = excluded.meta, created = excluded.created, "
            "updated = excluded.updated "
            "WHERE (threads.epoch, threads.last_seq, threads.meta, threads.created, threads.updated) IS DISTINCT FROM "
            "(excluded.epoch, excluded.last_seq, excluded.meta, excluded.created, excluded.updated) RETURNING id",
            (ft.tid, ft.ws, ft.uid, ft.meta.epoch, ft.last_seq, jsonb_text(ft.meta), ft.meta.created,
             ft.meta.updated)).rowcount)
        changed = _sync_records(conn, ft, report)
        _sync_docs(conn, ft, report)
        _sync_lines(conn, ft, report)
        if row is not None and changed:  # the search index of those records is stale: rebuilt from them
            conn.execute("DELETE FROM search_entries WHERE thread_id = %s", (ft.tid,))
            conn.execute("DELETE FROM search_marks WHERE thread_id = %s", (ft.tid,))
    return True


def _sync_records(conn: Any, ft: FileThread, report: Report) -> int:
    """Make the thread's `records` rows the home's lines (compared by sha256); returns rows changed."""
    have = {r["seq"]: r["h"] for r in conn.execute(
        "SELECT seq, encode(sha256(body), 'hex') AS h FROM records WHERE thread_id = %s", (ft.tid,))}
    put = [(ft.tid, seq, body) for seq, body in ft.records if have.get(seq) != sha256_bytes(body)]
    gone = sorted(set(have) - {seq for seq, _ in ft.records})
    if put and not have:  # a new thread: COPY is the fast way in
        with conn.cursor() as cur, cur.copy("COPY records (thread_id, seq, body) FROM STDIN") as copy:
            for item in put:
                copy.write_row(item)
    elif put:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO records (thread_id, seq, body) VALUES (%s, %s, %s) "
                            "ON CONFLICT (thread_id, seq) DO UPDATE SET body = excluded.body", put)
    if gone:
        conn.execute("DELETE FROM records WHERE thread_id = %s AND seq = ANY(%s)", (ft.tid, gone))
    report.wrote("records", len(put) + len(gone))
    return len(put) + len(gone)


def _sync_docs(conn: Any, ft: FileThread, report: Report) -> None:
    have = {r["name"]: msgspec.json.decode(r["v"]) for r in conn.execute(
        "SELECT name, value::text AS v FROM thread_docs WHERE thread_id = %s", (ft.tid,))}
    for name, (value, mtime) in ft.docs.items():
        text = jsonb_text(value)
        if name in have and have[name] == msgspec.json.decode(text):
            continue
        conn.execute("INSERT INTO thread_docs (thread_id, name, value, epoch, updated) "
                     "VALUES (%s, %s, %s::jsonb, %s, %s) ON CONFLICT (thread_id, name) DO UPDATE SET value = excluded.value, epoch = excluded.epoch, "
                     "updated = excluded.updated", (ft.tid, name, text, ft.meta.epoch, mtime))
        report.wrote("documents")
    for name in set(have) - set(ft.docs):
        conn.execute("DELETE FROM thread_docs WHERE thread_id = %s AND name = %s", (ft.tid, name))
        report.wrote("documents")


def _sync_lines(conn: Any, ft: FileThread, report: Report) -> None:
    have = {(r["name"], r["n"]): r["h"] for r in conn.execute(
        "SELECT name, n, encode(sha256(line), 'hex') AS h FROM thread_lines WHERE thread_id = %s", (ft.tid,))}
    want = {(name, n): line for name, lines in ft.lines.items() for n, line in lines}
    put = [(ft.tid, name, n, line) for (name, n), line in want.items() if have.get((name, n)) != sha256_bytes(line)]
    gone = [k for k in have if k not in want]
    if put:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO thread_lines (thread_id, name, n, line) VALUES (%s, %s, %s, %s) "
                            "ON CONFLICT (thread_id, name, n) DO UPDATE SET line = excluded.line", put)
    for name, n in gone:
        conn.execute("DELETE FROM thread_lines WHERE thread_id = %s AND name = %s AND n = %s", (ft.tid, name, n))
    report.wrote("lines", len(put) + len(gone))


# -- artifacts and outputs -------------------------------------------------------------------------


_COLS = ("workspace, user_id, thread_id, id, meta, kind, status, live, bytes, deliverable, data_key, original_key, "
         "created, last_used")
_VALUES = ("%(ws)s, %(uid)s, %(tid)s, %(aid)s, %(meta)s::jsonb, %(kind)s, %(status)s, %(live)s, %(bytes)s, "
           "%(deliv)s, %(data_key)s, %(orig_key)s, %(created)s, %(last_used)s")
_SET = ", ".join(f"{c} = excluded.{c}" for c in _COLS.split(", ")[4:])
_UPSERT = (f"INSERT INTO artifacts ({_COLS}) VALUES ({_VALUES}) ON CONFLICT (thread_id, id) DO UPDATE SET {_SET} "
           f"WHERE ({', '.join('artifacts.' + c for c in _COLS.split(', ')[4:])}) IS DISTINCT FROM "
           f"({', '.join('excluded.' + c for c in _COLS.split(', ')[4:])}) RETURNING id")
_INSERT = f"INSERT INTO artifacts ({_COLS}) VALUES ({_VALUES}) ON CONFLICT (thread_id, id) DO NOTHING RETURNING id"




def copy_artifacts(db: Database, blobs: BlobStore, ft: FileThread, report: Report, fill: bool) -> None:
    """Each artifact's objects (sha256 checked first), then its row."""
    tk = ThreadKey(ft.ws, ft.uid, ft.tid)
    there = set(blobs.list(thread_prefix(*tk)))
    for art in read_artifacts(ft.dir / "artifacts", report.notes):
        if art.available:
            problem = artifact_problem(ft.dir / "artifacts", art)
            if problem is not None:
                report.notes.append(f"{ft.where}: artifact {art.id} not copied: {problem}")
                continue
        report.counts["artifacts" if art.available else "tombstones"] += 1
        data_key, orig_key, files = artifact_keys(ft, art)
        for key, path in files:
            ensure_object(blobs, key, path, key in there, report, fill)
        with db.connection() as conn:
            report.wrote("artifact rows", conn.execute(_INSERT if fill else _UPSERT,
                                                   artifact_row(tk, art, data_key, orig_key)).rowcount)


def copy_outputs(blobs: BlobStore, ft: FileThread, report: Report, fill: bool) -> None:
    files = output_files(ft.dir / "outputs", report.notes)
    if not files:
        return
    there = set(blobs.list(thread_prefix(ft.ws, ft.uid, ft.tid) + "o/"))
    for name, path in files:
        report.counts["outputs"] += 1
        key = blob_key(ft.ws, ft.uid, ft.tid, "o", name)
        ensure_object(blobs, key, path, key in there, report, fill)


def ensure_object(blobs: BlobStore, key: str, path: Path, listed: bool, report: Report, fill: bool) -> None:
    """`key` holds `path`'s bytes afterwards: uploaded when missing; one of another size is
    replaced (the home is the truth) or, once migrated, kept and named."""
    size = path.stat().st_size
    report.counts["objects"] += 1
    report.counts["bytes"] += size
    have = None
    if listed:
        with contextlib.suppress(BlobNotFound):
            have = blobs.size(key)
    if have == size:
        return
    if have is not None and fill:
        report.kept.append(f"{key}: the object store holds {have} bytes, the home {size} ({path}): left as it is")
        return
    try:
        blobs.put(key, path, if_absent=have is None)
    except BlobExists:  # written meanwhile by another run: the same bytes (keys are written once)
        return
    if have is not None:
        report.notes.append(f"{key}: held {have} bytes, replaced by the home's {size} ({path})")
    report.wrote("objects")
    report.wrote("bytes", size)


# -- memory ----------------------------------------------------------------------------------------
def copy_memory(layout: Layout, db: Database, report: Report, fill: bool) -> None:
    """Each user's memory document and audit. The audit is append-only: the cluster's must start
    with the home's; one that goes past it means memory changed there since (kept)."""
    rows = PgMemoryDocs(db)
    for ws, uid, doc, audit in read_memories(layout, report.notes):
        report.counts["memory docs"] += 1
        report.counts["audit events"] += len(audit)
        have_audit = rows.audit(ws, uid)
        if have_audit[:len(audit)] != audit[:len(have_audit)] or len(have_audit) > len(audit):
            report.kept.append(f"memory of user {uid} in workspace {ws} changed in the cluster since: left as it is")
            continue
        with db.connection() as conn:
            exists = conn.execute("SELECT doc::text AS doc FROM memory_docs WHERE workspace = %s AND user_id = %s "
                                  "FOR UPDATE", (ws, uid)).fetchone()
            same = exists is not None and msgspec.json.decode(exists["doc"]) == msgspec.json.decode(jsonb_text(doc))
            if not same and fill and exists is not None:
                report.kept.append(f"memory of user {uid} in workspace {ws} differs in the cluster: left as it is")
            elif not same:
                conn.execute("INSERT INTO memory_docs (workspace, user_id, doc) VALUES (%s, %s, %s::jsonb) "
                             "ON CONFLICT (workspace, user_id) DO UPDATE SET doc = excluded.doc, updated_at = now()",
                             (ws, uid, jsonb_text(doc)))
                report.wrote("memory docs")
            new = audit[len(have_audit):]
            if new:
                with conn.cursor() as cur:
                    cur.executemany("INSERT INTO memory_audit (workspace, user_id, ts, event, fact, status, kind, "
                                    "source, reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                                    [(ws, uid, e.ts, e.event, e.fact, e.status, e.kind, e.source, e.reason)
                                     for e in new])
                report.wrote("audit events", len(new))
