"""Micro-compaction of tool results, on a copy (the log on disk is never touched).

- Results of the last `recent_turns` user turns keep up to `recent_result_chars`.
- Read-type tools (`read_tool_result`, `load_skill`) stay whole-ish for
  `read_tool_turns` turns: the model is working from them.
- Older results become a stub that keeps the meaning: tool and short
  arguments, ok/error with the error's first line, rows, the artifact id with
  its current status, the first `stub_head_chars` characters, and how to page
  the original back: `read_tool_result("<call_id>")`.
"""

from __future__ import annotations

from typing import Callable, Literal


from datadesk.domain.records import Record, short_arguments
from datadesk.settings import ContextSettings

Form = Literal["full", "capped", "stub"]


def form_for(rec: Record, age: int, s: ContextSettings) -> Form:
    """How a tool result `age` user turns old is shown (0 = the current turn)."""
    limit = s.read_tool_turns if (rec.name or "") in s.read_tools else s.recent_turns
    if age < limit:
        return "full" if len(rec.content) <= s.recent_result_chars else "capped"
    return "stub"


def render_tool_result(rec: Record, form: Form, arguments: str, s: ContextSettings,
                       artifact_status: Callable[[str], str | None]) -> str:
    content = rec.content
    if form == "full":
        return content
    if form == "capped":
        keep = s.recent_result_chars
        return (content[:keep] + f"\n[… {len(content) - keep:,} more chars: "
                f"read_tool_result(\"{rec.tool_call_id}\", offset={keep}) pages the rest]")
    meta = rec.meta or {}
    status = {"ok": "ok", "error": "error", "cancelled": "cancelled"}[rec.status]
    if rec.status == "error":
        status += f": {content.strip().splitlines()[0][:200] if content.strip() else ''}"
    parts = [f"[compacted result of {rec.name}({short_arguments(arguments, 160)}) → {status}"]
    rows = meta.get("rows")
    art = meta.get("artifact") if isinstance(meta.get("artifact"), dict) else None
    if art:
        current = artifact_status(art.get("id", "")) or art.get("status", "unknown")
        parts.append(f"; artifact {art.get('id')} ({current}), {art.get('rows') or rows or '?'} rows, "
                     f"at {art.get('path')}")
    elif rows is not None:
        parts.append(f"; {rows} rows")
    parts.append(f"; {len(content):,} chars]")
    head = content[: s.stub_head_chars]
    return ("".join(parts) + f"\nfirst {len(head)} chars: {head}"
            + f"\nfull result: read_tool_result(\"{rec.tool_call_id}\")")
