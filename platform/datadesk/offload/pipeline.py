"""The offload pipeline between every tool and the model (DESIGN section 6).

For each tool result:
- not offloadable (first-party return contract) or an error: passed through;
- a large tabular stream, or text over `threshold_chars`:
  - when the model can read files (python tool in this request, sandbox
    healthy): streamed to `artifacts/<aid>.parquet` (tabular) or `.txt`, and
    the model gets schema, counts, a capped preview and the notice;
  - otherwise: no file; the head of the result and a notice naming why.
- small results are passed through unchanged.

Writing runs in a worker thread, batch by batch, so neither the event loop
nor the app's memory carries the whole result; the source (a DuckDB stream, a
text parser) is read ahead in a second thread, a bounded queue in between
(`offload/readahead.py`), so reading and Parquet encoding overlap. The pipeline knows nothing of
the tool layer: it gets the `Thread` to write into, the artifact's origin
(who, which call), the epoch the work started in and a plain progress callback.

A cancelled call (Stop, a turn cancelled) stops the writer too (`offload/worker.py`):
the source is interrupted, the writer stops at its next batch, its temp files are
removed and no artifact is published (one published just before the cancel is
removed again). Rows and bytes written are reported as progress while it writes.

Each write takes a place in the writer pool first (`offload/writers.py`, limits.offload_writers
and offload_writers_per_user): the query slot of a SQL result is given back once its source is
read, and the encoding, publish and quota pass that follow are bounded by the pool instead. A
write waiting for a writer reports it as progress and is never refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import msgspec
import pyarrow as pa

from datadesk.domain.artifacts import Artifact, ArtifactOrigin, ColumnSchema
from datadesk.domain.records import ArtifactRef, ToolRecordMeta, short_arguments
from datadesk.domain.tools import TabularStream, ToolResult, ToolSpec
from datadesk.offload import preview, source_cut
from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
from datadesk.offload.parquet.writer import ROW_GROUP_BYTES, ParquetSink
from datadesk.offload.readahead import ReadAhead
from datadesk.offload.readers import result_stream
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.worker import PROGRESS_INTERVAL_S, WriteCancelled, WriteJob, run_job
from datadesk.offload.writers import Writer, WriterPool
from datadesk.settings import OffloadSettings
from datadesk.store.interfaces.blobs import BlobUnavailable
from datadesk.store.files import not_saved, write_atomic
from datadesk.store.threads import Thread
from datadesk.telemetry import OFFLOAD_ARTIFACTS, OFFLOAD_BYTES, OFFLOAD_FALLBACKS, OFFLOAD_ROWS, observe_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffloadCapability:
    """Whether the model of this request can read artifact files, and if not, why."""

    can_offload: bool
    reason: str = ""


class StoreDown(BlobUnavailable):
    """The object store could not take a result just written (the cluster set's store is down):
    the local file is gone again and nothing was registered; `head` (the preview rows), `schema`
    and `rows` let the model get the head and a notice instead."""

    def __init__(self, cause: BlobUnavailable, head: pa.Table | None = None, schema: pa.Schema | None = None,
                 rows: int = 0) -> None:
        super().__init__(str(cause))
        self.head, self.schema, self.rows = head, schema, rows


def store_down_reason(exc: BlobUnavailable) -> str:
    return f"saving the full result failed: {exc}"


@dataclass
class OffloadOutcome:
    result: ToolResult
    artifact: Artifact | None = None


def result_table(result: ToolResult) -> TabularStream | None:
    """The result as a tabular stream: its own, or its text when that parses as a table."""
    if result.table is not None:
        return result.table
    try:
        return result_stream(result)  # every shape of issue 17, in the order of readers.ORDER
    except TabularParseError:
        return None


def column_schema(schema: pa.Schema) -> list[ColumnSchema]:
    return [ColumnSchema(f.name, str(f.type)) for f in schema]


class OffloadPipeline:
    """Decides, per tool result, between pass-through, artifact and truncation."""

    def __init__(self, settings: OffloadSettings, store: ArtifactStore, count: Callable[[str], int],
                 on_created: Callable[[Artifact], object] | None = None,
                 writers: WriterPool | None = None) -> None:
        self.settings = settings
        self.store = store
        self.count = count
        self.on_created = on_created  # quota enforcement hook, called with each new cache artifact
        self.writers = writers or WriterPool()  # writes at once, per user and in all (limits.offload_writers*)
        self.progress_interval_s = PROGRESS_INTERVAL_S  # rows/bytes reports of a long write, at most this often

    def job(self, progress: Callable[..., None] | None) -> WriteJob:
        """The cancel flag and progress channel of one write started from the event loop."""
        return WriteJob(progress, asyncio.get_running_loop(), self.progress_interval_s)

    async def process(self, spec: ToolSpec | None, result: ToolResult, thread: Thread, origin: ArtifactOrigin,
                      cap: OffloadCapability, epoch: int | None = None,
                      progress: Callable[..., None] | None = None) -> OffloadOutcome:
        """Pass `result` of the call described by `origin` through, or offload it into `thread`'s
        artifacts (refused when the thread was cleared since `epoch`), or truncate it.
        `progress(rows=, bytes=)` is called on the event loop while a large result is written;
        cancelling the caller stops the write and leaves no artifact."""
        offloadable = spec is not None and spec.offloadable and not result.is_error
        if not offloadable:
            if result.table is not None:
                result.table.close()
            return OffloadOutcome(result)
        if result.table is None and len(result.content) <= self.settings.threshold_chars:
            # as it is, but never a source's own cut unmarked ("showing first 32 rows (truncated)")
            return OffloadOutcome(source_cut.marked(result, origin.arguments, origin.tool))
        job = self.job(progress)
        interrupt = result.table.interrupt if result.table is not None else None
        writer = await self._writer(origin.user, result, progress)
        try:
            return await run_job(job, self._process_sync, spec, result, thread, origin, cap, epoch, job,
                                 interrupt=interrupt, discard=self.store.discard, done=writer.release,
                                 executor=self.writers.executor)
        except Exception as exc:  # the stream failed mid-way (timeout, engine error): say so
            log.warning("reading the result of %s failed: %s", spec.name, exc)
            return OffloadOutcome(ToolResult(content=f"{spec.name} failed while reading its result: {exc}",
                                             is_error=True, meta=result.meta))

    async def _writer(self, user: str, result: ToolResult, progress: Callable[..., None] | None) -> Writer:
        """A place in the writer pool for this write (waiting is progress, never refused); a call
        cancelled while it waits closes its stream (the query behind it stops, its slot frees)."""
        started = time.monotonic()
        try:
            writer = await self.writers.acquire(user, progress)
            if time.monotonic() - started > 0.001:  # it waited in line (a free writer is no wait)
                observe_wait("offload_writer", started)
            return writer
        except asyncio.CancelledError:
            if result.table is not None:
                result.table.close()
            raise

    # -- worker thread ------------------------------------------------------------
    def _process_sync(self, spec: ToolSpec, result: ToolResult, thread: Thread, origin: ArtifactOrigin,
                      cap: OffloadCapability, epoch: int | None, job: WriteJob) -> OffloadOutcome:
        source = f"{spec.name}({short_arguments(origin.arguments or '', 300)})"
        table = result_table(result)
        try:
            if table is not None:
                try:
                    return self._table(spec, result, table, thread, origin, cap, source, epoch, job)
                except TabularParseError as exc:
                    if result.table is not None:
                        raise
                    log.info("result of %s is not tabular after all (%s): kept as text", spec.name, exc)
            return self._text(result, thread, origin, cap, source, epoch, job)
        finally:
            if table is not None:
                table.close()

    def _table(self, spec: ToolSpec, result: ToolResult, table: TabularStream, thread: Thread,
               origin: ArtifactOrigin, cap: OffloadCapability, source: str, epoch: int | None,
               job: WriteJob) -> OffloadOutcome:
        if not cap.can_offload:
            OFFLOAD_FALLBACKS.labels("not_offloadable").inc()
            return OffloadOutcome(self._truncated_table(result, table, cap.reason, job))
        try:
            art, head, schema = self.write_table(thread, new_artifact_id(), table, origin, "result", epoch=epoch,
                                                 job=job)
        except StoreDown as exc:  # the head and a notice naming the store, as without a sandbox
            OFFLOAD_FALLBACKS.labels("store_down").inc()
            log.warning("offload of %s not kept: %s", spec.name, exc)
            rows = exc.head.to_pylist() if exc.head is not None else []
            content = preview.render_truncated_table(exc.schema or table.schema or pa.schema([]), rows, exc.rows,
                                                     store_down_reason(exc), self.settings.threshold_chars)
            return OffloadOutcome(ToolResult(content=content, meta=_with(result, rows=exc.rows, truncated=True,
                                                                         offload_failed=True)))
        except OSError as exc:
            OFFLOAD_FALLBACKS.labels("disk").inc()
            log.warning("offload of %s failed: %s", spec.name, exc)
            disk = not_saved(exc, f"the full result of {spec.name}")
            if disk is not None:  # a full disk: an error the user and the model are told as such
                return OffloadOutcome(ToolResult(content=f"{spec.name} failed: {disk}. Narrow the query with "
                                                 "filters, aggregation or LIMIT, or free space on the disk.",
                                                 is_error=True, meta=_with(result, offload_failed=True)))
            reason = f"saving the full result failed: {exc.strerror or exc}"
            return OffloadOutcome(ToolResult(content=f"NOTICE: {reason}. The result is not available; "
                                             "narrow the query with filters, aggregation or LIMIT.",
                                             meta=_with(result, offload_failed=True)))
        if art is None:
            return OffloadOutcome(ToolResult(content=preview.render_empty(table.schema, spec.name),
                                             meta=_with(result, rows=0)))
        self._created(art)
        s = self.settings
        content = preview.render_table_artifact(art, schema, head, source, self.count, s.max_tokens, s.preview_rows,
                                                s.preview_cell_chars, s.max_columns)
        return OffloadOutcome(ToolResult(content=content, meta=_with(result, artifact=ArtifactRef.of(art))), art)

    def write_table(self, thread: Thread, aid: str, table: TabularStream, origin: ArtifactOrigin,
                    kind: str, existing: Artifact | None = None, epoch: int | None = None,
                    job: WriteJob | None = None) -> tuple[Artifact | None, pa.Table, pa.Schema | None]:
        """Stream `table` into `artifacts/<aid>.parquet`: (artifact, preview head, schema).

        The artifact is None when the result has no rows (nothing is kept). With `job`, the
        write stops (WriteCancelled, nothing left behind) once it is cancelled, and reports
        rows and bytes written as it goes.
        """
        adir = thread.artifacts_dir
        adir.mkdir(parents=True, exist_ok=True)
        final = adir / f"{aid}.parquet"
        head: list[pa.RecordBatch] = []
        head_rows = 0
        want = self.settings.preview_rows
        check = job.check if job else None
        with ParquetSink(final, self.settings.result_max_bytes, check=check) as sink:
            if table.schema is not None:
                sink.add_schema(table.schema)
            # The source is read in a producer thread while this one writes (stopped on leaving).
            with ReadAhead(table, max_bytes=ROW_GROUP_BYTES, check=check, interrupt=table.interrupt) as batches:
                for batch in batches:
                    if head_rows < want and batch.num_rows:
                        head.append(batch.slice(0, want - head_rows))
                        head_rows += min(batch.num_rows, want - head_rows)
                    if not sink.add(batch):
                        break
                    if job is not None:
                        job.report(sink.rows, sink.bytes_written)
            if sink.rows == 0:
                sink.abort()
                empty = pa.Table.from_batches([], schema=table.schema) if table.schema else pa.table({})
                return None, empty, table.schema
            res = sink.close()
        now = time.time()
        head_table = pa.Table.from_batches(head) if head else pa.Table.from_batches([], schema=res.schema)
        art = Artifact(
            id=aid, kind=kind, format="parquet", file=final.name, origin=origin,
            created=existing.created if existing else now, last_used=now,
            status="partial" if res.partial else "ready", rows=res.rows, columns=res.columns,
            schema=column_schema(res.schema), bytes=res.bytes, sha256=res.sha256,
            media_type="application/vnd.apache.parquet",
            partial_reason=(f"the result passed the {preview.human_bytes(self.settings.result_max_bytes)} "
                            "ceiling; writing stopped") if res.partial else None,
            requeried_at=now if existing else None,
        )
        art = source_cut.annotate(art, table)  # shape, source metadata, "partial (by the source)"
        try:
            self._publish(thread, art, epoch, job, existing)
        except BlobUnavailable as exc:  # not in the store: this host's copy goes too (no half artifact)
            final.unlink(missing_ok=True)
            raise StoreDown(exc, head_table, res.schema, res.rows) from exc
        return art, head_table, res.schema

    def _publish(self, thread: Thread, art: Artifact, epoch: int | None, job: WriteJob | None,
                 existing: Artifact | None) -> None:
        """Write the metadata of a new data file, unless the job was cancelled (then the file
        goes). A restore (`existing`) whose file is already in place is always published: its
        metadata must describe the data now on disk."""
        if job is None or existing is not None:
            self.store.save(thread, art, epoch)
            return
        try:
            job.publish(thread, art, lambda: self.store.save(thread, art, epoch))
        except WriteCancelled:
            self.store.data_path(thread, art).unlink(missing_ok=True)
            raise

    def _truncated_table(self, result: ToolResult, table: TabularStream, reason: str,
                         job: WriteJob | None = None) -> ToolResult:
        rows: list[dict[str, Any]] = []
        total = 0
        schema = table.schema
        for batch in table:
            if job is not None:
                job.check()
            schema = schema or batch.schema
            if len(rows) < 500:
                rows.extend(batch.slice(0, 500 - len(rows)).to_pylist())
            total += batch.num_rows
        if total == 0:
            return ToolResult(content=preview.render_empty(schema, "query"), meta=_with(result, rows=0))
        content = preview.render_truncated_table(schema or pa.schema([]), rows, total, reason,
                                                 self.settings.threshold_chars)
        content += source_cut.truncation_note(table, total)  # issue 17: the source's own cut, said
        return ToolResult(content=content, meta=_with(result, rows=total, truncated=True))

    def _text(self, result: ToolResult, thread: Thread, origin: ArtifactOrigin, cap: OffloadCapability,
              source: str, epoch: int | None, job: WriteJob | None = None) -> OffloadOutcome:
        text = result.content
        if not cap.can_offload:
            OFFLOAD_FALLBACKS.labels("not_offloadable").inc()
            return OffloadOutcome(ToolResult(
                content=preview.render_truncated_text(text, cap.reason, self.settings.threshold_chars),
                meta=_with(result, chars=len(text), truncated=True)))
        try:
            art = self.write_text(thread, new_artifact_id(), text, origin, "result", epoch=epoch, job=job)
        except BlobUnavailable as exc:  # the head and a notice naming the store; nothing kept
            OFFLOAD_FALLBACKS.labels("store_down").inc()
            log.warning("offload of %s not kept: %s", origin.tool, exc)
            return OffloadOutcome(ToolResult(
                content=preview.render_truncated_text(text, store_down_reason(exc), self.settings.threshold_chars),
                meta=_with(result, chars=len(text), truncated=True, offload_failed=True)))
        except OSError as exc:
            OFFLOAD_FALLBACKS.labels("disk").inc()
            reason = f"saving the full result failed: {exc.strerror or exc}"
            return OffloadOutcome(ToolResult(
                content=preview.render_truncated_text(text, reason, self.settings.threshold_chars),
                meta=_with(result, offload_failed=True)))
        self._created(art)
        content = preview.render_text_artifact(art, text[:1_500], source, self.count, self.settings.max_tokens)
        return OffloadOutcome(ToolResult(content=content, meta=_with(result, artifact=ArtifactRef.of(art))), art)

    def write_text(self, thread: Thread, aid: str, text: str, origin: ArtifactOrigin, kind: str,
                   existing: Artifact | None = None, epoch: int | None = None,
                   job: WriteJob | None = None) -> Artifact:
        """Save `text` as `artifacts/<aid>.txt` (cut at the size ceiling, marked partial)."""
        if job is not None:
            job.check()
        data = text.encode("utf-8", errors="replace")
        partial = len(data) > self.settings.result_max_bytes
        if partial:
            data = data[: self.settings.result_max_bytes]
        path = thread.artifacts_dir / f"{aid}.txt"
        write_atomic(path, data)
        now = time.time()
        art = Artifact(
            id=aid, kind=kind, format="text", file=path.name, origin=origin,
            created=existing.created if existing else now, last_used=now,
            status="partial" if partial else "ready", bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(), chars=len(text), media_type="text/plain; charset=utf-8",
            partial_reason="the text passed the size ceiling; the rest was not saved" if partial else None,
            requeried_at=now if existing else None,
        )
        try:
            self._publish(thread, art, epoch, job, existing)
        except BlobUnavailable:  # not in the store: this host's copy goes too (no half artifact)
            path.unlink(missing_ok=True)
            raise
        return art

    async def restore_async(self, thread: Thread, art: Artifact, result: ToolResult,
                            progress: Callable[..., None] | None = None) -> Artifact | None:
        """`restore` in a worker thread; cancelling the caller stops the write (the artifact
        keeps its previous metadata and no temp file remains)."""
        job = self.job(progress)
        interrupt = result.table.interrupt if result.table is not None else None
        writer = await self._writer(art.origin.user, result, progress)
        return await run_job(job, self.restore, thread, art, result, job, interrupt=interrupt, done=writer.release,
                             executor=self.writers.executor)

    def restore(self, thread: Thread, art: Artifact, result: ToolResult,
                job: WriteJob | None = None) -> Artifact | None:
        """Write the data of a re-run of `art`'s origin call under the same id (None: no rows).
        When the format changed (text <-> table), the old data file goes."""
        table = result_table(result)
        try:
            if table is not None:
                new, _, _ = self.write_table(thread, art.id, table, art.origin, art.kind, existing=art, job=job)
            else:
                new = self.write_text(thread, art.id, result.content, art.origin, art.kind, existing=art, job=job)
        finally:
            if table is not None:
                table.close()
        if new is not None and new.file != art.file:
            old = self.store.data_path(thread, art)
            if old.exists():
                old.unlink()
        return new

    def _created(self, art: Artifact) -> None:
        OFFLOAD_ARTIFACTS.labels(art.format).inc()  # /metrics (telemetry.py)
        OFFLOAD_BYTES.labels(art.format).inc(art.bytes or 0)
        OFFLOAD_ROWS.inc(art.rows or 0)
        if self.on_created is not None:
            try:
                self.on_created(art)
            except Exception:
                log.exception("quota enforcement after %s failed", art.id)


def _with(result: ToolResult, **facts: Any) -> ToolRecordMeta:
    """The result's meta with what the pipeline learned added (rows, artifact, truncated, ...)."""
    return msgspec.structs.replace(result.meta, **facts)
