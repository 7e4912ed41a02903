"""The cluster `Artifacts`: metadata rows in PostgreSQL (`artifacts`, migration 0007), data in
the object store (`BlobStore`), quota totals by SQL (SCALE.md sections 2, 5.3, 5.4).

How a write goes: the writer puts the data file into `thread.artifacts_dir` (this host's
scratch folder) as in the embedded set; `save` uploads it to its key (write-once) and only
then writes the row, in a transaction that also checks the thread's epoch (`threads.epoch`,
taken `FOR SHARE`, so a clear waits or wins, never interleaves). The scratch file goes once it
is uploaded: this host keeps its copy in the blob cache. A tombstone (expired) is an update of
the row; the object is deleted after the commit.

Keys: `ws/<ws>/u/<uid>/t/<tid>/a/<file>` for an artifact's first data, and
`.../a/<aid>-<sha256[:16]>.<ext>` once it was re-queried or re-imported (new data under the
same id and sandbox path): a key always holds the same bytes, so no host's cache is ever stale.

Reads hand out local paths: `data_path` is the blob cache's file (filled on a miss), and
`kernel_files` links a thread's available artifacts into a per-host folder for a kernel's /data.
The quota runs on `PgLedger` (sums over the rows; a claim is a row update under one
cluster-wide transaction lock) and `PgSweepLock` (one sweep per cluster).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec
import psycopg

from datadesk.cluster.database import Database, DatabaseError, advisory_key
from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.ids import check_id, new_id
from datadesk.offload.artifacts.store import ArtifactStore, regular_file, write_artifact_file
from datadesk.store.interfaces.artifacts import (ArtifactNotFound, Drift, Row, SweepBusy, ThreadKey, Totals, Victim)
from datadesk.store.interfaces.blobs import BlobExists, BlobNotFound, BlobStore, BlobUnavailable, artifact_key, thread_prefix
from datadesk.store.interfaces.threads import LogClosed
from datadesk.store.layout import Layout

log = logging.getLogger(__name__)

KERNEL_DIR = "kernel-data"  # per host, under the thread's folder: links for a kernel's /data
QUOTA_LOCK = "datadesk:artifact-quota"  # one quota transaction at a time, cluster-wide
SWEEP_LOCK = "datadesk:artifact-sweep"
BATCH = 64

_COLS = "workspace, user_id, thread_id, id, meta, kind, status, live, bytes, deliverable, data_key, " \
        "original_key, created, last_used"
_UPSERT = (f"WITH old AS (SELECT data_key FROM artifacts WHERE thread_id = %(tid)s AND id = %(aid)s FOR UPDATE) "
           f"INSERT INTO artifacts ({_COLS}) VALUES (%(ws)s, %(uid)s, %(tid)s, %(aid)s, %(meta)s::jsonb, %(kind)s, "
           "%(status)s, %(live)s, %(bytes)s, %(deliv)s, %(data_key)s, %(orig_key)s, %(created)s, %(last_used)s) "
           "ON CONFLICT (thread_id, id) DO UPDATE SET meta = excluded.meta, kind = excluded.kind, "
           "status = excluded.status, live = excluded.live, bytes = excluded.bytes, "
           "deliverable = excluded.deliverable, data_key = coalesce(excluded.data_key, artifacts.data_key), "
           "original_key = coalesce(excluded.original_key, artifacts.original_key), "
           "created = excluded.created, last_used = excluded.last_used "
           "RETURNING (SELECT data_key FROM old) AS old_key")
_TOMBSTONE = ("UPDATE artifacts SET live = false, deliverable = 0, status = %(status)s, "
              "meta = meta || jsonb_build_object('status', %(status)s::text, 'expired_at', %(at)s::float8) "
              "WHERE thread_id = %(tid)s AND id = %(aid)s")
_SUMS = "count(*) FILTER (WHERE live) AS count, coalesce(sum(bytes) FILTER (WHERE live), 0) AS bytes, " \
        "coalesce(sum(deliverable), 0) AS deliverable"


def _decode(meta: str | bytes) -> Artifact:
    return msgspec.json.decode(meta, type=Artifact)


def _scope_where(scope: str) -> tuple[str, tuple]:
    """The WHERE clause of a totals scope (`t:<ws>/<uid>/<tid>`, `u:<uid>`, `*`)."""
    if scope.startswith("t:"):
        k = ThreadKey.parse(scope[2:])
        return "workspace = %s AND user_id = %s AND thread_id = %s", (k.workspace, k.user, k.thread)
    if scope.startswith("u:"):
        return "user_id = %s", (scope[2:],)
    return "true", ()


class PgLedgerView:
    """The quota's view inside one transaction holding the cluster's quota lock."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def totals(self, scope: str) -> Totals:
        where, args = _scope_where(scope)
        row = self.conn.execute(f"SELECT {_SUMS} FROM artifacts WHERE {where}", args).fetchone()
        return Totals(int(row["count"]), int(row["bytes"]), int(row["deliverable"]))

    def over(self, kind: str, max_count: int, max_bytes: int) -> list[str]:
        if kind == "t":
            sql = ("SELECT 't:' || workspace || '/' || user_id || '/' || thread_id AS scope FROM artifacts WHERE live "
                   "GROUP BY workspace, user_id, thread_id HAVING count(*) > %s OR sum(bytes) > %s")
        else:
            sql = "SELECT 'u:' || user_id AS scope FROM artifacts WHERE live GROUP BY user_id " \
                  "HAVING count(*) > %s OR sum(bytes) > %s"
        return [r["scope"] for r in self.conn.execute(sql, (max_count, max_bytes))]

    def oldest_use(self) -> float | None:
        return self.conn.execute("SELECT min(last_used) AS m FROM artifacts WHERE live").fetchone()["m"]

    def biggest_user(self, other_than: str | None) -> str | None:
        row = self.conn.execute("SELECT user_id FROM artifacts WHERE live AND user_id <> %s GROUP BY user_id "
                                "ORDER BY sum(bytes) DESC, count(*) DESC LIMIT 1", (other_than or "",)).fetchone()
        return row["user_id"] if row else None

    def lru(self, scope: str, protect: set[str], limit: int = BATCH,
            used_before: float | None = None) -> list[Victim]:
        where, args = _scope_where(scope)
        sql = (f"SELECT workspace || '/' || user_id || '/' || thread_id AS thread, id, user_id, bytes FROM artifacts "
               f"WHERE live AND {where} AND NOT (id = ANY(%s))")
        params: list[Any] = [*args, sorted(protect)]
        if used_before is not None:
            sql += " AND last_used < %s"
            params.append(used_before)
        sql += " ORDER BY last_used, created LIMIT %s"
        rows = self.conn.execute(sql, (*params, limit))
        return [Victim(r["thread"], r["id"], r["user_id"], int(r["bytes"])) for r in rows]

    def drop_thread(self, thread: str) -> int:
        k = ThreadKey.parse(thread)
        return self.conn.execute("UPDATE artifacts SET live = false, deliverable = 0 WHERE thread_id = %s "
                                 "AND (live OR deliverable > 0)", (k.thread,)).rowcount

    def claim(self, victim: Victim) -> bool:
        """The victim's row becomes its tombstone now (expired); its objects go next."""
        k = ThreadKey.parse(victim.thread)
        cur = self.conn.execute(_TOMBSTONE + " AND live", {"status": "expired", "at": time.time(),
                                                           "tid": k.thread, "aid": victim.aid})
        return cur.rowcount == 1


