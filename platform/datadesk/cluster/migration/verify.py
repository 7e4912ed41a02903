"""`datadesk migrate --verify`: compare a file home with the cluster it was copied to, writing
nothing (migration/copy.py copies).

The home is read exactly as the copy reads it (migration/filehome.py: a torn last line skipped,
an artifact whose data is missing or fails its sha256 left out), so a clean copy verifies with
no difference. Per thread: its row (owner, epoch, last seq, meta), the records (count, the set
of seqs, the sha256 of each body), the documents (decoded JSON), the line sets (sha256 per
line), each artifact's row and the sha256 of its objects as the store returns them, the
outputs' bytes. Then users (tokens by hash), unexpired sessions, memory documents and audits,
and whatever the cluster holds that the home does not. Each difference is one line.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from datadesk.cluster.database import Database
from datadesk.cluster.migration.filehome import (FileThread, artifact_problem, output_files, read_artifacts,
                                       read_invitations, read_memories, read_sessions, read_thread, read_users, sha256_bytes, sha256_file,
                                       thread_dirs)
from datadesk.cluster.memory import PgMemoryDocs
from datadesk.cluster.migration.report import Progress, Report, artifact_keys, artifact_row, same_user
from datadesk.cluster.threads import MANIFESTS_KEPT, jsonb_text
from datadesk.cluster.users import PgUserStore
from datadesk.domain.artifacts import Artifact
from datadesk.domain.records import ThreadMeta
from datadesk.store.interfaces.artifacts import ThreadKey
from datadesk.store.interfaces.blobs import BlobNotFound, BlobStore, blob_key, copy_to
from datadesk.store.layout import Layout

SHOWN = 10  # seqs named per kind of difference in one line


class _Hasher:
    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)


def object_sha256(blobs: BlobStore, key: str) -> str | None:
    """The sha256 of the object's bytes as the store returns them; None when there is none."""
    sink = _Hasher()
    try:
        copy_to(blobs, key, sink)  # type: ignore[arg-type]
    except BlobNotFound:
        return None
    return sink.digest.hexdigest()


