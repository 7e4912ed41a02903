"""MCP tool results as `ToolResult`s: what the model reads and what the offload gets (issues 17, 26).

- `ResultReader.convert`: a result the SDK decoded: texts joined, images saved as artifacts,
  audio and resources named, `structuredContent` kept beside the text for the offload's shape
  detection with what the tool's schemas say (`shapes.source_hints`).
- `ResultReader.convert_spooled`: an answer spooled to disk (`spool.py`). Its large text is
  unescaped into a temp file and the offload reads it from there (`ToolResult.table`): a JSON
  text straight from the memory-mapped file by the JSON readers of `offload.readers`
  (`json_buffer_table`: an array of objects in pieces, never one Python string), any other
  shape as text by `parse_text`, as a result held in memory would be. The answer's files go
  when the offload closes the stream (or at once, when the answer is no table).
- `error_text`: a result whose text is an error although the server did not set `isError`
  (`Error: ...`, `no such column`, `Catalog Error: ...`, a traceback, `{"error": ...}`).
  Conservative: only the start of the text counts, or a phrase no table would hold anywhere in
  a short text that does not start like a table; a table with "error" in a cell stays a table.

Every error result names its server: "<tool> failed: the MCP server <name> answered with an error:
<reason>".
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import mmap
import re
import weakref
from typing import Any, Callable, Iterator

import msgspec
import pyarrow as pa

from datadesk.domain.records import ToolRecordMeta
from datadesk.domain.sources import SourceHints
from datadesk.domain.tools import ToolResult
from datadesk.tools.context import ToolContext
from datadesk.tools.mcp.config import _describe
from datadesk.tools.mcp.shapes import source_hints
from datadesk.tools.mcp.spool import SpooledAnswer, dropping

log = logging.getLogger(__name__)

_HEAD_BYTES = 64 * 1024  # of a spooled text: read to tell an error, and shown for one
_SHOWN_ERROR = 2_000  # characters of an error text the model gets
_NO_MESSAGE = "the tool reported an error without a message"

# -- an error given as ordinary text ------------------------------------------------------------
_DUCKDB = ("Catalog|Binder|Parser|Conversion|Invalid Input|Constraint|IO|Out of Range|Not implemented|"
           "Permission|Serialization|Transaction|Internal|Dependency|Syntax|Sequence|Interrupt|HTTP|"
           "Connection|Fatal|Missing Extension|Invalid Configuration|Autoload|Execution|Invalid Type|"
           "Mismatch Type|Parameter Not Resolved|Parameter Not Allowed|Not Found")
_START = re.compile(r"""(?:
      (?:(?:database|sql|query|db|execution|runtime|server|internal|tool|connection|validation)\s+)?
      error(?:\s*\[[^\]\n]{0,40}\])?\s*[:!]                        # Error: / ERROR: / Database error: / Error [42]:
    | Error\s+(?:executing|calling|running|while|during|processing|occurred|querying|reading|connecting)\b
    | (?:an?\s+)?(?:unexpected\s+)?error\s+(?:has\s+)?occurred\b
    | Traceback\s\(most\srecent\scall\slast\)
    | (?:""" + _DUCKDB + r""")\sError:                                # DuckDB: Catalog Error: ...
    | (?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|\(|\s+\()    # OperationalError: ..., duckdb.X(
    | no\ssuch\s(?:column|table|function|module)\b                    # SQLite
    | syntax\serror\sat\sor\snear\b                                   # PostgreSQL
    | relation\s"[^"\n]{0,200}"\sdoes\snot\sexist
    | \d{4}\s\([0-9A-Z]{5}\):\s                                        # MySQL: 1054 (42S22): ...
    | \(\d{4},\s*["']                                                  # PyMySQL: (1054, "Unknown column ...")
    | unknown\scolumn\b
    | permission\sdenied\b
    | (?:query|execution|request|tool\scall)\sfailed\b
    | failed\sto\s(?:execute|run|connect|query|call)\b
)""", re.X | re.I)
_ANYWHERE = re.compile(r"""Traceback\s\(most\srecent\scall\slast\)
    | syntax\serror\sat\sor\snear\b
    | \bno\ssuch\s(?:column|table):
    | \b(?:""" + _DUCKDB + r""")\sError:\s
    | \b(?:sqlite3|psycopg2?|pymysql|MySQLdb|duckdb)(?:\.\w+)*\.\w*(?:Error|Exception)\b
    | \b(?:OperationalError|ProgrammingError|IntegrityError|DatabaseError|InterfaceError)\b
""", re.X)
_SHORT = 4_000
_TABLE_START = ("[", "{", "|", "+-", "<", "╭", "┌", "╔")
_ROW_KEYS = {"rows", "data", "results", "items", "records", "columns", "values"}


def error_text(text: str) -> str | None:
    """The reason when `text` is an error although not flagged as one, else None."""
    body = text.lstrip("\ufeff \t\r\n")
    if not body:
        return None
    if body[:1] == "{" and len(body) <= 16_384:
        return _json_error(body)
    if _START.match(body[:400]):
        return _shown(body)
    if len(body) <= _SHORT and not body.startswith(_TABLE_START) and _ANYWHERE.search(body):
        return _shown(body)
    return None


def _json_error(body: str) -> str | None:
    """`{"error": "..."}`, `{"status": "error", "message": ...}`, `{"success": false, ...}`."""
    try:
        obj = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or _ROW_KEYS & {str(k).lower() for k in obj}:
        return None
    err = obj.get("error") or obj.get("errors")
    flagged = (str(obj.get("status", "")).lower() in ("error", "failed", "failure") or obj.get("success") is False
               or obj.get("ok") is False or obj.get("isError") is True)
    if not err and not flagged:
        return None
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or json.dumps(err, ensure_ascii=False)
    reason = err or obj.get("message") or obj.get("detail") or obj.get("reason") or body
    return _shown(reason if isinstance(reason, str) else json.dumps(reason, ensure_ascii=False, default=str))


def _shown(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SHOWN_ERROR else text[:_SHOWN_ERROR] + " …"


def error_result(tool: str, server: str, reason: str, meta: ToolRecordMeta) -> ToolResult:
    """The error the model reads, in the registry's form for a ToolError ("<tool> failed: ...")."""
    return ToolResult(content=f"{tool} failed: the MCP server {server} answered with an error: {reason}",
                      is_error=True, meta=meta)


# -- a JSON text read from a buffer ----------------------------------------------------------------
_SQL = {"date": "DATE", "date-time": "TIMESTAMP WITH TIME ZONE", "integer": "BIGINT", "number": "DOUBLE",
        "boolean": "BOOLEAN"}


def json_buffer_table(data: Any, hints: SourceHints | None) -> Any:
    """The table of a JSON text held in a buffer (a memory-mapped file), read by the JSON readers
    of `offload.readers` from the buffer itself; None when it is no tabular JSON."""
    from datadesk.offload.readers import json_rows
    from datadesk.offload.readers.base import ShapedStream, SourceFacts
    from datadesk.offload.readers.errors import TabularParseError
    from datadesk.offload.readers.json.locate import locate

    try:
        found = locate(data)
        batches = json_rows(found)
        first = next(batches, None)
    except TabularParseError:
        return None
    facts = SourceFacts(found.shape, envelope=found.envelope, hints=hints)
    if first is None:
        return ShapedStream(None, iter(()), facts)
    if first.num_columns == 0:
        return None
    formats = hints.column_formats if hints is not None else None
    out = _formatted(first, batches, formats)
    return ShapedStream(first.schema, dropping(out, data) if isinstance(data, mmap.mmap) else out, facts)


def _formatted(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch],
               formats: dict[str, str] | None) -> Iterator[pa.RecordBatch]:
    """The batches with the output schema's column formats applied (as `parse_text` does)."""
    from datadesk.offload.readers.casts import sql_cast

    for batch in _chain(first, rest):
        if formats:
            arrays = [sql_cast(col, _SQL[formats[name]]) if formats.get(name) in _SQL else col
                      for name, col in zip(batch.schema.names, batch.columns)]
            batch = pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
        yield batch


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


# -- the reader of results ---------------------------------------------------------------------------
class ResultReader:
    """Turns one server's tool results into ToolResults; saves images through `save_image`."""

    def __init__(self, save_image: Callable[[ToolContext, bytes, str], str] | None) -> None:
        self.save_image = save_image

    def convert(self, server: str, info: Any, result: Any, ctx: ToolContext) -> ToolResult:
        """A result the SDK decoded (`info`: the tool's real name, spec and output schema)."""
        images: list[str] = []
        parts = [self.item_text(server, item, ctx, images) for item in getattr(result, "content", None) or []]
        structured = getattr(result, "structured_content", None)
        if not [p for p in parts if p] and structured is not None:
            parts.append(json.dumps(structured, ensure_ascii=False, default=str))
        content = "\n".join(parts)
        is_error = bool(getattr(result, "is_error", False))
        meta = ToolRecordMeta(mcp_server=server, mcp_tool=info.real, images=images or None)
        if is_error:
            return error_result(info.spec.name, server, _shown(content) or _NO_MESSAGE, meta)
        reason = error_text(content) if not images else None
        if reason is not None:
            return error_result(info.spec.name, server, reason, meta)
        if not content:
            content = "(no output)"
        data = None
        if structured is not None:
            try:
                if len(json.dumps(structured, default=str)) <= 65536:
                    data = structured
            except (TypeError, ValueError):
                data = None
        # structuredContent (with the outputSchema's formats) is preferred over the text by the
        # offload pipeline's shape detection; the input schema tells its paging and row caps.
        hints = source_hints(info.spec.parameters, info.output_schema, structured, info.spec.description)
        return ToolResult(content=content, data=data, meta=meta, source=hints)

    def item_text(self, server: str, item: Any, ctx: ToolContext, images: list[str]) -> str:
        import mcp.types as mt

        if isinstance(item, mt.TextContent):
            return item.text
        if isinstance(item, mt.ImageContent):
            return self._image(server, item, ctx, images)
        if isinstance(item, mt.AudioContent):
            return f"(audio content, {item.mime_type}, not shown)"
        if isinstance(item, mt.ResourceLink):
            return f"resource: {item.uri}" + (f" ({item.name})" if item.name else "")
        if isinstance(item, mt.EmbeddedResource):
            res = item.resource
            if isinstance(res, mt.TextResourceContents):
                return res.text
            size = len(getattr(res, "blob", "") or "") * 3 // 4
            return f"(binary resource {res.uri}, about {size:,} bytes, not shown)"
        return f"({getattr(item, 'type', 'unknown')} content, not shown)"

    def _image(self, server: str, item: Any, ctx: ToolContext, images: list[str]) -> str:
        mime = (item.mime_type or "application/octet-stream").lower()
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            return f"(an image from {server} could not be decoded)"
        if self.save_image is None:
            return f"(an image was returned: {mime}, {len(data):,} bytes; images are not kept here)"
        try:
            aid = self.save_image(ctx, data, mime)
        except Exception as exc:  # noqa: BLE001 - quota, disk, cleared thread: a note, not a failure
            log.warning("MCP server %s: image not saved: %s", server, _describe(exc))
            return f"(an image was returned but not saved: {_describe(exc)})"
        images.append(aid)
        return f"image: artifact {aid} ({len(data):,} bytes {mime}), shown to the user in the chat"

    # -- an answer spooled to disk (in a worker thread) ---------------------------------------------
    def convert_spooled(self, server: str, info: Any, answer: SpooledAnswer, ctx: ToolContext) -> ToolResult:
        """The ToolResult of a spooled answer: a file-backed table when it is one (its files go
        when the stream is closed), else its text; an error result for an error."""
        import mcp.types as mt

        kept = False
        try:
            images: list[str] = []
            parts: list[str | None] = []
            texts = []
            adapter = _content_adapter()
            for kind, item in answer.items:
                if kind == "text":
                    texts.append(answer.text_file(item))
                    parts.append(None)
                else:
                    try:
                        block = adapter.validate_python(item)
                    except ValueError:
                        block = mt.TextContent(type="text", text=f"({item.get('type', 'unknown')} content, not shown)")
                    parts.append(self.item_text(server, block, ctx, images))
            meta = ToolRecordMeta(mcp_server=server, mcp_tool=info.real, images=images or None)
            head = _read_head(texts[0][0]) if texts else "\n".join(p for p in parts if p)
            if answer.is_error:
                return error_result(info.spec.name, server, _shown(head) or _NO_MESSAGE, meta)
            reason = error_text(head[:_SHORT + 1] if len(head) > _SHORT else head)
            if reason is not None:
                return error_result(info.spec.name, server, reason, meta)
            structured = answer.structured
            hints = source_hints(info.spec.parameters, info.output_schema, structured, info.spec.description)
            text: str | None = None
            sources = ([answer.structured_file()] if answer.structured_raw is not None else []) + \
                      [path for path, _ in texts[:1]]
            for path in sources:
                table, text = self._file_table(answer, path, hints)
                if table is not None:
                    table.also_on_close(answer.release)
                    weakref.finalize(table, answer.release)  # a result dropped unread: its files go too
                    kept = True
                    shape = getattr(getattr(table, "facts", None), "shape", "a table")
                    return ToolResult(content=f"(an answer of {answer.size:,} bytes from the MCP server {server}, "
                                              f"spooled to disk: {shape})", meta=meta, table=table, source=hints)
            # no table: its text, read once (the first large text may be read already)
            bodies = iter([text if text is not None else _read_text(texts[0][0])] +
                          [_read_text(path) for path, _ in texts[1:]]) if texts else iter(())
            body = "\n".join(p if p is not None else next(bodies) for p in parts if p is None or p)
            small = structured is not None and len(json.dumps(structured, default=str)) <= 65536
            return ToolResult(content=body or "(no output)", meta=meta, source=hints,
                              data=structured if small else None)
        finally:
            if not kept:
                answer.release()

    @staticmethod
    def _file_table(answer: SpooledAnswer, path: Any, hints: SourceHints | None) -> tuple[Any, str | None]:
        """(the table of one spooled file, or None; its text when it was read as text)."""
        from datadesk.offload.readers import parse_text
        from datadesk.offload.readers.sniff import looks_like_repr

        mm = answer.mapped(path)
        if mm is None:
            return None, ""
        start = bytes(mm[:4096]).lstrip(b"\xef\xbb\xbf \t\r\n")
        if start[:1] in (b"[", b"{") and not looks_like_repr(start.decode("utf-8", "ignore")):
            table = json_buffer_table(mm, hints)
            if table is not None:
                return table, None
        text = mm[:].decode("utf-8", "replace")
        return parse_text(text, hints), text


_ADAPTER: Any = None


def _content_adapter() -> Any:
    global _ADAPTER
    if _ADAPTER is None:
        import mcp.types as mt
        from pydantic import TypeAdapter

        _ADAPTER = TypeAdapter(mt.ContentBlock)
    return _ADAPTER


def _read_head(path: Any) -> str:
    with open(path, "rb") as fh:
        return fh.read(_HEAD_BYTES).decode("utf-8", "ignore")


def _read_text(path: Any) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")
