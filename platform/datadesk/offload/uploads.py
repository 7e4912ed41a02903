"""Analyst uploads (CSV, TSV, Excel, Parquet, JSON, images) become artifacts.

The type is decided by content, never by the file name. Tabular files are
converted to Parquet batch by batch through the same writer as query results;
images are kept as they are (for vision models). A bad file gets an error
naming the problem; nothing half-written remains. `ingest_upload_async` runs it in a
worker thread: a cancelled upload stops at the next batch and leaves no artifact and no
temp file; rows and bytes written are reported as progress.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa

from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.tools import TabularStream
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.offload.parquet.writer import file_digest
from datadesk.offload.artifacts.store import new_artifact_id
from datadesk.offload.readers.errors import LimitExceeded
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.readers import file_batches, sniff_file
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.worker import WriteJob, run_job
from datadesk.store.threads import Thread

TABULAR = ("csv", "tsv", "xlsx", "parquet", "json")
IMAGES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


class UploadError(ValueError):
    """The uploaded file cannot be used; the message says why (format, line, sheet, encoding)."""


class UploadTooLarge(UploadError):
    """The file passed one of the upload limits (`UploadLimits`); the message names it (413)."""


Ingested = tuple[Artifact, pa.Table | None, pa.Schema | None]


async def ingest_upload_async(pipeline: OffloadPipeline, thread: Thread, tmp: Path, filename: str,
                              origin: ArtifactOrigin, progress: Callable[..., None] | None = None,
                              limits: UploadLimits | None = None) -> Ingested:
    """`ingest_upload` in a worker thread. `progress(rows=, bytes=)` is called on the event loop
    while it writes; cancelling the caller stops it: no artifact, `tmp` removed."""
    job = pipeline.job(progress)
    return await run_job(job, ingest_upload, pipeline, thread, tmp, filename, origin, job, limits,
                         discard=pipeline.store.discard)


def ingest_upload(pipeline: OffloadPipeline, thread: Thread, tmp: Path, filename: str,
                  origin: ArtifactOrigin, job: WriteJob | None = None,
                  limits: UploadLimits | None = None) -> Ingested:
    """Turn the uploaded file at `tmp` into an artifact of `thread`; `tmp` is consumed either way.
    Past one of `limits` (the clock starts now): UploadTooLarge naming it, nothing kept."""
    limits = (limits or UploadLimits()).started(job.check if job is not None else None)
    try:
        if job is not None:
            job.check()
        fmt = sniff_file(tmp)
        if fmt == "xls":
            raise UploadError(f"{filename}: legacy .xls files are not supported; save it as .xlsx")
        if fmt in IMAGES:
            return _image(pipeline, thread, tmp, fmt, origin, job), None, None
        if fmt not in TABULAR:
            raise UploadError(f"{filename}: unsupported or unrecognised file type (by content); accepted: "
                              "CSV, TSV, Excel (.xlsx), Parquet, JSON, PNG, JPEG, GIF, WebP")
        try:
            schema, batches = file_batches(tmp, fmt, limits=limits)
            aid = new_artifact_id()
            with TabularStream(schema, batches) as table:
                art, head, full_schema = pipeline.write_table(thread, aid, table, origin, "upload", job=job)
        except LimitExceeded as exc:
            raise UploadTooLarge(f"{filename}: {exc}") from None
        except TabularParseError as exc:
            raise UploadError(f"{filename}: {exc}") from None
        except pa.ArrowException as exc:
            raise UploadError(f"{filename}: cannot read it as {fmt.upper()}: {exc}") from None
        if art is None:
            raise UploadError(f"{filename}: the file has no data rows")
        return art, head, full_schema
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".batches.tmp")):  # what an .xlsx child wrote
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def _image(pipeline: OffloadPipeline, thread: Thread, tmp: Path, fmt: str, origin: ArtifactOrigin,
           job: WriteJob | None) -> Artifact:
    aid = new_artifact_id()
    ext = "jpg" if fmt == "jpeg" else fmt
    final = thread.artifacts_dir / f"{aid}.{ext}"
    digest, size = file_digest(tmp)
    os.chmod(tmp, 0o644)  # readable by the sandbox user, like every artifact
    os.replace(tmp, final)
    now = time.time()
    art = Artifact(id=aid, kind="upload", format=fmt, file=final.name, origin=origin, created=now,
                   last_used=now, bytes=size, sha256=digest, media_type=IMAGES[fmt])
    if job is None:
        pipeline.store.save(thread, art)
        return art
    try:
        job.publish(thread, art, lambda: pipeline.store.save(thread, art))
    except BaseException:
        final.unlink(missing_ok=True)
        raise
    return art
