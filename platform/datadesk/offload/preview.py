"""What the model reads instead of a large result: schema, counts, a capped preview
and a notice it cannot mistake for the full data. Always within a token budget.

The preview shrinks step by step (cell width, then rows, then columns) until
the whole message fits `max_tokens`; the notice and the load instructions are
never cut.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

import pyarrow as pa

from datadesk.domain.artifacts import Artifact

Counter = Callable[[str], int]

# (preview rows, cell chars, preview columns, schema columns, type chars)
_STEPS = [
    (10, 200, 50, 50, 60), (10, 80, 50, 50, 40), (10, 40, 30, 50, 30), (5, 30, 20, 50, 24),
    (5, 20, 12, 40, 20), (3, 16, 8, 30, 16), (2, 12, 6, 20, 12), (1, 10, 4, 12, 10),
]


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def short_type(t: pa.DataType, max_len: int) -> str:
    text = str(t)
    if len(text) <= max_len:
        return text
    if pa.types.is_struct(t):
        return f"struct<{t.num_fields} fields>"[:max_len] if max_len >= 12 else "struct"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list<…>"
    if pa.types.is_map(t):
        return "map<…>"
    return text[: max_len - 1] + "…"


def cell(value: Any, cap: int) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        text = repr(value)
    elif isinstance(value, (dt.datetime, dt.date)):
        text = value.isoformat()
    elif isinstance(value, bytes):
        text = value[:cap].hex()
    else:
        text = str(value)
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n").replace("\r", "")
    return text if len(text) <= cap else text[: max(1, cap - 1)] + "…"


def table_rows(head: pa.Table, rows: int, cols: int, cap: int) -> str:
    names = head.column_names[:cols]
    more = len(head.column_names) - len(names)
    header = [cell(n, cap) for n in names] + ([f"+{more} more"] if more else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    data = head.slice(0, rows).select(names).to_pylist() if names else []
    for row in data:
        vals = [cell(row[n], cap) for n in names] + (["…"] if more else [])
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def schema_lines(schema: pa.Schema, limit: int, type_chars: int) -> str:
    fields = list(schema)[:limit]
    out = ", ".join(f"{f.name[:60]} {short_type(f.type, type_chars)}" for f in fields)
    if len(schema) > limit:
        out += f", +{len(schema) - limit} more columns"
    return out


def load_hint(art: Artifact) -> str:
    path = art.sandbox_path
    if art.format == "parquet":
        return (f"Load the full data with the python tool: `pd.read_parquet(\"{path}\")` (pandas) or "
                f"`duckdb.sql(\"SELECT ... FROM '{path}'\")`.")
    return f"Read the full text with the python tool: `open(\"{path}\").read()`."


def render_table_artifact(art: Artifact, schema: pa.Schema, head: pa.Table, source: str,
                          count: Counter, max_tokens: int, max_rows: int, max_cell: int,
                          max_cols: int) -> str:
    """The message for an offloaded table."""
    rows = art.rows or 0
    partial = ""
    if art.status == "partial" and art.partial_by == "source":
        partial = (f"\nPARTIAL (by the source): the source itself cut this result; these {rows:,} rows are NOT "
                   f"all the data. {art.source_note or art.partial_reason or ''}")
    elif art.status == "partial":
        partial = (f"\nPARTIAL: {art.partial_reason or 'the result hit the size ceiling'}; "
                   f"exactly {rows:,} rows were written.")
        if art.source_note:
            partial += f"\nThe source also cut it: {art.source_note}"
    text = ""
    for step, (p_rows, cap, p_cols, s_cols, t_chars) in enumerate(_STEPS):
        p_rows, cap, p_cols = min(p_rows, max_rows), min(cap, max_cell), min(p_cols, max_cols)
        s_cols = min(s_cols, max_cols)
        shown = min(p_rows, head.num_rows)
        text = (
            f"[Result saved as artifact {art.id}: the full data is NOT in this message.]\n"
            f"source: {source}\n"
            f"sandbox path: {art.sandbox_path}\n"
            f"rows: {rows:,} | columns: {art.columns} | file: {human_bytes(art.bytes)} Parquet{partial}\n"
            f"{source_lines(art, _META_CHARS[min(step, len(_META_CHARS) - 1)])}"
            f"schema: {schema_lines(schema, s_cols, t_chars)}\n"
            f"preview (first {shown} of {rows:,} rows; cells cut at {cap} chars):\n"
            f"{table_rows(head, p_rows, p_cols, cap)}\n"
            f"NOTICE: this is a preview of {shown} rows, NOT the full data. Do not compute totals, "
            f"averages, counts or any statistic from it. {load_hint(art)}"
        )
        if count(text) <= max_tokens:
            return text
    return text


_META_CHARS = (2_000, 1_000, 600, 400, 300, 200, 120, 80)


def source_lines(art: Artifact, max_chars: int) -> str:
    """What the source sent (its shape) and its metadata beside the rows, capped."""
    out = f"sent as: {art.shape}\n" if art.shape else ""
    if art.source_meta:
        meta = json.dumps(art.source_meta, ensure_ascii=False, default=str)
        if len(meta) > max_chars:
            meta = meta[: max(1, max_chars - 1)] + "…"
        out += f"source metadata: {meta}\n"
    return out


def render_text_artifact(art: Artifact, head: str, source: str, count: Counter, max_tokens: int) -> str:
    text = ""
    for limit in (1_500, 800, 400, 200):
        text = (
            f"[Result saved as artifact {art.id}: the full text is NOT in this message.]\n"
            f"source: {source}\n"
            f"sandbox path: {art.sandbox_path}\n"
            f"size: {art.chars:,} chars | file: {human_bytes(art.bytes)}"
            + (f"\nPARTIAL: {art.partial_reason}" if art.status == "partial" else "")
            + f"\npreview (first {min(limit, len(head)):,} chars):\n{head[:limit]}\n"
            f"NOTICE: this is the beginning only, NOT the full text. {load_hint(art)}"
        )
        if count(text) <= max_tokens:
            return text
    return text


def truncated_notice(shown: int, total: int | str, unit: str, reason: str) -> str:
    return (f"NOTICE: shown {shown:,} of {total if isinstance(total, str) else f'{total:,}'} {unit}; "
            f"the full result is NOT available here ({reason}). Do not treat this as complete: narrow "
            f"the query with filters, aggregation or LIMIT.")


def render_truncated_table(schema: pa.Schema, batches_head: list[dict[str, Any]], total: int | str,
                           reason: str, max_chars: int, count_note: str = "") -> str:
    """Head rows (as JSON lines) that fit `max_chars`, then the notice."""
    import msgspec

    enc = msgspec.json.Encoder()
    header = f"columns: {schema_lines(schema, 50, 40)}\n"
    lines: list[str] = []
    budget = max_chars - len(header) - 400
    for row in batches_head:
        line = enc.encode({k: _jsonable(v) for k, v in row.items()}).decode()
        if len(line) + 1 > budget:
            break
        budget -= len(line) + 1
        lines.append(line)
    return header + "\n".join(lines) + ("\n" if lines else "") + truncated_notice(len(lines), total, "rows", reason) + count_note


def render_truncated_text(text: str, reason: str, max_chars: int) -> str:
    head = text[: max(0, max_chars - 400)]
    return head + "\n" + truncated_notice(len(head), len(text), "chars", reason)


def render_empty(schema: pa.Schema | None, source: str) -> str:
    cols = schema_lines(schema, 50, 40) if schema is not None else "unknown"
    return f"The {source} result has 0 rows (columns: {cols}). Nothing was saved."


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, float) and v != v:
        return None
    if hasattr(v, "__float__") and not isinstance(v, (int, float, bool)):
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
