"""What one uploaded file may cost (`offload.upload_max_*`), checked while it streams."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from datadesk.offload.readers.errors import LimitExceeded


@dataclass(frozen=True)
class UploadLimits:
    """What one uploaded file may cost (the `offload.upload_max_*` settings), checked while it
    streams: unpacked (inflated) size and compression ratio of an .xlsx, rows, columns, bytes
    of one cell (a CSV record may hold 4 such cells), bytes of a text read whole (the shapes of
    a tool's text: Markdown, HTML, a Python repr, a JSON envelope ...) and wall-clock seconds."""

    unpacked_bytes: int = 512 * 1024**2
    zip_ratio: float = 200.0
    rows: int = 10_000_000
    columns: int = 4_096
    cell_bytes: int = 1024**2
    text_bytes: int = 128 * 1024**2
    seconds: float = 300.0
    memory_bytes: int = 0  # > 0: an .xlsx is parsed in a child process with this address space
    deadline: float = 0.0  # time.monotonic() past which reading stops (0: not started)
    check: Callable[[], None] | None = None  # raises when the read was cancelled

    def started(self, check: Callable[[], None] | None = None) -> "UploadLimits":
        return replace(self, deadline=time.monotonic() + self.seconds, check=check)

    def tick(self) -> None:
        """Call every few thousand rows: stops a cancelled or overlong read."""
        if self.check is not None:
            self.check()
        if self.deadline and time.monotonic() > self.deadline:
            raise LimitExceeded(f"reading the file took longer than the {self.seconds:g} s limit "
                                "(offload.upload_max_seconds); upload a smaller file or split it")

    def checked(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """`batches` with the row and column limits and the clock checked at each one."""
        rows = 0
        for batch in batches:
            self.tick()
            if batch.num_columns > self.columns:
                raise self.refuse_columns(batch.num_columns)
            rows += batch.num_rows
            if rows > self.rows:
                raise self.refuse_rows()
            yield batch

    def refuse_text(self, size: int) -> LimitExceeded:
        return LimitExceeded(f"the file is {human(size)} of text to read whole (a table drawn in text, HTML, "
                             f"a Python repr, a JSON object), more than the {human(self.text_bytes)} limit "
                             "(offload.upload_max_text_bytes); save it as CSV, Parquet or a JSON array of "
                             "objects, which are read as they stream")

    def refuse_rows(self, limit: int | None = None) -> LimitExceeded:
        if limit is not None and limit < self.rows:  # the format's own limit (Excel's grid)
            return LimitExceeded(f"the sheet has more than {limit:,} rows, the most a worksheet can hold")
        return LimitExceeded(f"the file has more than {self.rows:,} rows (offload.upload_max_rows); "
                             "split it or upload a filtered extract")

    def refuse_columns(self, n: int) -> LimitExceeded:
        return LimitExceeded(f"a row has {n:,} columns, more than the {self.columns:,} allowed "
                             "(offload.upload_max_columns)")

    def refuse_cell(self, where: str) -> LimitExceeded:
        return LimitExceeded(f"{where} is larger than the {human(self.cell_bytes)} cell limit "
                             "(offload.upload_max_cell_bytes)")


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} GiB"  # pragma: no cover
