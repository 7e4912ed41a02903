"""A file home as `datadesk migrate` reads it: users, sessions, threads (meta, records, documents,
line sets), artifacts, outputs and memory, exactly as the embedded set's own readers see them.

Nothing here writes to the home. The readers keep what the embedded set would serve and say
what they leave out (`notes`): a torn last line of `log.jsonl` is skipped as `ThreadLog` skips
it (no trailing newline: a crash mid-write), an unreadable line or metadata file is named, a
file whose name the object store cannot hold is named. Migration and `--verify` read the home
through the same functions, so they agree on what "the home" is.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import msgspec

from datadesk.domain.artifacts import Artifact
from datadesk.domain.ids import InvalidId, check_id
from datadesk.domain.memory import MemoryDoc
from datadesk.domain.records import ThreadMeta, record_decoder
from datadesk.domain.users import User
from datadesk.memory.store import FileMemoryDocs
from datadesk.store.interfaces.blobs import check_name
from datadesk.store.interfaces.memory import AuditEvent, MemoryStoreError
from datadesk.store.interfaces.threads import MANIFESTS, SUMMARY, SUMMARY_REVISIONS, SUMMARY_STATUS, TASK_STATE
from datadesk.store.files import read_json
from datadesk.store.layout import Layout
from datadesk.store.users import Session, StoredInvitation, UsersDoc

# the file of each per-thread document and line set (as store/threads.py DOC_FILES names them)
DOC_FILES = {SUMMARY: "summary.json", SUMMARY_STATUS: "summary.status.json", TASK_STATE: "task_state.json"}
LINE_FILES = {SUMMARY_REVISIONS: "summary.revisions.jsonl", MANIFESTS: "context.jsonl"}
CHUNK = 1 << 20


def regular(path: Path) -> bool:
    """A regular file, not a link (nothing here follows links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- users and sessions ------------------------------------------------------------------
def read_users(layout: Layout) -> tuple[list[User], dict[str, float]]:
    """The users of `users.json` (in its order) and the time of each one's last login."""
    doc = msgspec.convert(read_json(layout.users_file, {}), UsersDoc)
    return list(doc.users.values()), dict(doc.logins)


def read_invitations(layout: Layout) -> list[StoredInvitation]:
    """The invitations of `users.json` (with their codes' hashes), oldest first."""
    return list(msgspec.convert(read_json(layout.users_file, {}), UsersDoc).invitations)


def read_sessions(layout: Layout, now: float | None = None) -> dict[str, Session]:
    """The sessions of `sessions.json` that have not expired, by their stored hash."""
    now = time.time() if now is None else now
    raw = msgspec.convert(read_json(layout.sessions_file, {}), dict[str, Session])
    return {digest: s for digest, s in raw.items() if s.expires > now}


# -- the folders ---------------------------------------------------------------------------
def _subdirs(root: Path, kind: str, notes: list[str]) -> Iterator[str]:
    """The valid-id folders under `root`, sorted (hidden ones, such as deleted threads, and
    links skipped; a folder whose name is no id is named in `notes`)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            yield check_id(entry.name, kind)
        except InvalidId:
            notes.append(f"{entry.path}: not a valid {kind} id: skipped")


def user_dirs(layout: Layout, notes: list[str]) -> Iterator[tuple[str, str]]:
    """(workspace, user) of every user folder under `workspaces/<ws>/users/`."""
    for ws in _subdirs(layout.workspaces_dir, "workspace", notes):
        for uid in _subdirs(layout.workspace_dir(ws) / "users", "user", notes):
            yield ws, uid


def thread_dirs(layout: Layout, notes: list[str]) -> list[tuple[str, str, str]]:
    """(workspace, user, thread) of every thread folder (`workspaces/<ws>/users/<uid>/threads/<tid>`)."""
    return [(ws, uid, tid) for ws, uid in user_dirs(layout, notes)
            for tid in _subdirs(layout.threads_dir(ws, uid), "thread", notes)]


# -- one thread ------------------------------------------------------------------------------
@dataclass
class FileThread:
    """What the embedded set serves of one thread."""

    ws: str
    uid: str
    tid: str
    dir: Path
    meta: ThreadMeta
    records: list[tuple[int, bytes]]  # (seq, the line without its newline), in log order
    docs: dict[str, tuple[Any, float]]  # name -> (decoded JSON value, the file's mtime)
    lines: dict[str, list[tuple[int, bytes]]]  # name -> (n, line) (manifests: the newest kept)

    @property
    def last_seq(self) -> int:
        return self.records[-1][0] if self.records else 0

    @property
    def where(self) -> str:
        return f"thread {self.tid} (workspace {self.ws}, user {self.uid})"


def read_log(path: Path, notes: list[str]) -> list[tuple[int, bytes]]:
    """The records of `log.jsonl` in order as (seq, line): a torn last line is skipped (as
    `ThreadLog` skips it), so is an unreadable line or a seq that does not increase."""
    out: list[tuple[int, bytes]] = []
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return out
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                notes.append(f"{path}: torn last line ({len(raw)} bytes, no newline) skipped, as the file "
                             "set skips it")
                break
            body = raw[:-1]
            if not body.strip():
                continue
            try:
                seq = record_decoder.decode(body).seq
            except (msgspec.DecodeError, msgspec.ValidationError):
                notes.append(f"{path}: line {lineno} is not a readable record: skipped")
                continue
            if out and seq <= out[-1][0]:
                notes.append(f"{path}: line {lineno} has seq {seq} after {out[-1][0]}: skipped")
                continue
            out.append((seq, body))
    return out


def _read_doc(path: Path, notes: list[str]) -> tuple[Any, float] | None:
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return msgspec.json.decode(raw), mtime
    except msgspec.DecodeError:
        notes.append(f"{path}: not JSON: skipped")
        return None


def _read_lines(path: Path, keep: int | None) -> list[tuple[int, bytes]]:
    """The non-blank lines of a line set as (n, line), n counting from 1; with `keep`, the newest
    `keep` (their n kept, so the cluster numbers later lines after them)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return []
    lines = [(n, line) for n, line in enumerate((ln for ln in data.split(b"\n") if ln.strip()), 1)]
    return lines[-keep:] if keep is not None and keep > 0 else lines


def read_thread(layout: Layout, ws: str, uid: str, tid: str, manifests_kept: int,
                notes: list[str]) -> FileThread | None:
    """One thread folder, or None when it has no readable `meta.json` (being made or removed:
    named in `notes` when the file is there but unreadable)."""
    tdir = layout.thread_dir(ws, uid, tid)
    try:
        meta = msgspec.convert(read_json(tdir / "meta.json"), ThreadMeta)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        notes.append(f"{tdir}/meta.json is unreadable ({exc}): thread skipped")
        return None
    if meta is None:
        return None
    if (meta.id, meta.workspace, meta.owner) != (tid, ws, uid):
        notes.append(f"{tdir}/meta.json names thread {meta.id} of {meta.owner} in {meta.workspace}: its folder "
                     "is taken as the truth")
        meta = msgspec.structs.replace(meta, id=tid, workspace=ws, owner=uid)
    records = read_log(tdir / "log.jsonl", notes)
    docs = {name: doc for name, file in DOC_FILES.items() if (doc := _read_doc(tdir / file, notes)) is not None}
    lines = {name: got for name, file in LINE_FILES.items()
             if (got := _read_lines(tdir / file, manifests_kept if name == MANIFESTS else None))}
    return FileThread(ws, uid, tid, tdir, meta, records, docs, lines)


# -- artifacts and outputs ---------------------------------------------------------------------
def read_artifacts(artifacts_dir: Path, notes: list[str]) -> list[Artifact]:
    """Every readable `<aid>.json` of a thread's artifacts folder, oldest first."""
    out: list[Artifact] = []
    try:
        # `<aid>.json` only: a JSON data file is `<aid>.data.json` (offload/artifacts/store.py)
        names = sorted(n for n in os.listdir(artifacts_dir) if n.endswith(".json") and n.count(".") == 1)
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        path = artifacts_dir / name
        if not regular(path):
            continue
        try:
            art = msgspec.convert(read_json(path), Artifact)
            check_id(art.id, "artifact")
        except (msgspec.DecodeError, msgspec.ValidationError, InvalidId, TypeError) as exc:
            notes.append(f"{path}: unreadable artifact metadata ({exc}): skipped")
            continue
        if name != f"{art.id}.json":
            notes.append(f"{path}: names artifact {art.id}: skipped")
            continue
        out.append(art)
    out.sort(key=lambda a: (a.created, a.id))
    return out


def artifact_problem(artifacts_dir: Path, art: Artifact) -> str | None:
    """Why an available artifact's data cannot be copied (missing, or not the bytes its metadata
    hashed), else None. Reads the whole file once."""
    path = artifacts_dir / art.file
    if "/" in art.file or not regular(path):
        return f"its data file {path} is missing"
    if art.sha256 and sha256_file(path) != art.sha256:
        return f"its data file {path} does not match the sha256 its metadata holds"
    return None


def output_files(outputs_dir: Path, notes: list[str]) -> list[tuple[str, Path]]:
    """(name inside the area, path) of every regular file under a thread's `outputs/`; a name the
    object store's keys cannot hold (store/interfaces/blobs.py check_name) is named in `notes`."""
    out: list[tuple[str, Path]] = []
    if not outputs_dir.is_dir() or outputs_dir.is_symlink():
        return out
    for dirpath, dirs, names in os.walk(outputs_dir):
        dirs.sort()
        for name in sorted(names):
            path = Path(dirpath) / name
            if not regular(path):
                continue
            rel = path.relative_to(outputs_dir).as_posix()
            try:
                out.append((check_name(rel), path))
            except ValueError:
                notes.append(f"{path}: its name cannot be an object key (letters, digits, '_', '-', '.'): "
                             "not copied")
    return out


# -- memory ----------------------------------------------------------------------------------
def read_memories(layout: Layout, notes: list[str]) -> Iterator[tuple[str, str, MemoryDoc, list[AuditEvent]]]:
    """(workspace, user, document, audit) of every user with a memory document or audit; one whose
    document cannot be read is named in `notes` and left out."""
    files = FileMemoryDocs(layout)
    for ws, uid in user_dirs(layout, []):
        if not (files.path(ws, uid).exists() or files.audit_path(ws, uid).exists()):
            continue
        try:
            doc = files.read(ws, uid)
        except MemoryStoreError as exc:
            notes.append(f"memory of user {uid} in workspace {ws} not copied: {exc}")
            continue
        yield ws, uid, doc, files.audit(ws, uid)