class PgLedger:
    """What the quotas count, read from the rows themselves (nothing to build or reconcile)."""

    errors: tuple[type[BaseException], ...] = (psycopg.Error, DatabaseError)
    opens = 1

    def __init__(self, db: Database) -> None:
        self.db = db

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgLedgerView]:
        """One quota transaction at a time across the cluster (two hosts never evict for the
        same overflow twice): a transaction-scoped advisory lock."""
        with self.db.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(QUOTA_LOCK),))
            yield PgLedgerView(conn)

    def read(self, scopes: Iterable[str]) -> tuple[dict[str, Totals], float | None]:
        """The totals of `scopes` and the oldest last use of a live artifact: one statement."""
        scopes = list(scopes)
        parts, args = [], []
        for i, scope in enumerate(scopes):
            where, a = _scope_where(scope)
            parts.append(f"SELECT {i} AS i, {_SUMS} FROM artifacts WHERE {where}")
            args.extend(a)
        parts.append("SELECT -1 AS i, 0::bigint AS count, 0::numeric AS bytes, coalesce(min(last_used), -1)::float8 "
                     "AS deliverable FROM artifacts WHERE live")
        with self.db.connection() as conn:
            rows = conn.execute(" UNION ALL ".join(parts), args).fetchall()
        out, oldest = {}, None
        for r in rows:
            if r["i"] < 0:
                oldest = None if r["deliverable"] == -1 else float(r["deliverable"])
            else:
                out[scopes[r["i"]]] = Totals(int(r["count"]), int(r["bytes"]), int(r["deliverable"]))
        return out, oldest

    def built(self) -> bool:
        return True

    def reconcile(self, rows: Iterable[Row], started_ns: int) -> Drift:
        return Drift()  # the rows are the truth: nothing derived to correct

    def close(self) -> None:
        pass


