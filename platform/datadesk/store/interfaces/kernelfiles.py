"""What a kernel is handed of its thread's files, and how its /outputs come back (SCALE.md 5.4).

A kernel on this host reads its /data from a local folder of links (`local_dir`). A kernel
any host can reach (the gateway backend with `sandbox.gateway_files = "presigned"`) shares no
volume with the app: before each execution it is handed a `KernelDownload` per available
artifact (a presigned GET URL for that one object, its size and sha256), and each new file it
wrote under /outputs goes back through a `KernelUpload` (a presigned PUT whose key and content
length the app fixed) that the app then `take`s. Kernels never see store credentials.

Two implementations: `LocalKernelFiles` below (a folder of this host: the embedded set's
artifacts folder, or what a caller links /data from; no presigned URLs) and `cluster/objects/artifacts.py PresignedKernelFiles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


class KernelFilesUnavailable(Exception):
    """The files cannot be handed over this way (no object store, the store is down); the
    message names what is missing."""


@dataclass(frozen=True)
class KernelDownload:
    """One artifact file for a kernel's /data: `name` (`<aid>.<ext>`), its size, its sha256
    (hex; "" when unknown, then only the size is checked) and a presigned GET URL."""

    name: str
    size: int
    sha256: str
    url: str


@dataclass(frozen=True)
class KernelUpload:
    """Where a kernel puts one file of its /outputs: a presigned PUT URL for `key`, valid only
    with `Content-Length: size` (and `If-None-Match: *`, so nothing is overwritten)."""

    relpath: str
    key: str
    url: str
    size: int


@runtime_checkable
class KernelFiles(Protocol):
    """One thread's files as a kernel gets them (see the module doc)."""

    def local_dir(self) -> Path:
        """A folder of this host holding the data files of the thread's available artifacts."""
        ...

    def downloads(self) -> list[KernelDownload]:
        """A presigned download for every available artifact of the thread (an artifact the
        store cannot give now is left out and logged); KernelFilesUnavailable without a store."""
        ...

    def upload(self, relpath: str, size: int) -> KernelUpload:
        """A presigned upload of `size` bytes for the /outputs file `relpath`."""
        ...

    def take(self, upload: KernelUpload) -> bytes:
        """The bytes a kernel put through `upload` (exactly `upload.size` of them), and the
        staged object removed; KernelFilesUnavailable when it is missing or of another size."""
        ...

    def discard(self, upload: KernelUpload) -> None:
        """Remove a staged object that will not be taken (nothing when it is not there)."""
        ...


class LocalKernelFiles:
    """`KernelFiles` of a local folder (the embedded set's artifacts folder): no presigned URLs
    (there is no object store to sign them)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def local_dir(self) -> Path:
        return self.folder

    def _none(self) -> KernelFilesUnavailable:
        return KernelFilesUnavailable('kernels without a shared volume (sandbox.gateway_files = "presigned") '
                                      "need the object store: set storage.url and cluster.database_url")

    def downloads(self) -> list[KernelDownload]:
        raise self._none()

    def upload(self, relpath: str, size: int) -> KernelUpload:
        raise self._none()

    def take(self, upload: KernelUpload) -> bytes:
        raise self._none()

    def discard(self, upload: KernelUpload) -> None:
        return None
