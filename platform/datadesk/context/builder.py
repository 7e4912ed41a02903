"""The window of a model request: the messages after the fixed parts, and the manifest.

`context.request.RequestAssembler` puts the request together (DESIGN section 5) and
hands this builder the fixed parts, in order, stable first so provider prefix caches hit:
1. system: base rules (versioned) + workspace prompt (+ skills catalog);
2. the permitted tools, in a stable order;
3. the preamble: task state, thread summary and memory block (second system
   message, or a labelled user preamble, as the model profile says); it stays
   here, before the window: the summary changes as records leave the window,
   i.e. with a trim that rewrites everything after it anyway;
this builder adds
4. the history window: whole user turns, newest first within the budget, put
   back in order; tool results micro-compacted; calls and results paired by
   id; images carried as the profile allows;
5. the current user turn (the newest unit of the window).

Append-only (`append_only`, the default): while the window from the previous
request's start fits the budget, it is that request plus the new records, every
earlier byte unchanged (a result keeps the form the previous manifest shows it
in), so provider prefix caches cover all but the newest records. A change the
budget forces is made once and large: re-compaction by age, then whole turns
dropped from the start (>= `trim_chunk_fraction` of the budget) down to
`trim_target_fraction` of it; a trim that would drop records no summary covers
waits, bytes unchanged, within the no-gap allowance. Without append-only,
results are compacted by age at every request and the window trims from the
previous start in chunks. Records are read from the tail of the log and their
token counts are cached, so a build does not cost the whole thread.
"""

from __future__ import annotations

import base64
import functools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from datadesk.context.calibration import Calibration
from datadesk.context.compaction import GONE, Form, expired_mark, form_for, gone_marks, render_tool_result
from datadesk.context.manifest import ContextManifest, last_manifest, seq_ranges
from datadesk.context.profiles import ModelProfile, profile_for
from datadesk.domain.branches import active_records
from datadesk.domain.records import CUT_OFF_KINDS, Record
from datadesk.llm.tokens import count_message
from datadesk.settings import ContextSettings
from datadesk.store.threads import Thread

from datadesk.context.rules import BASE_RULES_VERSION as RULES_VERSION
NO_RESULT = "no result recorded: the call did not complete"
CUT_OFF = "[reply cut off: the server stopped while it was being written]"  # an INTERRUPTED record
USER_STEP_NOTE = ("[The user ran this step themselves (not the assistant), from the tool card or the SQL "
                  "scratchpad; its result follows.]")
PREAMBLE_LABEL = ("[Derived from past conversations in this thread and workspace; it may be outdated. "
                  "The current message wins.]")
TOOL_IMAGES_TEXT = "images produced by the previous tool call"


class ContextTooLarge(Exception):
    """The request cannot fit the model's window: the message names the sizes."""


@dataclass
class Unit:
    """One user turn: its user record and everything after it until the next one."""

    records: list[Record]
    age: int = 0  # 0 = the current turn
    messages: list[dict[str, Any]] = field(default_factory=list)
    raw_tokens: int = 0
    compacted: list[int] = field(default_factory=list)
    capped: list[int] = field(default_factory=list)
    images: list[tuple[int, str]] = field(default_factory=list)  # (message index, artifact id)
    orphans: int = 0
    synthetic: int = 0

    @property
    def first_seq(self) -> int:
        return self.records[0].seq


@dataclass
class BuiltContext:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    manifest: ContextManifest
    profile: ModelProfile
    # records not covered by the summary would leave the window (beyond the allowance):
    # the caller should summarize through `uncovered_through` and build again
    needs_summary: bool = False
    uncovered_through: int = 0


@dataclass(frozen=True)
class Preamble:
    """The derived block after the system message: summary + memory, and what it came from."""

    text: str | None = None
    summary: dict[str, Any] | None = None  # {covers_through_seq, epoch} of the injected summary
    memory_facts: list[str] = field(default_factory=list)  # ids of the injected memory facts