def _seqs(items: list[Any]) -> str:
    shown = ", ".join(str(i) for i in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def verify_home(layout: Layout, db: Database, blobs: BlobStore, report: Report, progress: Progress | None) -> None:
    verify_users(layout, db, report)
    threads = thread_dirs(layout, report.notes)
    seen: set[str] = set()
    for i, (ws, uid, tid) in enumerate(threads, 1):
        ft = read_thread(layout, ws, uid, tid, MANIFESTS_KEPT, report.notes)
        if ft is not None:
            seen.add(tid)
            verify_thread(db, blobs, ft, report)
        if progress is not None:
            progress("threads", i, len(threads))
    with db.connection() as conn:
        extra = [r["id"] for r in conn.execute("SELECT id FROM threads WHERE NOT (id = ANY(%s)) ORDER BY id",
                                               (sorted(seen),))]
    for tid in extra:
        report.differences.append(f"thread {tid} is in the cluster database but not in the home")
    verify_memory(layout, db, report)


# -- users ------------------------------------------------------------------------------------
def verify_users(layout: Layout, db: Database, report: Report) -> None:
    users, logins = read_users(layout)
    pg = PgUserStore(db)
    known = {u.id for u in users}
    for user in users:
        report.counts["users"] += 1
        report.counts["tokens"] += len(user.tokens)
        have = pg.get(user.id)
        if have is None:
            report.differences.append(f"user {user.id} is missing from the cluster database")
        elif not same_user(have, user):
            report.differences.append(f"user {user.id} differs: home {_user_text(user)}, cluster {_user_text(have)}")
        elif pg.has_logged_in(user.id) != (user.id in logins):
            report.differences.append(f"user {user.id}: the last login differs")
    for user in pg.list():
        if user.id not in known:
            report.differences.append(f"user {user.id} is in the cluster database but not in the home")
    sessions = {d: s for d, s in read_sessions(layout).items() if s.user in known}
    with db.connection() as conn:
        there = {r["hash"]: r["user_id"] for r in conn.execute(
            "SELECT hash, user_id FROM sessions WHERE hash = ANY(%s) AND expires_at > now()", (list(sessions),))}
    for digest, sess in sessions.items():
        report.counts["sessions"] += 1
        if there.get(digest) != sess.user:
            report.differences.append(f"a session of user {sess.user} (hash {digest[:12]}...) is missing")
    copied = {i.id: i for i in pg.invitations()}
    for inv in read_invitations(layout):
        report.counts["invitations"] += 1
        have = copied.get(inv.id)
        if have is None or not _same_invitation(have, inv.public()):
            report.differences.append(f"invitation {inv.id} is missing or differs in the cluster database")


def _same_invitation(a: Any, b: Any) -> bool:
    """Equal invitations, their times to the microsecond the database keeps."""
    times = ("created", "expires", "used_at")
    if any((getattr(a, t) is None) != (getattr(b, t) is None) or abs((getattr(a, t) or 0) - (getattr(b, t) or 0)) > 1e-3
           for t in times):
        return False
    return msgspec.structs.replace(a, **{t: None for t in times}) == msgspec.structs.replace(b, **{t: None for t in times})


def _user_text(user: Any) -> str:
    toks = [(t.id, t.hash[:8], t.revoked) for t in user.tokens]
    return f"(workspaces {user.workspaces}, permissions {user.permissions}, revoked {user.revoked}, tokens {toks})"


# -- threads --------------------------------------------------------------------------------------
def verify_thread(db: Database, blobs: BlobStore, ft: FileThread, report: Report) -> None:
    report.counts["threads"] += 1
    report.counts["records"] += len(ft.records)
    report.counts["documents"] += len(ft.docs)
    report.counts["lines"] += sum(len(v) for v in ft.lines.values())
    diff = report.differences
    with db.connection() as conn:
        row = conn.execute("SELECT workspace, owner, epoch, last_seq, meta::text AS meta FROM threads WHERE id = %s",
                           (ft.tid,)).fetchone()
        if row is None:
            diff.append(f"{ft.where} is missing from the cluster database ({len(ft.records)} records)")
            return
        if (row["workspace"], row["owner"]) != (ft.ws, ft.uid):
            diff.append(f"{ft.where}: the cluster's row is of user {row['owner']} in workspace {row['workspace']}")
        meta = msgspec.structs.replace(msgspec.json.decode(row["meta"], type=ThreadMeta), epoch=row["epoch"])
        if meta != ft.meta:
            diff.append(f"{ft.where}: meta differs: home {ft.meta}, cluster {meta}")
        if row["last_seq"] != ft.last_seq:
            diff.append(f"{ft.where}: last seq {row['last_seq']} in the cluster, {ft.last_seq} in the home")
        _verify_records(conn, ft, diff)
        _verify_docs(conn, ft, diff)
        _verify_lines(conn, ft, diff)
        arts = {r["id"]: r for r in conn.execute("SELECT * FROM artifacts WHERE thread_id = %s", (ft.tid,))}
    _verify_artifacts(blobs, ft, arts, report)
    for name, path in output_files(ft.dir / "outputs", report.notes):
        report.counts["outputs"] += 1
        _verify_object(blobs, blob_key(ft.ws, ft.uid, ft.tid, "o", name), path, ft, report)


def _verify_records(conn: Any, ft: FileThread, diff: list[str]) -> None:
    have = {r["seq"]: r["h"] for r in conn.execute(
        "SELECT seq, encode(sha256(body), 'hex') AS h FROM records WHERE thread_id = %s", (ft.tid,))}
    want = {seq: sha256_bytes(body) for seq, body in ft.records}
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    changed = sorted(s for s in set(want) & set(have) if want[s] != have[s])
    if len(have) != len(want):
        diff.append(f"{ft.where}: {len(have)} records in the cluster, {len(want)} in the home")
    if missing:
        diff.append(f"{ft.where}: records missing from the cluster: seq {_seqs(missing)}")
    if extra:
        diff.append(f"{ft.where}: records only in the cluster: seq {_seqs(extra)}")
    if changed:
        diff.append(f"{ft.where}: records whose bytes differ (sha256): seq {_seqs(changed)}")


def _verify_docs(conn: Any, ft: FileThread, diff: list[str]) -> None:
    have = {r["name"]: msgspec.json.decode(r["v"]) for r in conn.execute(
        "SELECT name, value::text AS v FROM thread_docs WHERE thread_id = %s", (ft.tid,))}
    for name in sorted(set(have) | set(ft.docs)):
        if name not in have:
            diff.append(f"{ft.where}: document {name} is missing from the cluster")
        elif name not in ft.docs:
            diff.append(f"{ft.where}: document {name} is only in the cluster")
        elif have[name] != msgspec.json.decode(jsonb_text(ft.docs[name][0])):
            diff.append(f"{ft.where}: document {name} differs")


def _verify_lines(conn: Any, ft: FileThread, diff: list[str]) -> None:
    have = {(r["name"], r["n"]): r["h"] for r in conn.execute(
        "SELECT name, n, encode(sha256(line), 'hex') AS h FROM thread_lines WHERE thread_id = %s", (ft.tid,))}
    want = {(name, n): sha256_bytes(line) for name, lines in ft.lines.items() for n, line in lines}
    for name in sorted({k[0] for k in have} | {k[0] for k in want}):
        h = {n: v for (nm, n), v in have.items() if nm == name}
        w = {n: v for (nm, n), v in want.items() if nm == name}
        bad = sorted(n for n in set(h) | set(w) if h.get(n) != w.get(n))
        if bad:
            diff.append(f"{ft.where}: {name} lines differ ({len(h)} in the cluster, {len(w)} in the home): "
                        f"line {_seqs(bad)}")


def _verify_artifacts(blobs: BlobStore, ft: FileThread, rows: dict[str, dict], report: Report) -> None:
    tk = ThreadKey(ft.ws, ft.uid, ft.tid)
    folder = ft.dir / "artifacts"
    seen = set()
    for art in read_artifacts(folder, report.notes):
        if art.available and artifact_problem(folder, art) is not None:
            continue  # not copied, and named by the copy
        seen.add(art.id)
        report.counts["artifacts" if art.available else "tombstones"] += 1
        data_key, orig_key, files = artifact_keys(ft, art)
        row = rows.get(art.id)
        if row is None:
            report.differences.append(f"{ft.where}: artifact {art.id} is missing from the cluster database")
        else:
            _compare_row(ft, art, row, artifact_row(tk, art, data_key, orig_key), report)
        for key, path in files:
            _verify_object(blobs, key, path, ft, report)
    for aid in sorted(set(rows) - seen):
        report.differences.append(f"{ft.where}: artifact {aid} is only in the cluster database")


def _compare_row(ft: FileThread, art: Artifact, row: dict, want: dict, report: Report) -> None:
    cols = {"kind": "kind", "status": "status", "live": "live", "bytes": "bytes", "deliv": "deliverable",
            "data_key": "data_key", "orig_key": "original_key", "created": "created", "last_used": "last_used"}
    bad = [col for k, col in cols.items() if row[col] != want[k]]
    if msgspec.convert(row["meta"], Artifact) != msgspec.json.decode(want["meta"], type=Artifact):
        bad.append("meta")
    if bad:
        report.differences.append(f"{ft.where}: artifact {art.id}: its row differs in {', '.join(bad)}")


def _verify_object(blobs: BlobStore, key: str, path: Any, ft: FileThread, report: Report) -> None:
    report.counts["objects"] += 1
    report.counts["bytes"] += path.stat().st_size
    got = object_sha256(blobs, key)
    if got is None:
        report.differences.append(f"{ft.where}: object {key} is missing from {blobs.where}")
    elif got != sha256_file(path):
        report.differences.append(f"{ft.where}: object {key} differs from {path} (sha256)")


# -- memory -----------------------------------------------------------------------------------------
def verify_memory(layout: Layout, db: Database, report: Report) -> None:
    rows = PgMemoryDocs(db)
    for ws, uid, doc, audit in read_memories(layout, []):  # what cannot be read: named by the copy
        report.counts["memory docs"] += 1
        report.counts["audit events"] += len(audit)
        who = f"memory of user {uid} in workspace {ws}"
        if rows.read(ws, uid) != doc:
            report.differences.append(f"{who}: the document differs")
        have = rows.audit(ws, uid)
        if have != audit:
            report.differences.append(f"{who}: the audit differs ({len(have)} events in the cluster, "
                                      f"{len(audit)} in the home)")
