"""What the model and the UI are told about an expired artifact.

Restoring one (re-running its origin call through the tool registry) is the tools
layer's: `tools/requery.py`. The data is written back by `OffloadPipeline.restore`.
"""

from __future__ import annotations

import datetime as dt

from datadesk.domain.artifacts import Artifact


def iso_time(ts: float | None) -> str | None:
    """A timestamp as ISO 8601 UTC to the second (None stays None)."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds") if ts else None


def describe_origin(art: Artifact) -> str:
    o = art.origin
    if o.source == "tool":
        return f"{o.tool}({o.arguments})"
    if o.source == "upload":
        return f"upload of {o.filename!r}"
    return "python code"


def expired_message(art: Artifact) -> str:
    """What the model is told when it refers to an artifact whose data is gone."""
    base = (f"artifact {art.id} has expired (its data was removed from the cache at "
            f"{iso_time(art.expired_at)}); it came from {describe_origin(art)}.")
    if art.origin.source == "tool":
        return base + f" Call requery_artifact(\"{art.id}\") to restore it by re-running that call."
    return base + " It cannot be re-created automatically: ask the user to upload it again."