@dataclass(frozen=True)
class Coverage:
    """How far the thread summary covers, for the no-gap rule (DESIGN section 8)."""

    covered_through: int = 0
    allowance: float = 0.25  # uncovered records may keep the window this much over its budget
    accept_gap: bool = False  # the summary could not be made: trim anyway, record the gap


@dataclass
class _Frame:
    """The fixed part of one request: model profile, limits, and the regions before history."""

    model: str
    profile: ModelProfile
    factor: float
    limit: int
    system_msg: dict[str, Any]
    pre_msgs: list[dict[str, Any]]
    regions_raw: dict[str, int]
    images_reserve: int
    history_budget: float
    tool_names: list[str]


@dataclass(frozen=True)
class _Shown:
    """What the previous request's window showed: its seq span and which results were stubs."""

    first: int
    last: int
    stubs: frozenset[int]

    @staticmethod
    def of(manifest: ContextManifest) -> "_Shown":
        return _Shown(manifest.first_seq, manifest.last_seq, frozenset(manifest.compacted))


class _TokenCache:
    """Token counts of rendered records: (log, seq, ts, form) -> tokens. Records never change."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._data: OrderedDict[tuple, int] = OrderedDict()

    def get(self, key: tuple, compute: Callable[[], int]) -> int:
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
            return hit
        value = compute()
        self._data[key] = value
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)
        return value


class ContextBuilder:
    """The history window of a request (items 4 and 5 of DESIGN section 5) and its manifest."""

    def __init__(self, settings: ContextSettings, count_text: Callable[[str], int], calibration: Calibration,
                 artifact_status: Callable[[Thread, str], str | None],
                 image_bytes: Callable[[Thread, str], bytes | None]) -> None:
        self.s = settings
        self.count_text = count_text
        self.calibration = calibration
        self.artifact_status = artifact_status
        self.image_bytes = image_bytes
        self.cache = _TokenCache()
        # the system prompt and tool definitions repeat from request to request: counted once each
        self._fixed_tokens = functools.lru_cache(maxsize=1024)(count_text)

    # -- tokens -----------------------------------------------------------------------
    def _msg_tokens(self, msg: dict[str, Any]) -> int:
        return count_message(msg, self.count_text)  # the one message formula (llm.tokens)

    # -- build -------------------------------------------------------------------------
    def build(self, thread: Thread, *, model: str, system_prompt: str, tools: list[dict[str, Any]],
              turn_id: str, step: int, preamble: Preamble | None = None,
              coverage: Coverage | None = None) -> BuiltContext:
        """The messages of one request and its manifest (ContextTooLarge when it cannot fit).

        `coverage` (None: summaries off): records after the summary's coverage never
        silently leave the window: they stay up to `allowance` over the budget; past that
        the result asks for a summary (`needs_summary`), unless `accept_gap`, when the
        window trims anyway and the manifest records the gap."""
        profile = profile_for(model, self.s)
        frame = self._frame(model, profile, system_prompt, tools, preamble)
        previous = last_manifest(thread)
        anchor = previous.first_seq if previous else None
        shown = _Shown.of(previous) if previous is not None and self.s.append_only else None
        load_back_to = anchor
        if coverage is not None and (anchor is None or coverage.covered_through + 1 < anchor):
            load_back_to = coverage.covered_through + 1  # uncovered turns may have to stay in the window
        units = self._load_units(thread, load_back_to, frame.history_budget, frame.factor, profile, shown)
        if shown is not None and anchor is not None:
            start, natural_start, change = self._append_only_start(units, anchor, shown, frame, thread,
                                                                   profile, coverage)
        else:
            start = self._select(units, anchor, frame.history_budget, frame.factor)
            change = "fresh" if anchor is None else "aged"
            natural_start = start  # where the budget alone would start the window
        start, needs_summary, gap_through = self._keep_uncovered(units, start, frame, coverage)
        # past the window, drop more (never the current turn) before refusing
        while start < len(units) - 1 and (self._total(units[start:], frame.regions_raw, frame.factor)
                                          + frame.images_reserve > self.s.refuse_level * frame.limit):
            start += 1
        window = units[start:]
        images = self._attach_images(window, thread, profile)
        if change == "append" and previous is not None and set(previous.images) - set(images):
            change = "images"  # a newer image turned an older one into a marker (max_images)
        messages = [frame.system_msg, *frame.pre_msgs, *(m for unit in window for m in unit.messages)]
        manifest = self._manifest(frame, window, images, len(messages), turn_id, step, preamble, gap_through)
        manifest.over_budget_through_seq = (units[natural_start].first_seq - 1) \
            if units and natural_start < len(units) else 0
        if change == "append" and window and window[0].first_seq != anchor:
            change = "trimmed"  # the no-gap rule or the window limit moved the start after all
        manifest.window_change = change
        return BuiltContext(messages=messages, tools=tools, manifest=manifest, profile=profile,
                            needs_summary=needs_summary,
                            uncovered_through=(window[0].first_seq - 1) if window else 0)

    def _frame(self, model: str, profile: ModelProfile, system_prompt: str, tools: list[dict[str, Any]],
               preamble: Preamble | None) -> _Frame:
        """The fixed regions (system, tools, preamble) and the history budget left by them."""
        s = self.s
        factor = self.calibration.factor(model, profile.token_factor)
        limit = profile.window_tokens - profile.reserved_output_tokens
        system_msg = {"role": "system", "content": system_prompt}
        regions_raw = {"system": count_message(system_msg, self._fixed_tokens)}
        tool_tokens = [(t["function"]["name"], self._fixed_tokens(msgspec.json.encode(t).decode())) for t in tools]
        regions_raw["tools"] = sum(n for _, n in tool_tokens)
        if regions_raw["tools"] * factor > s.tools_max_fraction * profile.window_tokens:
            largest = ", ".join(f"{name} ({n:,})" for name, n in sorted(tool_tokens, key=lambda x: -x[1])[:3])
            raise ContextTooLarge(
                f"the tool definitions take {regions_raw['tools'] * factor:,.0f} tokens, more than "
                f"{s.tools_max_fraction:.0%} of the {profile.window_tokens:,}-token window of {model}; "
                f"largest: {largest}. Allow-list fewer tools for this workspace.")
        pre_msgs: list[dict[str, Any]] = []
        if preamble is not None and preamble.text:
            text = f"{PREAMBLE_LABEL}\n{preamble.text}"
            pre_msgs = [{"role": "system" if profile.preamble == "system" else "user", "content": text}]
        regions_raw["preamble"] = sum(self._msg_tokens(m) for m in pre_msgs)
        fixed = sum(regions_raw.values()) * factor
        # images are priced outside the history: keep room for the most a window can send
        images_reserve = s.max_images * s.image_tokens if profile.vision else 0
        history_budget = min(s.history_budget_tokens, max(0, limit - fixed - images_reserve))
        return _Frame(model, profile, factor, limit, system_msg, pre_msgs, regions_raw, images_reserve,
                      history_budget, [t["function"]["name"] for t in tools])

    def _keep_uncovered(self, units: list[Unit], start: int, frame: _Frame,
                        coverage: Coverage | None) -> tuple[int, bool, int]:
        """The no-gap rule: keep uncovered turns, up to the allowance over the budget.
        Returns (window start, needs_summary, gap_through_seq)."""
        if coverage is None or not units or units[start].first_seq - 1 <= coverage.covered_through:
            return start, False, 0
        covered = coverage.covered_through
        first_uncovered = next(i for i, u in enumerate(units) if u.records[-1].seq > covered)
        allowance = frame.history_budget * (1 + coverage.allowance)
        total = sum(u.raw_tokens for u in units[first_uncovered:]) * frame.factor
        loaded = units[0].first_seq - 1 <= covered  # nothing uncovered before the tail read
        fits = (loaded and total <= allowance
                and self._total(units[first_uncovered:], frame.regions_raw, frame.factor)
                + frame.images_reserve <= frame.limit)
        if fits:
            return min(start, first_uncovered), False, 0
        if coverage.accept_gap:
            return start, False, units[start].first_seq - 1
        return start, True, 0

    def _manifest(self, frame: _Frame, window: list[Unit], images: list[str], n_messages: int, turn_id: str,
                  step: int, preamble: Preamble | None, gap_through: int) -> ContextManifest:
        """The manifest of the request (ContextTooLarge past the refuse level)."""
        s, factor, limit, profile = self.s, frame.factor, frame.limit, frame.profile
        current = window[-1] if window else None
        regions = {
            "system": round(frame.regions_raw["system"] * factor),
            "tools": round(frame.regions_raw["tools"] * factor),
            "preamble": round(frame.regions_raw["preamble"] * factor),
            "history": round(sum(u.raw_tokens for u in window[:-1]) * factor),
            "current": round((current.raw_tokens if current else 0) * factor),
            "images": len(images) * s.image_tokens,
        }
        total = sum(regions.values())
        level = total / limit if limit > 0 else 99.0
        if level > s.refuse_level:
            raise ContextTooLarge(
                f"this request would be about {total:,} tokens but {frame.model} takes {limit:,} "
                f"({profile.window_tokens:,} window - {profile.reserved_output_tokens:,} reserved for the answer): "
                + ", ".join(f"{k} {v:,}" for k, v in regions.items() if v)
                + ". Shorten the message or start a new thread.")
        water = "compact" if level >= s.compact_level else "warn" if level >= s.warn_level else "ok"
        included = [r.seq for u in window for r in u.records]
        raw_total = round(sum(frame.regions_raw.values()) + sum(u.raw_tokens for u in window))
        return ContextManifest(
            ts=time.time(), turn_id=turn_id, step=step, model=frame.model, profile=profile.name,
            rules_version=RULES_VERSION, budget_tokens=s.history_budget_tokens, limit_tokens=limit,
            level=round(level, 4), water=water, regions=regions,
            first_seq=window[0].first_seq if window else 0, last_seq=max(included, default=0),
            included=seq_ranges(included),
            trimmed_through_seq=(window[0].first_seq - 1) if window else 0,
            compacted=[q for u in window for q in u.compacted], capped=[q for u in window for q in u.capped],
            images=images, tools=frame.tool_names, calibration=round(factor, 4),
            estimated_tokens=total, estimated_raw_tokens=raw_total + len(images) * s.image_tokens,
            messages=n_messages, dropped_orphans=sum(u.orphans for u in window),
            synthetic_results=sum(u.synthetic for u in window),
            summary=preamble.summary if preamble is not None else None,
            memory_facts=list(preamble.memory_facts) if preamble is not None else [],
            gap_through_seq=gap_through or None,
        )

    # -- selection -------------------------------------------------------------------
    def _total(self, units: list[Unit], regions_raw: dict[str, int], factor: float) -> float:
        return (sum(regions_raw.values()) + sum(u.raw_tokens for u in units)) * factor

    def _load_units(self, thread: Thread, anchor: int | None, budget: float, factor: float,
                    profile: ModelProfile, shown: "_Shown | None" = None) -> list[Unit]:
        """Whole user turns from the tail of the log, rendered: back to the previous window's
        start, or far enough to fill the budget. Never the whole log unless it is small."""
        log = thread.log
        want = 64
        if anchor is not None and (last := log.tail(1)):
            # seqs are consecutive: read back to the anchor in one pass (not 64, 256, 1024, ...)
            want = min(max(want, last[-1].seq - anchor + 1), 1 << 13)
        enough = budget * 1.5 + self.s.trim_chunk_fraction * self.s.history_budget_tokens
        while True:
            records = log.tail(want)
            whole_log = len(records) < want
            units = _units(active_records(records))  # an earlier branch's records never go in
            for age, unit in enumerate(reversed(units)):
                unit.age = age
                self._render(unit, thread, profile, shown)
            total = sum(u.raw_tokens for u in units) * factor
            covers_anchor = anchor is not None and bool(units) and units[0].first_seq <= anchor
            if whole_log or covers_anchor or total > enough or want >= 1 << 22:
                return units
            want *= 4

    def _select(self, units: list[Unit], anchor: int | None, budget: float, factor: float) -> int:
        """Index of the first unit in the window."""
        if not units:
            return 0
        costs = [u.raw_tokens * factor for u in units]
        if anchor is not None:
            start = next((i for i, u in enumerate(units) if u.first_seq >= anchor), len(units) - 1)
            total = sum(costs[start:])
            chunk = self.s.trim_chunk_fraction * self.s.history_budget_tokens
            while total > budget and start < len(units) - 1:
                dropped = 0.0
                while start < len(units) - 1 and (dropped < chunk or total > budget):
                    dropped += costs[start]
                    total -= costs[start]
                    start += 1
                    if dropped >= chunk and total <= budget:
                        break
            return start
        total, start = 0.0, len(units)
        for i in range(len(units) - 1, -1, -1):
            if total + costs[i] > budget and start < len(units):
                break
            total += costs[i]
            start = i
        return start

    def _append_only_start(self, units: list[Unit], anchor: int, shown: "_Shown", frame: _Frame,
                           thread: Thread, profile: ModelProfile,
                           coverage: Coverage | None) -> tuple[int, int, str]:
        """(window start, where the budget alone would start it, what changed), append-only.
        A forced trim that would drop records no summary covers yet waits, with every byte as
        it was, while the window fits the no-gap allowance: the summary the trim asks for
        (`over_budget_through_seq`) then lands together with the trim, one change, not two."""
        start, change = self._select_append_only(units, anchor, frame, thread, profile)
        if change != "trimmed" or coverage is None or not units \
                or units[start].first_seq - 1 <= coverage.covered_through:
            return start, start, change
        for unit in units:
            self._render(unit, thread, profile, shown)  # back to the forms the previous request showed
        kept = next((i for i, u in enumerate(units) if u.first_seq >= anchor), len(units) - 1)
        allowance = frame.history_budget * (1 + coverage.allowance)
        if (sum(u.raw_tokens for u in units[kept:]) * frame.factor <= allowance
                and self._total(units[kept:], frame.regions_raw, frame.factor) + frame.images_reserve
                <= frame.limit):
            return kept, start, "append"
        start, change = self._select_append_only(units, anchor, frame, thread, profile)
        return start, start, change

    def _select_append_only(self, units: list[Unit], anchor: int, frame: _Frame, thread: Thread,
                            profile: ModelProfile) -> tuple[int, str]:
        """(index of the first unit, what changed). While the window from the previous start fits
        the budget, it is the previous request plus what was appended ("append": every byte
        before the new records is as it was). Past the budget the change is forced, and made
        once, large: results are re-compacted by age, and if that leaves more than
        `trim_target_fraction` of the budget, whole turns are dropped from the start (at least
        `trim_chunk_fraction` of the budget) until it does not. When the newest `recent_turns`
        turns alone take more than that, every older turn goes if that leaves room for one
        more such turn, else only what the budget needs (the older stubs stay)."""
        if not units:
            return 0, "append"
        budget, factor = frame.history_budget, frame.factor
        start = next((i for i, u in enumerate(units) if u.first_seq >= anchor), len(units) - 1)
        if sum(u.raw_tokens for u in units[start:]) * factor <= budget:
            return start, "append"
        for unit in units:
            self._render(unit, thread, profile)  # the age rule, for the whole loaded tail
        costs = [u.raw_tokens * factor for u in units]
        total = sum(costs[start:])
        target = min(1.0, max(0.0, self.s.trim_target_fraction)) * budget
        recent = [c for u, c in zip(units, costs) if u.age < self.s.recent_turns]
        if sum(recent) > target:
            # the newest turns alone take more than the target: drop every older turn when that
            # leaves room for a turn like them to be appended, else only what the budget needs
            target = sum(recent) if budget - sum(recent) >= max(recent) else budget
        if total <= target:
            return start, "recompacted"
        chunk, dropped = self.s.trim_chunk_fraction * self.s.history_budget_tokens, 0.0
        while start < len(units) - 1 and (total > target or dropped < chunk):
            dropped += costs[start]
            total -= costs[start]
            start += 1
        return start, "trimmed"

    # -- rendering -------------------------------------------------------------------
    def _form(self, rec: Record, age: int, shown: "_Shown | None") -> Form:
        """The age rule; append-only, a result the previous request showed keeps its form."""
        if shown is None or not shown.first <= rec.seq <= shown.last:
            return form_for(rec, age, self.s)
        return "stub" if rec.seq in shown.stubs else form_for(rec, 0, self.s)  # full or capped, by size

    def _render(self, unit: Unit, thread: Thread, profile: ModelProfile, shown: "_Shown | None" = None) -> None:
        unit.compacted, unit.capped, unit.images, unit.orphans, unit.synthetic = [], [], [], 0, 0
        calls: dict[str, str] = {}
        results: dict[str, Record] = {}
        for rec in unit.records:
            for c in rec.tool_calls or ():
                calls[c.id] = c.arguments
            if rec.role == "tool":
                results.setdefault(rec.tool_call_id or "", rec)
        out: list[dict[str, Any]] = []
        raw = 0
        path = str(thread.log.path)
        status = functools.partial(self.artifact_status, thread)
        for rec in unit.records:
            if rec.role == "tool":
                if rec.tool_call_id not in calls:
                    unit.orphans += 1
                continue  # emitted right after its call
            msg = self._record_message(rec, profile)
            if msg is None:
                continue
            mark = _upload_mark(rec, status)
            if mark:
                msg["content"] += mark
            out.append(msg)
            raw += self.cache.get((path, rec.seq, rec.ts, "m", profile.replay_reasoning, mark),
                                  lambda m=msg: self._msg_tokens(m))
            if rec.role == "user" and (rec.meta or {}).get("image"):
                unit.images.append((len(out) - 1, (rec.meta or {}).get("artifact", "")))
            for call in rec.tool_calls or ():
                res = results.get(call.id)
                if res is None:
                    unit.synthetic += 1
                    tmsg = {"role": "tool", "tool_call_id": call.id, "content": NO_RESULT}
                    out.append(tmsg)
                    raw += self._msg_tokens(tmsg)
                    continue
                form: Form = self._form(res, unit.age, shown)
                if form == "stub":
                    unit.compacted.append(res.seq)
                elif form == "capped":
                    unit.capped.append(res.seq)
                marks = gone_marks(res, call.arguments, status)  # expired artifacts say so wherever they are named
                content = render_tool_result(res, form, call.arguments, self.s, status, marks)
                tmsg = {"role": "tool", "tool_call_id": call.id, "content": content}
                out.append(tmsg)
                raw += self.cache.get((path, res.seq, res.ts, form, marks), lambda m=tmsg: self._msg_tokens(m))
                for aid in (res.meta or {}).get("images", ()):
                    unit.images.append((-(len(out)), aid))  # negative: produced by a tool
        unit.messages = out
        unit.raw_tokens = raw

    def _record_message(self, rec: Record, profile: ModelProfile) -> dict[str, Any] | None:
        if rec.role == "user":
            return {"role": "user", "content": rec.content}
        content = rec.content
        if rec.status == "cancelled":
            content = (content + "\n[reply stopped by the user]").strip()
        elif rec.status == "error" and (rec.meta or {}).get("kind") in CUT_OFF_KINDS:
            content = (content + "\n" + CUT_OFF).strip()  # the next reply should not build on it as whole
        if rec.tool_calls and (rec.meta or {}).get("via") == "user":  # chat/user_steps.py
            content = (content + "\n" + USER_STEP_NOTE).strip()
        if not content and not rec.tool_calls:
            return None
        msg: dict[str, Any] = {"role": "assistant", "content": content or None}
        if rec.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in rec.tool_calls]
        reasoning = (rec.provider_fields or {}).get("reasoning_content")
        if profile.replay_reasoning and reasoning:
            msg["reasoning_content"] = reasoning
        return msg

    def _attach_images(self, window: list[Unit], thread: Thread, profile: ModelProfile) -> list[str]:
        """The newest `max_images` images travel as images (vision models); older ones, and all
        of them for text-only models, become `[image <name>, artifact <aid>]` markers."""
        refs = [(u, pos, aid) for u in window for pos, aid in u.images]
        keep = {id(r) for r in refs[-self.s.max_images:]} if profile.vision else set()
        sent: list[str] = []
        for unit in window:
            inserts: list[tuple[int, dict[str, Any]]] = []
            for ref in [r for r in refs if r[0] is unit]:
                _, pos, aid = ref
                data = self.image_bytes(thread, aid) if id(ref) in keep else None
                if pos >= 0:  # an uploaded image on a user message
                    msg = unit.messages[pos]
                    if data is not None:
                        msg["content"] = [{"type": "text", "text": msg["content"]}, _image_part(data)]
                        sent.append(aid)
                    else:
                        msg["content"] = f"{msg['content']}\n[image {aid}, artifact {aid}]"
                    continue
                idx = -pos - 1  # the tool message that produced it
                if data is not None:
                    inserts.append((idx, _image_part(data)))
                    sent.append(aid)
                else:
                    unit.messages[idx]["content"] += f"\n[image {aid}.png, artifact {aid}]"
            if inserts:
                # one user part after the step's tool results (tool messages are text-only)
                by_step: dict[int, list[dict[str, Any]]] = {}
                for idx, part in inserts:
                    end = idx
                    while end + 1 < len(unit.messages) and unit.messages[end + 1]["role"] == "tool":
                        end += 1
                    by_step.setdefault(end, []).append(part)
                for end in sorted(by_step, reverse=True):
                    unit.messages.insert(end + 1, {"role": "user", "content": [
                        {"type": "text", "text": TOOL_IMAGES_TEXT}, *by_step[end]]})
        return sent


def image_mime(data: bytes) -> str:
    """The media type of an image by its magic bytes (PNG, JPEG, GIF, WebP; PNG otherwise)."""
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


def _image_part(data: bytes) -> dict[str, Any]:
    url = f"data:{image_mime(data)};base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def _upload_mark(rec: Record, status: Callable[[str], str | None]) -> str:
    """An upload announced in a user message whose data is gone says so (each sheet of a workbook)."""
    meta = rec.meta or {}
    if rec.role != "user" or meta.get("kind") != "upload":
        return ""
    marks = []
    for aid in meta.get("artifacts") or [meta.get("artifact")]:
        if isinstance(aid, str) and aid:
            current = status(aid)
            if current in GONE:
                marks.append("\n" + expired_mark(aid, current, from_tool=False))
    return "".join(marks)


def _units(records: list[Record]) -> list[Unit]:
    """Split records into user turns. Records before the first user record of a tail read
    belong to a turn that was cut off: they are skipped (the window starts at a user message)."""
    units: list[Unit] = []
    for rec in records:
        if rec.role == "user":
            units.append(Unit(records=[rec]))
        elif units:
            units[-1].records.append(rec)
    return units
