"""`PresignedKernelFiles`: a thread's files for a kernel that shares no volume with the app
(store/interfaces/kernelfiles.py, SCALE.md 5.4).

Downloads are presigned GETs of the artifacts' own objects (write-once keys, so a URL never
names changed data). Uploads go to a staging key of the thread's outputs area,
`ws/<ws>/u/<uid>/t/<tid>/o/staged/<random>`: the PUT URL signs the content length and
`If-None-Match: *`, so the kernel can put exactly that many bytes there once and nothing else.
`take` reads the staged object back and removes it (the caller then saves the bytes as an
artifact the usual way); a thread's clear removes any staged object left behind with the rest
of its prefix.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from datadesk.store.interfaces.blobs import BlobError, BlobNotFound, BlobStore, blob_key
from datadesk.store.interfaces.kernelfiles import KernelDownload, KernelFilesUnavailable, KernelUpload

log = logging.getLogger(__name__)

STAGED = "staged"


class PresignedKernelFiles:
    """The cluster set's `KernelFiles` for one thread (made by `PgArtifactStore.kernel_handoff`)."""

    def __init__(self, artifacts: Any, blobs: BlobStore, thread: Any, ttl_s: int) -> None:
        self.artifacts = artifacts  # cluster/objects/artifacts.py PgArtifactStore
        self.blobs = blobs
        self.thread = thread
        self.ttl_s = ttl_s
        self.key = artifacts.thread_key(thread)

    def local_dir(self) -> Path:
        return self.artifacts.kernel_files(self.thread)

    def downloads(self) -> list[KernelDownload]:
        out: list[KernelDownload] = []
        for art in self.artifacts.list(self.thread):
            if not art.available:
                continue
            try:
                url = self.blobs.presign(self.artifacts.object_key(self.key, art), "GET", self.ttl_s)
            except BlobError as exc:
                log.warning("artifact %s is not handed to the kernel: %s", art.id, exc)
                continue
            out.append(KernelDownload(name=art.file, size=art.bytes, sha256=art.sha256, url=url))
        return out

    def upload(self, relpath: str, size: int) -> KernelUpload:
        key = blob_key(*self.key, "o", f"{STAGED}/{secrets.token_hex(12)}")
        try:
            url = self.blobs.presign(key, "PUT", self.ttl_s, content_length=size)
        except BlobError as exc:
            raise KernelFilesUnavailable(str(exc)) from None
        return KernelUpload(relpath=relpath, key=key, url=url, size=size)

    def take(self, upload: KernelUpload) -> bytes:
        try:
            data = self.blobs.get(upload.key)
        except BlobNotFound:
            raise KernelFilesUnavailable(f"/outputs/{upload.relpath} did not arrive in the object store") from None
        except BlobError as exc:
            raise KernelFilesUnavailable(str(exc)) from None
        finally:
            self.discard(upload)
        if len(data) != upload.size:  # the signed length makes this the store's bug, not the kernel's
            raise KernelFilesUnavailable(f"/outputs/{upload.relpath} arrived with {len(data):,} bytes, "
                                         f"not {upload.size:,}")
        return data

    def discard(self, upload: KernelUpload) -> None:
        try:
            self.blobs.delete(upload.key)
        except BlobError as exc:
            log.warning("staged output %s stays in the store until the thread is cleared: %s", upload.key, exc)
