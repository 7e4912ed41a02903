"""What a tool's source says about its own result, beside the content (issue 17).

Set by the tool layer (e.g. the MCP client from `structuredContent`, `outputSchema` and the
tool's input schema) and read by the offload pipeline's shape detection (`offload/source_cut.py`).
"""

from __future__ import annotations

from typing import Any

import msgspec


class SourceHints(msgspec.Struct, omit_defaults=True):
    """- `structured`: the source's structured result (MCP `structuredContent`), preferred over the text;
    - `column_formats`: column -> JSON-schema `format`/`type` from the tool's output schema
      ("date", "date-time", "decimal", "integer", ...);
    - `paging`: the tool's arguments that page (cursor, offset, page token), by name;
    - `caps`: the tool's row-limit arguments with their documented default or maximum
      (`{"limit": 100}`): a result with exactly that many rows was cut by the source."""

    structured: Any = None
    column_formats: dict[str, str] | None = None
    paging: list[str] | None = None
    caps: dict[str, int] | None = None
