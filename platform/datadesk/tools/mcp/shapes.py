"""What an MCP tool's schemas say about its tabular results (issue 17): `SourceHints` for
the offload pipeline's shape detection (`offload/source_cut.py`).

- `structuredContent` is preferred over the text (the pipeline reads it first);
- the tool's `outputSchema` gives column formats (`date`, `date-time`, `integer`, ...)
  of the row objects it describes;
- its input schema names the paging arguments (cursor, offset, page token) and the row
  caps (`limit` with its documented default or maximum), so a result the source cut is
  recognised and the model is told which argument gets the rest.
"""

from __future__ import annotations

import re
from typing import Any

from datadesk.domain.sources import SourceHints

_PAGING = ("cursor", "next_cursor", "page_token", "pagetoken", "next_token", "offset", "page", "after", "start",
           "skip", "continuation_token", "scroll_id")
_CAPS = ("limit", "max_rows", "maxrows", "max_results", "maxresults", "row_limit", "top", "page_size", "pagesize",
         "per_page", "perpage", "n_rows", "nrows", "max_records", "count", "size")
_FORMATS = ("date", "date-time", "integer", "number", "boolean")


def _props(schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _key(name: str) -> str:
    return name.replace("-", "_").lower()


def input_hints(schema: Any) -> tuple[list[str], dict[str, int]]:
    """(paging argument names, {cap argument: documented default or maximum})."""
    paging, caps = [], {}
    for name, prop in _props(schema).items():
        key = _key(str(name))
        if key in _PAGING:
            paging.append(name)
        elif key in _CAPS and isinstance(prop, dict):
            for field in ("default", "maximum"):
                value = prop.get(field)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    caps[name] = value
                    break
    return paging, caps


def column_formats(schema: Any, depth: int = 0) -> dict[str, str] | None:
    """Column -> format/type of the row objects an output schema describes (None: none)."""
    if not isinstance(schema, dict) or depth > 3:
        return None
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, dict) and _props(items):
        out = {}
        for name, prop in _props(items).items():
            if isinstance(prop, dict):
                fmt = prop.get("format") or prop.get("type")
                if isinstance(fmt, str) and fmt in _FORMATS:
                    out[str(name)] = fmt
        return out or None
    for prop in _props(schema).values():
        found = column_formats(prop, depth + 1)
        if found:
            return found
    return None


_DESCRIBED_CAP = re.compile(r"(?:at most|up to|a maximum of|maximum of|max(?:imum)?|limited to|capped at)\s+"
                            r"(\d[\d,]*)\s+(?:rows|results|records|items|entries)", re.I)


def described_cap(description: str | None) -> int | None:
    """A row cap the tool's description documents ("returns at most 1,000 rows")."""
    m = _DESCRIBED_CAP.search(description or "")
    return int(m.group(1).replace(",", "")) if m else None


def source_hints(input_schema: Any, output_schema: Any, structured: Any,
                 description: str | None = None) -> SourceHints | None:
    """The hints for one result of a tool (None when there is nothing to say)."""
    paging, caps = input_hints(input_schema)
    cap = described_cap(description)
    if cap:
        caps.setdefault("(its description)", cap)
    formats = column_formats(output_schema)
    if structured is None and not paging and not caps and not formats:
        return None
    return SourceHints(structured=structured, column_formats=formats, paging=paging or None, caps=caps or None)
