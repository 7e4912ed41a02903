"""A tabular tool result as a stream of Arrow record batches (never loaded whole)."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import pyarrow as pa


class TabularStream:
    """Batches of one tabular result, read once. Always `close()` it (or use `with`)."""

    def __init__(self, schema: pa.Schema | None, batches: Iterable[pa.RecordBatch],
                 close: Callable[[], None] | None = None) -> None:
        self.schema = schema
        self._batches = batches
        self._close = close
        self._closed = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._batches)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._close is not None:
                self._close()

    def __enter__(self) -> "TabularStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
