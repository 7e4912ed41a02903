"""Which question produced an artifact: the grid's title (issue 32) is the analyst's own words,
not an artifact id.

An artifact a tool call made (a query, a python run) records the call's id (`origin.call_id`).
The call sits in an assistant record of the thread's log; the question is the nearest user
message before it. The log is read from its end and the walk stops after SCAN_RECORDS records,
so a very long thread costs a bounded read (the title then falls back to the artifact's name).
"""

from __future__ import annotations

from datadesk.domain.artifacts import Artifact
from datadesk.store.threads import Thread

SCAN_RECORDS = 5_000
QUESTION_CHARS = 300


def artifact_question(thread: Thread, art: Artifact) -> str | None:
    """The user message that led to `art`, on one line and at most QUESTION_CHARS long; None for
    uploads, for a call the log no longer holds, or one past SCAN_RECORDS records back."""
    call_id = art.origin.call_id
    if art.origin.source == "upload" or not call_id:
        return None
    found_call = False
    for n, rec in enumerate(thread.newest_first()):
        if n >= SCAN_RECORDS:
            return None
        if not found_call:
            found_call = rec.role == "assistant" and any(c.id == call_id for c in rec.tool_calls or ())
        elif rec.role == "user" and rec.content.strip():
            text = " ".join(rec.content.split())
            return text if len(text) <= QUESTION_CHARS else text[:QUESTION_CHARS - 1] + "…"
    return None
