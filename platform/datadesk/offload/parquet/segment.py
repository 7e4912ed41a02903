"""One part file of the Parquet writer: a fixed schema, the rows waiting for a row group."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from datadesk.offload.parquet.encoding import writer_options
from datadesk.offload.parquet.tail_hash import TailHasher


class Segment:
    """One part file with a fixed schema, plus rows waiting for a row group."""

    def __init__(self, schema: pa.Schema, hashed: bool = False) -> None:
        """`hashed`: hash the part file while it is written (`digest()`), for a segment that
        becomes the published file as it is."""
        self.schema = schema
        self.hashed = hashed
        self._hasher: TailHasher | None = None
        self._options: dict | None = None
        self.path: Path | None = None
        self.rows = 0
        self.row_groups = 0
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self._file: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._size = 0

    def bytes_written(self) -> int:
        # The file position after a row group is complete = bytes on disk.
        return self._file.tell() if self._file is not None else self._size

    def write(self, table: pa.Table, tmpdir: Path, compression: str) -> None:
        """Append `table` as one row group (opens the part file on first use)."""
        if self._writer is None:
            fd, name = tempfile.mkstemp(prefix="part-", suffix=".parquet", dir=tmpdir)
            os.close(fd)
            self.path = Path(name)
            self._file = pa.OSFile(name, "wb")
            self._writer = pq.ParquetWriter(self._file, self.schema, compression=compression,
                                            **self.options(table))
            if self.hashed:
                self._hasher = TailHasher(self.path)
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows += table.num_rows
        self.row_groups += 1
        if self._hasher is not None:
            self._hasher.advance(self._file.tell())

    def options(self, sample: pa.Table) -> dict:
        """The writer's encoding options, decided once, on the first row group (`sample`)."""
        if self._options is None:
            self._options = writer_options(self.schema, sample)
        return self._options

    def unhash(self) -> None:
        """Stop hashing (the segment will be rewritten into another file)."""
        self.hashed = False
        if self._hasher is not None:
            hasher, self._hasher = self._hasher, None
            hasher.abort()

    def digest(self) -> tuple[str, int] | None:
        """(SHA-256 hex, size) of the finished part file, when it was hashed as written."""
        if self._hasher is None or self._file is not None or self._writer is not None:
            return None
        hasher, self._hasher = self._hasher, None
        return hasher.finish(self._size)

    def finish(self) -> None:
        """Write the footer and close the part file (no-op when never opened)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
        if self._file is not None:
            f, self._file = self._file, None
            self._size = f.tell()
            f.close()

    def discard(self) -> None:
        """Close without caring about errors (the directory is removed next)."""
        for closer in (self._writer, self._file):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # disk full while writing the footer, etc.
                    pass
        self._writer = self._file = None
        self.pending = []
        self.unhash()

    def read(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        if self.path is None or self.rows == 0:
            return
        pf = pq.ParquetFile(self.path)
        try:
            yield from pf.iter_batches(batch_size=batch_rows)
        finally:
            pf.close()
