"""Context manifests: one line per model request, saying exactly what went in (the thread's
`context` line set: `context.jsonl` in the embedded set, rows in the cluster set)."""

from __future__ import annotations

from typing import Any

import msgspec

from datadesk.store.interfaces.threads import MANIFESTS, Thread


class ContextManifest(msgspec.Struct, omit_defaults=True):
    ts: float
    turn_id: str
    step: int
    model: str
    profile: str
    rules_version: str
    budget_tokens: int
    limit_tokens: int  # the profile's window minus the reserved output
    level: float  # estimated request tokens / limit
    water: str  # ok | warn | compact
    regions: dict[str, int]  # estimated tokens per region
    first_seq: int
    last_seq: int
    included: list[list[int]]  # seq ranges [from, to] in the window
    trimmed_through_seq: int  # every record up to here is outside the window
    compacted: list[int]  # seqs of tool results shown as stubs
    capped: list[int]  # seqs of tool results cut to the recent limit
    images: list[str]  # artifact ids sent as images
    tools: list[str]
    calibration: float
    estimated_tokens: int
    estimated_raw_tokens: int
    messages: int
    dropped_orphans: int = 0
    synthetic_results: int = 0
    summary: dict[str, Any] | None = None  # {covers_through_seq, epoch} when a summary was injected
    gap_through_seq: int | None = None  # records up to here left the window uncovered by any summary
    # records up to here are past the budget: shown only because no summary covers them yet
    # (the allowance); the background summary job takes them next
    over_budget_through_seq: int = 0
    memory_facts: list[str] = msgspec.field(default_factory=list)
    # how the window differs from the previous request's: append (append-only: the previous
    # request plus the new records; only an artifact's expiry mark can change an earlier
    # message), recompacted / trimmed (a change the budget forced), images (a new image turned
    # an older one into a marker), fresh (no previous request), aged (context.append_only off)
    window_change: str | None = None
    usage: dict[str, int] | None = None  # the provider's usage, when the reply arrived
    cache_ratio: float | None = None  # cached_tokens / prompt_tokens
    error: str | None = None


def seq_ranges(seqs: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def encode_manifest(manifest: ContextManifest) -> bytes:
    return msgspec.json.encode(manifest)


def append_manifest(thread: Thread, manifest: ContextManifest, epoch: int | None = None) -> bool:
    """Append one manifest to the thread's manifests (False when cleared since `epoch`)."""
    return thread.append_line(MANIFESTS, encode_manifest(manifest), epoch)


def last_manifest(thread: Thread) -> ContextManifest | None:
    """The newest readable manifest, read from the end (not the whole history)."""
    for raw in thread.lines(MANIFESTS, newest_first=True):
        try:
            return msgspec.json.decode(raw, type=ContextManifest)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return None