class PgSweepLock:
    """One artifact sweep per cluster: a session advisory lock on a connection of its own (it
    goes with the connection if the host dies), and the time of the last sweep in a row."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @contextlib.contextmanager
    def acquire(self, timeout: float = -1) -> Iterator[None]:
        conn = self.db.dedicated()
        try:
            deadline = time.monotonic() + (timeout if timeout >= 0 else 1e9)
            key = advisory_key(SWEEP_LOCK)
            while not conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()["ok"]:
                if time.monotonic() >= deadline:
                    raise SweepBusy("another host is running the artifact sweep")
                time.sleep(0.2)
            yield
        finally:
            conn.close()  # the lock goes with the session

    def last_swept(self) -> float | None:
        with self.db.connection() as conn:
            row = conn.execute("SELECT last_swept FROM artifact_sweeps").fetchone()
        return row["last_swept"] if row else None

    def mark_swept(self) -> None:
        with self.db.connection() as conn:
            conn.execute("INSERT INTO artifact_sweeps (last_swept) VALUES (%s) ON CONFLICT (id) "
                         "DO UPDATE SET last_swept = excluded.last_swept", (time.time(),))


class PgArtifactStore:
    """Artifact rows in PostgreSQL and their data in `blobs` (the cluster `Artifacts`).

    `open_thread(key)` gives the `Thread` of a row (for `find` and `walk`); without it, a bare
    thread of this host's folders under the home (tests, tools)."""

    def __init__(self, db: Database, blobs: BlobStore, layout: Layout,
                 open_thread: Callable[[ThreadKey], Any] | None = None) -> None:
        self.db = db
        self.blobs = blobs
        self.layout = layout
        self.ledger = PgLedger(db)
        self._open_thread = open_thread

    # -- names -------------------------------------------------------------------------
    def thread_key(self, thread: Any) -> ThreadKey:
        """(workspace, owner, id) of a thread object: its meta, or a bare folder's path."""
        if isinstance(thread, ThreadKey):
            return thread
        meta = getattr(thread, "meta", None)
        if meta is not None:
            return ThreadKey(meta.workspace, meta.owner, thread.id)
        parts = Path(thread.dir).parts
        if len(parts) >= 5 and parts[-4] == "users" and parts[-2] == "threads":
            return ThreadKey(parts[-5], parts[-3], parts[-1])
        if len(parts) >= 4 and parts[-4] == "threads":  # the cluster threads' scratch <ws>/<uid>/<tid>
            return ThreadKey(parts[-3], parts[-2], parts[-1])
        raise ValueError(f"{thread!r}: cannot tell its workspace and owner (no meta)")

    @staticmethod
    def object_key(key: ThreadKey, art: Artifact) -> str:
        """The key of `art`'s data: its file name, or, once new data replaced the first (a
        re-query, a re-import), the name with the new data's hash (a key never changes bytes)."""
        name = art.file
        if art.requeried_at or art.reimported_at:
            stem, dot, ext = name.partition(".")
            version = art.sha256[:16] or f"t{int((art.reimported_at or art.requeried_at or 0) * 1000)}"
            name = f"{stem}-{version}{dot}{ext}"
        return artifact_key(key.workspace, key.user, key.thread, name)

    @staticmethod
    def original_key(key: ThreadKey, art: Artifact) -> str | None:
        return artifact_key(key.workspace, key.user, key.thread, art.original) if art.original else None

    original_name = staticmethod(ArtifactStore.original_name)

    def _thread_at(self, key: ThreadKey) -> Any:
        if self._open_thread is not None:
            return self._open_thread(key)
        from datadesk.store.threads import Thread

        return Thread.at(self.layout.thread_dir(key.workspace, key.user, key.thread))

    # -- writes --------------------------------------------------------------------------
    def _upload(self, thread: Any, key: str, name: str, uploaded: list[Path]) -> bool:
        """Put the scratch file `name` of `thread` under `key` when it is there; True when the
        object is in the store afterwards."""
        local = Path(thread.artifacts_dir) / name
        if regular_file(local):
            try:
                self.blobs.put(key, local)
            except BlobExists:
                pass  # the same key always holds the same bytes: written before (a retry)
            uploaded.append(local)
            return True
        return self.blobs.exists(key)

    def save(self, thread: Any, art: Artifact, epoch: int | None = None) -> None:
        """Upload the data (and a kept original) from the scratch folder, then write the row; with
        `epoch`, in a transaction that checks the thread is still in it (LogClosed otherwise,
        and the data goes: nothing from before a clear survives it)."""
        check_id(art.id, "artifact")
        tk = self.thread_key(thread)
        data_key = orig_key = None
        scratch: list[Path] = []
        if art.available:
            data_key = self.object_key(tk, art)
            if not self._upload(thread, data_key, art.file, scratch):
                raise FileNotFoundError(f"the data of artifact {art.id} is neither in {thread.artifacts_dir} "
                                        f"nor in {self.blobs.where}")
            orig_key = self.original_key(tk, art)
            if orig_key is not None and not self._upload(thread, orig_key, art.original, scratch):
                orig_key = None  # named before it is moved in (kept_original uploads it)
        try:
            old_key = self._write_row(tk, art, data_key, orig_key, epoch)
        except LogClosed:
            for k in (data_key, orig_key):
                if k is not None:
                    self._delete_object(k)
            (Path(thread.artifacts_dir) / art.file).unlink(missing_ok=True)
            raise
        for local in scratch:  # this host's copy is in the blob cache now
            local.unlink(missing_ok=True)
        if old_key and data_key and old_key != data_key:
            self._delete_object(old_key)  # the data it replaced (a re-query, a re-import)

    def _write_row(self, tk: ThreadKey, art: Artifact, data_key: str | None, orig_key: str | None,
                   epoch: int | None) -> str | None:
        with self.db.connection() as conn:
            if epoch is not None:
                row = conn.execute("SELECT epoch FROM threads WHERE id = %s FOR SHARE", (tk.thread,)).fetchone()
                if row is None:
                    raise LogClosed(f"thread {tk.thread} no longer exists")
                if row["epoch"] != epoch:
                    raise LogClosed(f"thread {tk.thread} was cleared")
            row = conn.execute(_UPSERT, self._params(tk, art, data_key, orig_key)).fetchone()
        return row["old_key"]

    @staticmethod
    def _params(tk: ThreadKey, art: Artifact, data_key: str | None, orig_key: str | None) -> dict[str, Any]:
        return {"ws": tk.workspace, "uid": tk.user, "tid": tk.thread, "aid": art.id,
                "meta": msgspec.json.encode(art).decode(), "kind": art.kind, "status": art.status,
                "live": art.available and art.is_cache, "bytes": art.stored_bytes,
                "deliv": art.bytes if art.kind == "deliverable" and art.available else 0,
                "data_key": data_key, "orig_key": orig_key, "created": art.created, "last_used": art.last_used}

    def save_bytes(self, thread: Any, data: bytes, ext: str, kind: str, media_type: str,
                   origin: ArtifactOrigin, epoch: int | None = None) -> Artifact:
        """A new artifact holding `data` as `<aid>.<ext>` (charts, files, tool images)."""
        art = write_artifact_file(Path(thread.artifacts_dir), data, ext, kind, media_type, origin)
        self.save(thread, art, epoch)
        return art

    def kept_original(self, thread: Any, art: Artifact) -> None:
        """The upload's original was moved into the scratch folder after its row named it."""
        tk = self.thread_key(thread)
        key = self.original_key(tk, art)
        if key is None:
            return
        scratch: list[Path] = []
        if self._upload(thread, key, art.original, scratch):
            with self.db.connection() as conn:
                conn.execute("UPDATE artifacts SET original_key = %s WHERE thread_id = %s AND id = %s",
                             (key, tk.thread, art.id))
            for local in scratch:
                local.unlink(missing_ok=True)

    def discard(self, thread: Any, art: Artifact) -> None:
        """Remove an artifact entirely, row and objects (one a cancelled call published)."""
        tk = self.thread_key(thread)
        with self.db.connection() as conn:
            row = conn.execute("DELETE FROM artifacts WHERE thread_id = %s AND id = %s "
                               "RETURNING data_key, original_key", (tk.thread, art.id)).fetchone()
        keys = {self.object_key(tk, art), self.original_key(tk, art)}
        if row is not None:
            keys |= {row["data_key"], row["original_key"]}
        for k in keys - {None}:
            self._delete_object(k)
        for name in (art.file, art.original):
            if name:
                (Path(thread.artifacts_dir) / name).unlink(missing_ok=True)

    def _delete_object(self, key: str) -> None:
        try:
            self.blobs.delete(key)
        except BlobUnavailable as exc:  # the row no longer names it; only its bytes stay behind
            log.warning("could not delete %s: %s", key, exc)

    # -- reads ------------------------------------------------------------------------------
    def load(self, thread: Any, aid: str) -> Artifact:
        check_id(aid, "artifact")
        tk = self.thread_key(thread)
        with self.db.connection() as conn:
            row = conn.execute("SELECT meta::text AS meta FROM artifacts WHERE thread_id = %s AND id = %s "
                               "AND user_id = %s", (tk.thread, aid, tk.user)).fetchone()
        if row is None:
            raise ArtifactNotFound(f"artifact {aid} not found in this thread")
        return _decode(row["meta"])

    def data_path(self, thread: Any, art: Artifact) -> Path:
        """A local file of `art`'s data: the blob cache's (filled from the store on a miss); for
        data not in the store (a tombstone, a write not yet published) its scratch path, which
        callers find missing. BlobUnavailable when the store cannot be reached."""
        if art.available:
            try:
                return self.blobs.local_path(self.object_key(self.thread_key(thread), art))
            except BlobNotFound:
                pass
        return Path(thread.artifacts_dir) / art.file

    def original_path(self, thread: Any, art: Artifact) -> Path:
        key = self.original_key(self.thread_key(thread), art)
        if key is not None:
            try:
                return self.blobs.local_path(key)
            except BlobNotFound:
                pass
        return Path(thread.artifacts_dir) / (art.original or self.original_name(art.id, "csv"))

    def original_paths(self, thread: Any, art: Artifact) -> list[Path]:
        return [self.original_path(thread, art)] if art.original else []

    def list(self, thread: Any) -> list[Artifact]:
        tk = self.thread_key(thread)
        with self.db.autocommit() as conn:  # one read
            rows = conn.execute("SELECT meta::text AS meta FROM artifacts WHERE thread_id = %s AND user_id = %s "
                                "ORDER BY created, id", (tk.thread, tk.user)).fetchall()
        return [_decode(r["meta"]) for r in rows]

    def touch(self, thread: Any, aids: list[str]) -> None:
        """Mark artifacts as used now (one statement)."""
        if not aids:
            return
        now = time.time()
        with self.db.connection() as conn:
            conn.execute("UPDATE artifacts SET last_used = %s, meta = jsonb_set(meta, '{last_used}', to_jsonb(%s::float8)) "
                         "WHERE thread_id = %s AND id = ANY(%s)", (now, now, self.thread_key(thread).thread, list(aids)))

    def expire(self, thread: Any, aid: str, status: str = "expired") -> Artifact | None:
        """The row becomes a tombstone (kept), then the objects go."""
        return self.expire_at(self.thread_key(thread), aid, status)

    def expire_at(self, key: ThreadKey, aid: str, status: str = "expired") -> Artifact | None:
        with self.db.connection() as conn:
            row = conn.execute("SELECT meta::text AS meta, data_key, original_key FROM artifacts "
                               "WHERE thread_id = %s AND id = %s FOR UPDATE", (key.thread, aid)).fetchone()
            if row is None:
                return None
            art = _decode(row["meta"])
            if art.available:
                now = time.time()
                conn.execute(_TOMBSTONE, {"status": status, "at": now, "tid": key.thread, "aid": aid})
                art = msgspec.structs.replace(art, status=status, expired_at=now)
        for k in {row["data_key"], row["original_key"]} - {None}:  # a claimed one too: its objects go now
            self._delete_object(k)
        return art

    def find(self, aid: str, owner: str, workspaces: list[str]) -> tuple[Any, Artifact]:
        check_id(aid, "artifact")
        with self.db.connection() as conn:
            row = conn.execute("SELECT workspace, thread_id, meta::text AS meta FROM artifacts WHERE user_id = %s "
                               "AND id = %s AND workspace = ANY(%s) ORDER BY created LIMIT 1",
                               (owner, aid, list(workspaces))).fetchone()
        if row is None:
            raise ArtifactNotFound(f"artifact {aid} not found")
        try:
            thread = self._thread_at(ThreadKey(row["workspace"], owner, row["thread_id"]))
        except LookupError:
            raise ArtifactNotFound(f"artifact {aid} not found") from None
        return thread, _decode(row["meta"])

    def walk(self) -> Iterator[tuple[str, str, Any, Artifact]]:
        """Every artifact of the cluster: (workspace, user, thread, artifact)."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT workspace, user_id, thread_id, meta::text AS meta FROM artifacts "
                                "ORDER BY workspace, user_id, thread_id, created").fetchall()
        threads: dict[str, Any] = {}
        for r in rows:
            key = ThreadKey(r["workspace"], r["user_id"], r["thread_id"])
            if key.thread not in threads:
                try:
                    threads[key.thread] = self._thread_at(key)
                except LookupError:
                    threads[key.thread] = None
            if threads[key.thread] is not None:
                yield key.workspace, key.user, threads[key.thread], _decode(r["meta"])

    def counted_rows(self) -> Iterator[Row]:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT workspace, user_id, thread_id, id, live, bytes, deliverable, last_used, "
                                "created FROM artifacts WHERE live OR deliverable > 0").fetchall()
        for r in rows:
            yield Row(f"{r['workspace']}/{r['user_id']}/{r['thread_id']}", r["id"], r["user_id"], int(r["live"]),
                      int(r["bytes"]), int(r["deliverable"]), r["last_used"], r["created"])

    def has_artifact(self, key: ThreadKey, aid: str) -> bool:
        return True  # a claimed row is the artifact's metadata itself

    def has_thread(self, key: ThreadKey) -> bool:
        return True

    def sweep_lock(self) -> PgSweepLock:
        return PgSweepLock(self.db)

    def forget_thread(self, thread: Any) -> None:
        """A thread was cleared or deleted: its rows and every object under its prefix go."""
        tk = self.thread_key(thread)
        with self.db.connection() as conn:
            conn.execute("DELETE FROM artifacts WHERE thread_id = %s", (tk.thread,))
        try:
            self.blobs.delete_prefix(thread_prefix(*tk))
        except BlobUnavailable as exc:
            log.warning("the objects of thread %s stay in the store for now: %s", tk.thread, exc)
        _remove_tree(Path(thread.dir) / KERNEL_DIR)

    # -- kernels ------------------------------------------------------------------------------
    def kernel_handoff(self, thread: Any, ttl_s: int = 300) -> Any:
        """The thread's files for a kernel (cluster/objects/kernelfiles.py): local links or presigned URLs."""
        from datadesk.cluster.objects.kernelfiles import PresignedKernelFiles

        return PresignedKernelFiles(self, self.blobs, thread, ttl_s)

    def kernel_files(self, thread: Any) -> Path:
        """A folder of this host holding hard links to the cached data of every available
        artifact of `thread` (filled from the store), exactly: what a kernel's /data is linked
        from. An artifact the store cannot give now is left out (logged)."""
        folder = Path(thread.dir) / KERNEL_DIR
        folder.mkdir(parents=True, exist_ok=True)
        tk = self.thread_key(thread)
        want: dict[str, Path] = {}
        for art in self.list(thread):
            if not art.available:
                continue
            try:
                want[art.file] = self.blobs.local_path(self.object_key(tk, art))
            except (BlobNotFound, BlobUnavailable) as exc:
                log.warning("artifact %s is not in this kernel's /data: %s", art.id, exc)
        for name, src in want.items():
            _link(src, folder / name)
        for entry in os.scandir(folder):
            if entry.name not in want:
                _remove_tree(Path(entry.path))
        return folder


def _link(src: Path, target: Path) -> None:
    """`target` a hard link to `src` (a copy across file systems), replaced atomically."""
    try:
        if os.path.samefile(src, target):
            return
    except FileNotFoundError:
        pass
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{new_id()}.tmp")
    try:
        try:
            os.link(src, tmp)
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_tree(path: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def build_artifacts(db: Database, blobs: BlobStore, layout: Layout,
                    open_thread: Callable[[ThreadKey], Any] | None = None) -> PgArtifactStore:
    """The cluster artifact store; `open_thread(key)` opens a row's thread (the cluster
    `ThreadStore.get(key.thread, key.user, [key.workspace])`), for `find` and `walk`."""
    return PgArtifactStore(db, blobs, layout, open_thread)
