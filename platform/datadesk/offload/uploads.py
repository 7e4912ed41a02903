"""Analyst uploads (CSV, TSV, Excel, Parquet, JSON, images, and a text in any shape a tool's
result may have: Markdown, HTML, vertical records, a Python repr ...) become artifacts.

The type is decided by content, never by the file name. Tabular files are
converted to Parquet batch by batch through the same writer as query results;
images are kept as they are (for vision models). A bad file gets an error
naming the problem; nothing half-written remains. `ingest_upload_async` runs it in a
worker thread: a cancelled upload stops at the next batch and leaves no artifact and no
temp file; rows and bytes written are reported as progress.

Every sheet of a workbook becomes an artifact of its own (empty sheets are skipped and
listed). A CSV/TSV keeps its uploaded file beside the artifact (`<aid>.original-csv`, counted
in the quotas with it) so that `reimport_upload` can read it again with the delimiter,
decimal separator, header row or encoding the analyst chose, replacing the artifact's data.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgspec
import pyarrow as pa

from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.tools import TabularStream
from datadesk.offload.pipeline import OffloadPipeline
from datadesk.offload.parquet.writer import file_digest
from datadesk.offload.artifacts.store import new_artifact_id, regular_file
from datadesk.offload.readers.errors import LimitExceeded
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.readers import TABULAR, file_tables, sniff_file
from datadesk.offload.readers.csv.dialect import ReadChoices
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.worker import WriteJob, run_job
from datadesk.store.threads import Thread

IMAGES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


class UploadError(ValueError):
    """The uploaded file cannot be used; the message says why (format, line, sheet, encoding)."""


class UploadTooLarge(UploadError):
    """The file passed one of the upload limits (`UploadLimits`); the message names it (413)."""


Ingested = tuple[Artifact, pa.Table | None, pa.Schema | None]
KEPT = ("csv", "tsv")  # formats whose reading is a guess the analyst may correct: the original is kept


@dataclass
class Upload:
    """What one uploaded file became: its artifacts with the preview head and schema of each (a
    workbook: one per sheet with rows, in order), and the sheets skipped (name, why)."""

    tables: list[Ingested]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def artifacts(self) -> list[Artifact]:
        return [t[0] for t in self.tables]


async def ingest_upload_async(pipeline: OffloadPipeline, thread: Thread, tmp: Path, filename: str,
                              origin: ArtifactOrigin, progress: Callable[..., None] | None = None,
                              limits: UploadLimits | None = None) -> Upload:
    """`ingest_upload` in a worker thread. `progress(rows=, bytes=)` is called on the event loop
    while it writes; cancelling the caller stops it: no artifact, `tmp` removed."""
    job = pipeline.job(progress)
    return await run_job(job, ingest_upload, pipeline, thread, tmp, filename, origin, job, limits,
                         discard=pipeline.store.discard)


def ingest_upload(pipeline: OffloadPipeline, thread: Thread, tmp: Path, filename: str,
                  origin: ArtifactOrigin, job: WriteJob | None = None,
                  limits: UploadLimits | None = None) -> Upload:
    """Turn the uploaded file at `tmp` into artifacts of `thread` (one per sheet of a workbook);
    `tmp` is consumed either way (a CSV/TSV is kept beside its artifact, for a re-import).
    Past one of `limits` (the clock starts now): UploadTooLarge naming it, nothing kept."""
    limits = (limits or UploadLimits()).started(job.check if job is not None else None)
    try:
        if job is not None:
            job.check()
        fmt = sniff_file(tmp)
        if fmt == "xls":
            raise UploadError(f"{filename}: legacy .xls files are not supported; save it as .xlsx")
        if fmt in IMAGES:
            return Upload([(_image(pipeline, thread, tmp, fmt, origin, job), None, None)])
        if fmt not in TABULAR:
            raise UploadError(f"{filename}: unsupported or unrecognised file type (by content); accepted: "
                              "CSV, TSV, Excel (.xlsx), Parquet, JSON, a table drawn in text (Markdown, "
                              "ASCII, psql), HTML tables, vertical records, a Python repr, PNG, JPEG, GIF, WebP")
        upload = Upload([])
        try:
            for table in file_tables(tmp, fmt, limits=limits):
                if table.stream is None:
                    upload.skipped.append((table.name or filename, table.skipped or "empty"))
                    continue
                sheet_origin = origin if table.name is None else msgspec.structs.replace(origin, sheet=table.name)
                with table.stream as stream:
                    art, head, full_schema = pipeline.write_table(thread, new_artifact_id(), stream, sheet_origin,
                                                                  "upload", job=job)
                if art is None:
                    if table.name is None:
                        raise UploadError(f"{filename}: the file has no data rows")
                    upload.skipped.append((table.name, "no data rows"))
                    continue
                upload.tables.append((art, head, full_schema))
                art = _with_reading(pipeline, thread, art, fmt, stream, tmp if fmt in KEPT else None, job)
                upload.tables[-1] = (art, head, full_schema)
        except BaseException as exc:
            for art, _, _ in upload.tables:  # a later sheet failed: nothing of the file is kept
                pipeline.store.discard(thread, art)
            if isinstance(exc, LimitExceeded):
                raise UploadTooLarge(f"{filename}: {exc}") from None
            if isinstance(exc, TabularParseError):
                raise UploadError(f"{filename}: {exc}") from None
            if isinstance(exc, pa.ArrowException):
                raise UploadError(f"{filename}: cannot read it as {fmt.upper()}: {exc}") from None
            raise
        if not upload.tables:
            sheets = ", ".join(f"{name!r} ({why})" for name, why in upload.skipped)
            raise UploadError(f"{filename}: the file has no data rows" + (f"; sheets: {sheets}" if sheets else ""))
        return upload
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".batches.tmp")):  # what an .xlsx child wrote
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def _with_reading(pipeline: OffloadPipeline, thread: Thread, art: Artifact, fmt: str, stream: TabularStream,
                  original: Path | None, job: WriteJob | None) -> Artifact:
    """The artifact with how its file was read (`reading`: the dialect or sheet layout) and, for a
    CSV/TSV, its uploaded file kept beside it: the metadata naming it is written first, then the
    file is moved in (a crash between leaves a name without a file, never a file nobody owns)."""
    facts = getattr(stream, "facts", None)
    reading = dict(getattr(facts, "reading", None) or {})
    reading["format"] = fmt
    changes: dict = {"reading": reading}
    if original is not None:
        name = pipeline.store.original_name(art.id, fmt)
        changes.update(original=name, original_bytes=original.stat().st_size)
    art = msgspec.structs.replace(art, **changes)
    if job is None:
        pipeline.store.save(thread, art)
    else:
        job.publish(thread, art, lambda: pipeline.store.save(thread, art))
    if original is not None:
        os.replace(original, thread.artifacts_dir / art.original)
        pipeline.store.kept_original(thread, art)  # the cluster set uploads it (embedded: it is the file)
    return art


async def reimport_upload_async(pipeline: OffloadPipeline, thread: Thread, art: Artifact, choices: ReadChoices,
                                limits: UploadLimits | None = None) -> Ingested:
    """`reimport_upload` in a worker thread; a cancel keeps the old data (nothing to discard)."""
    job = pipeline.job(None)
    return await run_job(job, reimport_upload, pipeline, thread, art, choices, job, limits)


def reimport_upload(pipeline: OffloadPipeline, thread: Thread, art: Artifact, choices: ReadChoices,
                    job: WriteJob | None = None, limits: UploadLimits | None = None) -> Ingested:
    """Read the kept original of a CSV/TSV upload again with the analyst's `choices` (delimiter,
    decimal separator, header row, encoding; the rest sniffed again) and REPLACE the artifact's
    data in place: same id, same sandbox path. The new Parquet file is renamed over the old one
    once it is complete; any error leaves the artifact as it was."""
    limits = (limits or UploadLimits()).started(job.check if job is not None else None)
    name = art.name or art.id
    if not art.available:
        raise UploadError(f"{name}: the artifact expired; upload the file again")
    if not art.original:
        raise UploadError(f"{name}: only a CSV or TSV upload can be re-imported with other options "
                          "(its original file is kept for that)")
    src = pipeline.store.original_path(thread, art)
    if not regular_file(src):
        raise UploadError(f"{name}: the original file is no longer kept; upload it again")
    fmt = "tsv" if choices.delimiter == "\t" else "csv"
    try:
        (table,) = file_tables(src, fmt, limits=limits, choices=choices)
        with table.stream as stream:
            new, head, schema = pipeline.write_table(thread, art.id, stream, art.origin, "upload",
                                                     existing=art, job=job)
    except LimitExceeded as exc:
        raise UploadTooLarge(f"{name}: {exc}") from None
    except TabularParseError as exc:
        raise UploadError(f"{name}: {exc}") from None
    except pa.ArrowException as exc:
        raise UploadError(f"{name}: cannot read it with these options: {exc}") from None
    if new is None:
        raise UploadError(f"{name}: read with these options, the file has no data rows; nothing was changed")
    reading = dict(getattr(stream.facts, "reading", None) or {}, format=fmt)
    new = msgspec.structs.replace(new, reading=reading, original=art.original, original_bytes=art.original_bytes,
                                  requeried_at=art.requeried_at, reimported_at=time.time())
    pipeline.store.save(thread, new)
    return new, head, schema


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
