"""Parquet files (uploads): the schema is known up front, so an empty file still has columns;
batches are read row group by row group, and a damaged file names the row where it broke."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa

from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.limits import UploadLimits

if TYPE_CHECKING:
    import pyarrow.parquet as pq


def read_file(path: Path, batch_rows: int, sheet: str | None,
              limits: UploadLimits) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The reader of a Parquet file: (its schema, its batches); past `limits`: LimitExceeded."""
    import pyarrow.parquet as pq  # here: the .xlsx child process imports this package and reads no Parquet

    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TabularParseError(f"not a readable Parquet file: {exc}") from None
    if len(schema) > limits.columns:
        raise limits.refuse_columns(len(schema))
    if pf.metadata.num_rows > limits.rows:
        raise limits.refuse_rows()
    return schema, _parquet_batches(pf, batch_rows, limits)


def _parquet_batches(pf: pq.ParquetFile, batch_rows: int, limits: UploadLimits) -> Iterator[pa.RecordBatch]:
    rows = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_rows):
            rows += batch.num_rows
            limits.tick()
            yield batch
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, TabularParseError):
            raise
        raise TabularParseError(f"the Parquet file is damaged after row {rows:,}: {exc}") from None
    finally:
        pf.close()
