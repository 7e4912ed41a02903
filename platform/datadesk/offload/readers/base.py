"""What every reader shares: the facts found beside the rows, the stream they come in, a table
of a file of several (`FileTable`), and where a reader hands what it refuses part way (`Rest`,
wired by `readers/__init__.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import pyarrow as pa

from datadesk.domain.sources import SourceHints
from datadesk.domain.tools import TabularStream


@dataclass
class SourceFacts:
    """What came with the rows: the shape, the envelope's other keys, prose around a table (a
    reader may add to it while it reads: the trailer after vertical records, the text around an
    HTML table), and the row count the source stated beside them (None: read from the prose by
    `source_cut`, which judges all of it once the rows are read)."""

    shape: str
    envelope: dict[str, Any] = field(default_factory=dict)
    prose: list[str] = field(default_factory=list)
    hints: SourceHints | None = None
    stated_rows: int | None = None
    reading: dict[str, Any] | None = None  # how a file was read (CSV dialect, sheet): the card, a re-import


class ShapedStream(TabularStream):
    """A tabular stream that knows its shape and what its source said beside the rows."""

    def __init__(self, schema: pa.Schema | None, batches: Iterator[pa.RecordBatch], facts: SourceFacts) -> None:
        super().__init__(schema, batches)
        self.facts = facts


@dataclass
class FileTable:
    """One table of a file (`readers.file_tables`): `name` (a workbook's sheet; None for a file
    of one table) and its stream, or why it was skipped (`skipped`: "empty", "a chart ...")."""

    name: str | None
    stream: TabularStream | None = None
    skipped: str | None = None


class Rest(Protocol):
    """Where a reader that took its input hands what it refuses part way (a later piece and
    everything after it), so that no reader imports another: built by the runner of
    `readers/__init__.py` from `ORDER` for the attempt being read."""

    def again(self, source: Any) -> Iterator[pa.RecordBatch]:
        """`source` read by this attempt again, from its first reader."""

    def exact(self, source: Any) -> Iterator[pa.RecordBatch]:
        """`source` read by this attempt's exact reader."""

    def json(self, found: Any) -> Iterator[pa.RecordBatch]:
        """Rows located in JSON text (`json.locate.JsonRows`: a Python repr rewritten as JSON)
        read by the JSON attempt's readers."""
