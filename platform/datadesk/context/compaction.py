"""Micro-compaction of tool results, on a copy (the log on disk is never touched).

- Results of the last `recent_turns` user turns keep up to `recent_result_chars`.
- Read-type tools (`read_tool_result`, `load_skill`) stay whole-ish for
  `read_tool_turns` turns: the model is working from them.
- Older results become a stub that keeps the meaning: tool and short
  arguments, ok/error with the error's first line, rows, the artifact id with
  its current status, the first `stub_head_chars` characters, and how to page
  the original back: `read_tool_result("<call_id>")`.

Expired artifacts are marked wherever the model sees them: a result (full, capped or
stub) that names an artifact whose data is gone - its own offloaded result, or a
`/data/<aid>.<ext>` path in its text or its call's arguments - ends with `expired_mark`, which names
`requery_artifact("<aid>")`; an upload announced in a user message says it too.
"""

from __future__ import annotations

import re
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


GONE = ("expired", "deleted")
_DATA_PATH = re.compile(r"/data/([A-Za-z0-9_-]{1,64})\.(?:parquet|txt|csv|json|png|jpe?g|gif|webp)\b")


def expired_mark(aid: str, status: str, from_tool: bool = True) -> str:
    """What the model is told in the window about an artifact whose data is gone."""
    if status == "deleted":
        return f"[artifact {aid} was deleted: its data is gone; ask the user before using it]"
    if from_tool:
        return (f"[artifact {aid} has expired: its data is no longer in /data; "
                f"requery_artifact(\"{aid}\") restores it by re-running the call]")
    return f"[artifact {aid} has expired: its data is no longer in /data; ask the user to upload it again]"


def named_artifacts(rec: Record, arguments: str = "") -> list[str]:
    """Artifact ids a tool result names: its own offloaded result, then `/data/<aid>.` paths
    in its text or in the arguments of its call (python code reading the file)."""
    meta = rec.meta or {}
    art = meta.get("artifact") if isinstance(meta.get("artifact"), dict) else None
    ids = [art["id"]] if art and isinstance(art.get("id"), str) else []
    for text in (rec.content, arguments):
        if "/data/" in text:
            ids.extend(_DATA_PATH.findall(text))
    return list(dict.fromkeys(ids))


def gone_marks(rec: Record, arguments: str, artifact_status: Callable[[str], str | None]) -> str:
    """The expiry marks of the artifacts `rec` (or its call) names ("" when all are there)."""
    marks = []
    for aid in named_artifacts(rec, arguments):
        status = artifact_status(aid)
        if status in GONE:
            marks.append(expired_mark(aid, status))
    return "\n" + "\n".join(marks) if marks else ""


def render_tool_result(rec: Record, form: Form, arguments: str, s: ContextSettings,
                       artifact_status: Callable[[str], str | None], marks: str = "") -> str:
    """The tool message content of `rec` in `form`, ending with `marks` (`gone_marks`)."""
    content = rec.content
    if form == "full":
        return content + marks
    if form == "capped":
        keep = s.recent_result_chars
        return (content[:keep] + f"\n[… {len(content) - keep:,} more chars: "
                f"read_tool_result(\"{rec.tool_call_id}\", offset={keep}) pages the rest]" + marks)
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
            + f"\nfull result: read_tool_result(\"{rec.tool_call_id}\")" + marks)
