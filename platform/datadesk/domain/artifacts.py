"""Artifacts: full tool results, uploads and deliverables kept as files per thread.

`<aid>.json` beside the data file holds an `Artifact`. When a cached artifact
is evicted, its data file goes and the metadata stays as a tombstone
(`status="expired"`), so the model and the UI can say exactly what was there
and how to restore it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# result: a tool result (cache); upload: brought by the user (cache);
# deliverable: written by code (charts, reports): never evicted, only deleted.
ArtifactKind = Literal["result", "upload", "deliverable"]
ArtifactStatus = Literal["ready", "partial", "expired", "deleted"]
CACHE_KINDS = ("result", "upload")


class ColumnSchema(msgspec.Struct, frozen=True):
    name: str
    type: str


class ArtifactOrigin(msgspec.Struct, omit_defaults=True):
    """Where the data came from: enough to re-run the call that produced it."""

    source: Literal["tool", "upload", "python"]
    user: str
    thread: str
    workspace: str
    tool: str | None = None
    arguments: str | None = None  # raw JSON of the original call
    call_id: str | None = None
    filename: str | None = None  # uploads
    sheet: str | None = None  # the sheet of a workbook upload (each sheet is an artifact)


class Artifact(msgspec.Struct):
    id: str
    kind: ArtifactKind
    format: str  # parquet | text | csv | png | jpeg | ...
    file: str  # data file name inside the thread's artifacts/ directory
    origin: ArtifactOrigin
    created: float
    last_used: float
    status: ArtifactStatus = "ready"
    rows: int | None = None
    columns: int | None = None
    schema: list[ColumnSchema] = msgspec.field(default_factory=list)
    bytes: int = 0
    sha256: str = ""
    chars: int | None = None  # text artifacts
    media_type: str = "application/octet-stream"
    partial_reason: str | None = None
    partial_by: str | None = None  # "source": the source itself cut the result (offload/source_cut.py)
    shape: str | None = None  # what the source sent: "Python repr of a list of dicts", "Markdown table", ...
    source_note: str | None = None  # the source's own words about its result, and how to get the rest
    source_meta: dict[str, Any] | None = None  # the source's metadata beside the rows (capped)
    expired_at: float | None = None
    requeried_at: float | None = None
    # an upload: how it was read (CSV dialect, sheet layout: what was guessed or chosen), and the
    # uploaded file kept beside the data (CSV/TSV: a re-import reads it again), counted in the quotas
    reading: dict[str, Any] | None = None
    original: str | None = None
    original_bytes: int = 0
    reimported_at: float | None = None
    # a chart: its title (from the figure or the Vega-Lite spec), and for a figure the artifact
    # of its dark-theme rendering (which names the figure it is a variant of)
    title: str | None = None
    dark_variant: str | None = None
    variant_of: str | None = None

    @property
    def sandbox_path(self) -> str:
        return f"/data/{self.file}"

    @property
    def name(self) -> str | None:
        """What the analyst calls it: the uploaded file's name, with its sheet ("sales.xlsx — Q1")."""
        name = self.origin.filename
        return f"{name} — {self.origin.sheet}" if name and self.origin.sheet else name

    @property
    def stored_bytes(self) -> int:
        """Bytes on disk: the data file and the kept original of an upload (what quotas count)."""
        return self.bytes + self.original_bytes

    @property
    def is_cache(self) -> bool:
        return self.kind in CACHE_KINDS

    @property
    def available(self) -> bool:
        return self.status in ("ready", "partial")
