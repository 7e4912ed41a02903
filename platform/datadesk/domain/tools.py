"""Tool records: what a tool is (`ToolSpec`), what a call returns (`ToolResult`, a large table
as a `TabularStream`) and the failure a tool reports to the model (`ToolError`).

Plain types shared by the registry (tools/), the offload pipeline (offload/) and the turn loop
(chat/), so none of those has to import another to speak about a tool call.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import msgspec
import pyarrow as pa

from datadesk.domain.records import ToolRecordMeta
from datadesk.domain.sources import SourceHints


class ToolError(Exception):
    """A failure the model can read and act on (bad arguments, bad SQL, refused statement)."""


class ToolSpec(msgspec.Struct, frozen=True):
    """What the registry knows about a tool.

    - `parameters`: the JSON schema of its arguments, as sent to the model (built-in tools
      derive it from their arguments Struct; MCP tools keep their server's schema).
    - `permission`: required user permission (one of tools.registry.PERMISSIONS) or None.
    - `offloadable`: its raw result may be offloaded to an artifact when large
      (False for first-party tools with an explicit return contract).
    - `read_only`: safe to re-run (used by re-query of expired artifacts).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    permission: str | None = None
    offloadable: bool = True
    read_only: bool = False
    source: str = "builtin"  # builtin | mcp:<server>
    workspace: str | None = None  # None: every workspace; else only that workspace's requests
    annotations: dict[str, Any] | None = None  # e.g. MCP tool annotations (readOnlyHint, ...)
    # a tool that bounds its own calls says how long one may take (python: its execution deadline,
    # the interrupt and a kernel restart); the turn's tool timeout is raised to it
    time_limit_s: float | None = None

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class TabularStream:
    """A tabular result as Arrow record batches, read once and never loaded whole.
    Always `close()` it (or use `with`): it may hold a database cursor."""

    def __init__(self, schema: pa.Schema | None, batches: Iterable[pa.RecordBatch],
                 close: Callable[[], None] | None = None, interrupt: Callable[[], None] | None = None) -> None:
        self.schema = schema
        self._batches = batches
        self._close = close
        self._interrupt = interrupt  # safe from any thread: stops a blocked read (a cancelled call)
        self._closed = False
        self._after_close: list[Callable[[], None]] = []

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._batches)

    def interrupt(self) -> None:
        """Stop the source from another thread (the reader then raises); a no-op without a hook."""
        if self._interrupt is not None and not self._closed:
            self._interrupt()

    def also_on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` after the source is closed (e.g. release an admission slot); at once if it is."""
        if self._closed:
            fn()
        else:
            self._after_close.append(fn)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                if self._close is not None:
                    self._close()
            finally:
                for fn in self._after_close:
                    fn()

    def __enter__(self) -> "TabularStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ToolResult(msgspec.Struct):
    """The raw outcome of a tool call. `content` is what the model reads.

    - `data`: a structured form for callers (small results only);
    - `meta`: what the tool record keeps about the call (rows, artifacts, ...);
    - `table`: a large tabular result, streamed: the offload pipeline writes it to an
      artifact (or counts it for the truncated form) and replaces `content`.
    """

    content: str
    is_error: bool = False
    data: Any = None
    meta: ToolRecordMeta = msgspec.field(default_factory=ToolRecordMeta)
    table: TabularStream | None = None
    source: SourceHints | None = None  # what the source said beside the content (offload/source_cut.py)
