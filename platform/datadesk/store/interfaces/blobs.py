"""Blobs: every file a user has (artifacts, uploads, outputs, charts, exports, full-output texts),
by key, written once (SCALE.md sections 5.1, 5.4).

Two implementations: `offload/artifacts/localblobs.py LocalBlobs` (the embedded set: the files
of today's thread folders, no cache, no URLs) and `cluster/objects/blobs.py S3Blobs` (an S3-compatible
object store through obstore, with a bounded read-through cache directory per host and
presigned URLs). Callers type against `BlobStore` and never see either client.

Keys name what they hold: `ws/<ws>/u/<uid>/t/<tid>/<area>/<name>` (areas: `a` artifacts,
`o` outputs), every id validated (`domain/ids.py`) and names limited to safe file names, so a
key is also a safe relative path. A key is written once (`put(..., if_absent=True)` refuses an
existing one): a host's cached copy of a key can never be stale. New content gets a new key.

Errors (one hierarchy):

- `BlobError`: base of all;
- `BlobNotFound` (also a `LookupError`): no such key;
- `BlobExists`: a write-once key is already there (its content stays as it was);
- `BlobUnavailable`: the store cannot be reached or refused the credentials; its message names
  the store (its URL and endpoint, never a secret);
- `PresignUnsupported`: the embedded set has no URLs for a kernel or a browser to use.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO, Iterator, Literal, NamedTuple, Protocol, runtime_checkable

from datadesk.domain.ids import check_id

AREAS = {"a": "artifacts", "o": "outputs"}
# a file name inside an area: `<aid>.parquet`, `<aid>.original-csv`, `report-1.html`, `sub/x.png`
_NAME = re.compile(r"^(?!.*(?:^|/)\.)[A-Za-z0-9_.-]{1,128}(?:/[A-Za-z0-9_.-]{1,128}){0,7}$")
Method = Literal["GET", "PUT"]


class BlobError(Exception):
    """Base of the blob store's errors."""


class BlobNotFound(BlobError, LookupError):
    """No object under this key."""


class BlobExists(BlobError):
    """A write-once key already holds an object: it is never overwritten."""


class BlobUnavailable(BlobError):
    """The object store cannot be reached (or refused the credentials); the message names it."""


class PresignUnsupported(BlobError):
    """This store cannot hand out URLs (the embedded set: files of the home)."""


class BlobKey(NamedTuple):
    """A parsed key: the thread it belongs to, its area (`a`, `o`) and the name inside it."""

    workspace: str
    user: str
    thread: str
    area: str
    name: str

    def __str__(self) -> str:
        return f"{thread_prefix(self.workspace, self.user, self.thread)}{self.area}/{self.name}"


def check_name(name: str) -> str:
    """A name inside an area: safe path segments (no `..`, no hidden names, at most 8 deep)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name.split("/"):
        raise ValueError(f"invalid blob name {name!r}: letters, digits, '_', '-', '.' in at most 8 segments")
    return name


def thread_prefix(workspace: str, user: str, thread: str) -> str:
    """The prefix of every key of one thread (what a clear or delete removes)."""
    return f"ws/{check_id(workspace, 'workspace')}/u/{check_id(user, 'user')}/t/{check_id(thread, 'thread')}/"


def blob_key(workspace: str, user: str, thread: str, area: str, name: str) -> str:
    """`ws/<ws>/u/<uid>/t/<tid>/<area>/<name>`, every part validated."""
    if area not in AREAS:
        raise ValueError(f"invalid blob area {area!r}: one of {', '.join(AREAS)}")
    return f"{thread_prefix(workspace, user, thread)}{area}/{check_name(name)}"


def artifact_key(workspace: str, user: str, thread: str, name: str) -> str:
    """The key of an artifact's file `name` (`<aid>.<ext>`)."""
    return blob_key(workspace, user, thread, "a", name)


def parse_key(key: str) -> BlobKey:
    """The parts of a full key (ValueError naming what is wrong)."""
    parts = key.split("/", 7) if isinstance(key, str) else []
    if len(parts) != 8 or parts[0] != "ws" or parts[2] != "u" or parts[4] != "t":
        raise ValueError(f"invalid blob key {key!r}: expected ws/<ws>/u/<uid>/t/<tid>/<area>/<name>")
    parsed = BlobKey(parts[1], parts[3], parts[5], parts[6], parts[7])
    blob_key(*parsed)  # validates every part
    return parsed


def check_prefix(prefix: str) -> str:
    """A prefix to list or delete: `ws/` and whole segments below it, never the empty string (a
    delete of everything is not one call away from a typo)."""
    if not isinstance(prefix, str) or not prefix.startswith("ws/") or not prefix.endswith("/"):
        raise ValueError(f"invalid blob prefix {prefix!r}: starts with 'ws/' and ends with '/'")
    for seg in prefix[:-1].split("/"):
        if not seg or seg in (".", ".."):
            raise ValueError(f"invalid blob prefix {prefix!r}: empty or dot segment")
    return prefix


@runtime_checkable
class BlobStore(Protocol):
    """Objects by key, written once. Every method raises BlobUnavailable when the store is down."""

    where: str  # the store, in words for messages ("s3://bucket/prefix at http://...", a folder)

    def put(self, key: str, src: Path | bytes, if_absent: bool = True) -> int:
        """Store `src` (a file's content, or bytes) under `key`; returns its size. With `if_absent`
        (the default) an existing key is refused with BlobExists and left as it was."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object (BlobNotFound)."""
        ...

    def local_path(self, key: str) -> Path:
        """A local, read-only file holding the object (S3: a read-through cache file, filled
        on a miss; embedded: the file itself). BlobNotFound when there is no such object."""
        ...

    def open_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer at the end of the object)."""
        ...

    def size(self, key: str) -> int:
        """The object's size in bytes (BlobNotFound)."""
        ...

    def exists(self, key: str) -> bool:
        ...

    def delete(self, key: str) -> None:
        """Remove one object (no error when it is not there)."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under `prefix` (a thread's, on clear or delete); returns how many."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """The keys under `prefix`."""
        ...

    def presign(self, key: str, method: Method = "GET", ttl_s: int = 300,
                content_length: int | None = None) -> str:
        """A URL that allows `method` on this one object for `ttl_s` seconds, for a holder of no
        credentials (a kernel, a browser). A PUT URL needs `content_length`: the store then
        refuses a body of any other length. PresignUnsupported on the embedded set."""
        ...


def copy_to(blobs: BlobStore, key: str, out: BinaryIO, chunk: int = 8 << 20) -> int:
    """Write the object into `out` a chunk at a time (no whole-object copy in memory)."""
    total, size = 0, blobs.size(key)
    while total < size:
        data = blobs.open_range(key, total, min(chunk, size - total))
        if not data:
            break
        out.write(data)
        total += len(data)
    return total
