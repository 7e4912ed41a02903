"""ParquetSink: stream record batches into one Parquet file, safely.

Writes go to a private temp directory next to the final path and are
renamed into place on `close()`, so a reader never sees a half-written file
and a failure (including disk full) leaves nothing behind.

Batches whose schema differs from what is being written (a new column, a
type change) are first cast when that is lossless (null -> T, int -> float,
...); otherwise the sink starts a new *segment* file. On close, several
segments are unified (union of columns, `pa.unify_schemas(permissive)`,
string as the last resort) and rewritten into the final file batch by batch.
No row is ever dropped, except deliberately at the byte ceiling
(`partial=True`, with the exact number of rows kept).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from datadesk.offload.parquet.encoding import writer_options
from datadesk.offload.parquet.schema import fit_batch, merge_schemas
from datadesk.offload.parquet.segment import Segment
from datadesk.offload.readers.casts import CAST_ERRORS, cast_for_union, unify_types
from datadesk.offload.readers.columns import unique_names
from datadesk.store.tempnames import temp_prefix

__all__ = ["ParquetSink", "SinkResult"]

# A row group is written when this much Arrow data is pending (or `row_group_rows` rows): it
# bounds memory by a constant, not by the result. Large row groups encode faster (fewer,
# larger dictionaries and pages; 1M x 8 in 65,536-row groups: 0.21 s, in 16 MiB groups
# (~280k rows) 0.19 s, in 32 MiB groups 0.18 s, one group 0.17 s) and compress better; 16 MiB
# keeps the app's peak near what it was (the read-ahead holds as much again). The first
# group is small and each next one 4x as big, up to ROW_GROUP_BYTES: the writer starts after
# one batch instead of waiting for a whole group to be read.
ROW_GROUP_BYTES = 16 << 20
ROW_GROUP_FIRST_BYTES = 2 << 20
ROW_GROUP_ROWS = 1 << 20


@dataclass(frozen=True)
class SinkResult:
    """What was written: exact rows, final file size and hash, final schema."""

    rows: int
    columns: int
    bytes: int
    schema: pa.Schema
    sha256: str
    partial: bool


class ParquetSink:
    """Write batches to `final_path` with a soft `byte_ceiling` on the file size.

    Use as a context manager: an exception inside the block (or leaving it
    without `close()`) aborts and removes everything; `close()` must be
    called explicitly to publish the file.
    """

    def __init__(self, final_path: Path, byte_ceiling: int, row_group_rows: int = ROW_GROUP_ROWS,
                 compression: str = "zstd", check: Callable[[], None] | None = None) -> None:
        """`check`: called per batch (and per rewritten batch on close); it raises to stop the
        write (a cancelled call), and the sink then removes everything it wrote."""
        self.final_path = Path(final_path)
        self._check = check or _no_check
        self.byte_ceiling = int(byte_ceiling)
        self.row_group_rows = max(1, int(row_group_rows))
        self.compression = compression
        self.partial = False
        self._tmpdir: Path | None = None
        self._segments: list[Segment] = []
        self._stopped = False  # ceiling reached: later batches are ignored
        self._group_bytes = ROW_GROUP_FIRST_BYTES  # the next row group's size (grows up to the max)
        self._done = False  # closed or aborted
        # Observed Parquet/Arrow size ratio, to predict the ceiling crossing.
        self._arrow_written = 0
        self._disk_written = 0

    # ------------------------------------------------------------ public API

    @property
    def rows(self) -> int:
        """Rows accepted so far (written or buffered for the next row group)."""
        return sum(s.rows + s.pending_rows for s in self._segments)

    @property
    def bytes_written(self) -> int:
        """Bytes on disk so far (finished row groups; the progress figure)."""
        return self._disk_bytes()

    def add_schema(self, schema: pa.Schema) -> None:
        """Declare the schema up front (e.g. DuckDB's, known even for 0 rows)."""
        self._check_open()
        if any(s.rows or s.pending_rows for s in self._segments):
            raise ValueError("add_schema() must come before the first rows")
        self._segments = [Segment(_clean_schema(schema), hashed=True)]

    def add(self, batch: pa.RecordBatch) -> bool:
        """Write one batch. False once the byte ceiling is reached (then ignored)."""
        self._check_open()
        if self._stopped:
            return False
        try:
            self._check()
            batch = _clean_batch(batch)
            seg = self._segments[-1] if self._segments else None
            fitted = fit_batch(batch, seg.schema) if seg is not None else None
            if seg is None:
                seg = self._new_segment(_clean_schema(batch.schema))
                fitted = fit_batch(batch, seg.schema)
            elif fitted is None:
                seg, fitted = self._switch_segment(seg, batch)
                if seg is None:  # flushing the old segment hit the ceiling
                    return False
            if fitted.num_rows:
                seg.pending.append(fitted)
                seg.pending_rows += fitted.num_rows
                seg.pending_bytes += fitted.nbytes
                if (seg.pending_rows >= self.row_group_rows or seg.pending_bytes >= self._group_bytes
                        or self._estimate(seg.pending_bytes) * 2 > self._budget()):
                    self._flush(seg)
            return not self._stopped
        except BaseException:
            self.abort()
            raise

    def close(self) -> SinkResult:
        """Finish the file, move it into place and describe it."""
        self._check_open()
        try:
            if not self._segments:
                raise ValueError("nothing to write: no batches and no schema")
            if not self._stopped:
                self._flush(self._segments[-1])
            for seg in self._segments:
                seg.finish()
            written = [s for s in self._segments if s.path is not None]
            tmpdir = self._ensure_tmpdir()
            hashed = None
            if len(self._segments) == 1 and written:
                out, schema = written[0].path, written[0].schema
                hashed = written[0].digest()  # hashed while it was written
            else:
                out = tmpdir / "final.parquet"
                schema = self._unify(out)
            digest, size = hashed or file_digest(out, self._check)
            rows = sum(s.rows for s in self._segments)
            self._check()  # the last moment a cancel keeps the file out of place
            os.chmod(out, 0o644)  # temp files are private; the sandbox user must read artifacts
            os.replace(out, self.final_path)
            self._cleanup()
            self._done = True
            return SinkResult(rows=rows, columns=len(schema), bytes=size, schema=schema,
                              sha256=digest, partial=self.partial)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop everything written so far (temp and part files). Idempotent."""
        for seg in self._segments:
            seg.discard()
        self._cleanup()
        self._done = True

    def __enter__(self) -> "ParquetSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()

    # -------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._done:
            raise ValueError("the sink is closed")

    def _ensure_tmpdir(self) -> Path:
        if self._tmpdir is None:
            # Same directory as the final file: the rename stays atomic.
            self._tmpdir = Path(tempfile.mkdtemp(prefix=temp_prefix(self.final_path.name), suffix=".tmp",
                                                 dir=self.final_path.parent))
        return self._tmpdir

    def _cleanup(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _new_segment(self, schema: pa.Schema) -> Segment:
        # Only a lone segment is published as it is; several are rewritten into one file.
        for old in self._segments:
            old.unhash()
        seg = Segment(schema, hashed=not self._segments)
        self._segments.append(seg)
        return seg

    def _switch_segment(self, seg: Segment, batch: pa.RecordBatch) -> tuple[Segment | None, pa.RecordBatch]:
        merged = merge_schemas(seg.schema, batch.schema)
        if merged is not None and seg.path is None:
            # Nothing on disk yet: widen the open segment in place.
            widened = [fit_batch(b, merged) for b in seg.pending]
            fitted = fit_batch(batch, merged)
            if fitted is not None and all(w is not None for w in widened):
                seg.schema, seg.pending = merged, widened
                seg.pending_bytes = sum(b.nbytes for b in widened)
                return seg, fitted
        self._flush(seg)
        if self._stopped:
            return None, batch
        seg.finish()
        fitted = fit_batch(batch, merged) if merged is not None else None
        if fitted is None:
            merged = _clean_schema(batch.schema)
            fitted = fit_batch(batch, merged)
        return self._new_segment(merged), fitted

    def _disk_bytes(self) -> int:
        return sum(s.bytes_written() for s in self._segments)

    def _footer_estimate(self) -> int:
        # Per row group and column the footer holds a column-chunk record
        # (~100-200 bytes with statistics); one more row group is coming.
        groups = sum(s.row_groups for s in self._segments) + 1
        width = max((len(s.schema) for s in self._segments), default=1)
        return 1024 + groups * width * 160

    def _budget(self) -> int:
        return self.byte_ceiling - self._disk_bytes() - self._footer_estimate()

    def _estimate(self, arrow_bytes: int) -> float:
        ratio = self._disk_written / self._arrow_written if self._arrow_written else 1.0
        return arrow_bytes * max(ratio, 0.05)

    def _flush(self, seg: Segment) -> None:
        """Write the pending rows as one row group, cutting them at the ceiling."""
        if not seg.pending:
            return
        table = pa.Table.from_batches(seg.pending, schema=seg.schema)
        seg.pending, seg.pending_rows, seg.pending_bytes = [], 0, 0
        budget = self._budget()
        if self._estimate(table.nbytes) * 2 > budget:
            # Near the ceiling: measure the real encoded size instead of guessing.
            options = seg.options(table)
            size = _encoded_size(table, self.compression, options)
            if size > budget:
                table = self._cut(table, size, budget, options)
                self._stopped = self.partial = True
        if table.num_rows == 0:
            return
        before = seg.bytes_written()
        seg.write(table, self._ensure_tmpdir(), self.compression)
        self._group_bytes = min(self._group_bytes * 4, ROW_GROUP_BYTES)
        self._arrow_written += table.nbytes
        self._disk_written += seg.bytes_written() - before

    def _cut(self, table: pa.Table, size: int, budget: int, options: dict) -> pa.Table:
        """The longest prefix of `table` whose encoded size fits `budget`."""
        n = table.num_rows
        for _ in range(12):
            if budget <= 0 or n <= 0:
                return table.slice(0, 0)
            n = min(n - 1, int(n * budget / max(size, 1) * 0.97))
            if n <= 0:
                return table.slice(0, 0)
            size = _encoded_size(table.slice(0, n), self.compression, options)
            if size <= budget:
                return table.slice(0, n)
        return table.slice(0, 0)

    def _unify(self, out: Path) -> pa.Schema:
        """Rewrite all segments into `out` under one schema; return that schema."""
        forced: set[str] = set()
        while True:
            schema = self._union_schema(forced)
            try:
                _rewrite(self._segments, schema, out, self.compression, self.row_group_rows, self._check)
                return schema
            except _CastFailed as failed:  # a value-level cast failed: text it is
                forced.add(failed.column)

    def _union_schema(self, forced: set[str]) -> pa.Schema:
        types: dict[str, list[pa.DataType]] = {}
        for seg in self._segments:
            for field in seg.schema:
                types.setdefault(field.name, []).append(field.type)
        fields = []
        for name, ts in types.items():
            fields.append(pa.field(name, pa.string() if name in forced else unify_types(ts)))
        return pa.schema(fields)


class _CastFailed(Exception):
    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


def _rewrite(segments: list[Segment], schema: pa.Schema, out: Path, compression: str, batch_rows: int,
             check: Callable[[], None]) -> None:
    with pq.ParquetWriter(out, schema, compression=compression,
                          **writer_options(schema)) as writer:
        for seg in segments:
            for batch in seg.read(batch_rows):
                check()
                arrays = []
                for field in schema:
                    if field.name not in batch.schema.names:
                        arrays.append(pa.nulls(batch.num_rows, field.type))
                        continue
                    col = batch.column(field.name)
                    try:
                        arrays.append(cast_for_union(col, field.type))
                    except CAST_ERRORS:
                        raise _CastFailed(field.name) from None
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))


def _encoded_size(table: pa.Table, compression: str, options: dict) -> int:
    """Bytes `table` takes as one Parquet row group (footer excluded), written with `options`."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, compression=compression, **options) as writer:
        writer.write_table(table, row_group_size=max(table.num_rows, 1))
    buf = sink.getvalue()
    footer = int.from_bytes(buf[-8:-4].to_pybytes(), "little")
    return buf.size - footer - 12


def file_digest(path: Path, check: Callable[[], None] | None = None) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in 1 MB chunks (`check` every 64 MB)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
            if check is not None and not size % (64 << 20):
                check()
    return h.hexdigest(), size


def _no_check() -> None:
    return None


def _clean_schema(schema: pa.Schema) -> pa.Schema:
    """Unique names, nullable fields (missing columns are filled with nulls),
    no metadata (it may describe a layout the unified file no longer has)."""
    names = unique_names(schema.names)
    return pa.schema([pa.field(n, f.type) for f, n in zip(schema, names)])


def _clean_batch(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else \
            pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in batch.schema], schema=batch.schema)
    names = unique_names(batch.schema.names)
    if names != batch.schema.names:  # duplicate names (e.g. SELECT 1 a, 2 a)
        batch = pa.RecordBatch.from_arrays(batch.columns, names=names)
    return batch
