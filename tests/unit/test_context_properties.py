"""Properties of the context builder over random threads written to a real ThreadLog.

Random threads hold user turns, assistant steps with 0-4 parallel calls,
results recorded in any order, missing results (interrupted steps), orphan
results, huge (50 KB) results, cancelled and failed assistant records with
empty content, tool images and uploaded images. Every request built from them
must pass the providers' ordering rules (tests/validators.py), start at a user
message, keep the newest user message, keep history within the budget, and
never raise. Deterministic tests pin pairing, orphans and chunked trimming.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from datadesk.context.builder import NO_RESULT, BuiltContext, ContextBuilder, Coverage, Preamble
from datadesk.context.calibration import Calibration
from datadesk.context.manifest import append_manifest
from datadesk.store.threads import Thread
from datadesk.domain.records import Record, ToolCall
from datadesk.llm.tokens import count_tokens
from datadesk.settings import ContextSettings
from tests.validators import validate_anthropic, validate_openai

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
TOOLS = [
    {"type": "function", "function": {"name": "sql_query", "description": "Run SQL on the warehouse.",
                                      "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                                                     "required": ["sql"]}}},
    {"type": "function", "function": {"name": "python", "description": "Run Python in the sandbox.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
]
MODELS = ["gpt-4o-mini", "qwen2.5-72b", "deepseek-r1", "qwen2.5-vl-72b"]  # the last: vision in a 32k window
WORDS = "revenue store month region churn kwh holiday total average median forecast margin".split()


def huge_text(seed: int, size: int = 50_000) -> str:
    """About `size` chars of CSV, like a big query result."""
    rng = random.Random(seed)
    lines = ["day,store,region,revenue,units"]
    total = len(lines[0]) + 1  # kept as it grows: summing every line again each time was quadratic
    while total < size:
        lines.append(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},store_{rng.randint(1, 99)},"
                     f"{rng.choice(WORDS)},{rng.uniform(0, 1e5):.2f},{rng.randint(0, 999)}")
        total += len(lines[-1]) + 1
    return "\n".join(lines)[:size]


def make_builder(tmp: Path, **overrides: Any) -> ContextBuilder:
    return ContextBuilder(ContextSettings(**overrides), count_tokens, Calibration(tmp / "cal.json", 0.05),
                          artifact_status=lambda thread_dir, aid: "ready",
                          image_bytes=lambda thread_dir, aid: None if aid.endswith("gone") else PNG)


class ThreadUnderTest:
    """A thread dir with its real log; `build` appends the manifest like the runtime does."""

    def __init__(self, tdir: Path, builder: ContextBuilder, model: str = "gpt-4o-mini",
                 preamble: str | None = None) -> None:
        self.dir, self.builder, self.model, self.preamble = tdir, builder, model, preamble
        tdir.mkdir(parents=True, exist_ok=True)
        self.thread = Thread(tdir)
        self.log = self.thread.log
        self.builds = 0

    def add(self, role: str, content: str = "", **kw: Any) -> Record:
        return self.log.append(lambda seq: Record(seq=seq, role=role, ts=time.time(), content=content, **kw))

    def build(self, keep_manifest: bool = True) -> BuiltContext:
        self.builds += 1
        built = self.builder.build(self.thread, model=self.model, system_prompt="You are DataDesk.",
                                   tools=TOOLS, turn_id=f"t{self.builds}", step=1,
                                   preamble=Preamble(text=self.preamble) if self.preamble else None)
        if keep_manifest:
            append_manifest(self.thread, built.manifest)
        return built


# -- random threads -------------------------------------------------------------------------


@dataclass
class Step:
    calls: int
    status: str  # of the assistant record
    text: str
    results: list[int]  # indexes of the calls that got a result, in recording order
    huge: list[bool]
    result_status: list[str]
    images: list[int]  # images per result
    orphan_at: int | None  # position among the results where an orphan result lands
    orphan_late: bool  # the orphan answers a call of the previous turn (a late result) or no call at all
    build_after: bool


@dataclass
class Turn:
    text: str
    upload: str | None  # artifact id of an uploaded image before the message
    steps: list[Step] = field(default_factory=list)


@st.composite
def steps(draw) -> Step:
    calls = draw(st.integers(0, 4))
    status = draw(st.sampled_from(["ok", "ok", "ok", "error", "cancelled"]))
    text = draw(st.sampled_from(["", "", "Let me check.", "Here is the answer: revenue rose 4%."]))
    got = draw(st.permutations(range(calls)))
    missing = draw(st.integers(0, calls)) if draw(st.integers(0, 3)) == 0 else 0
    got = list(got[: calls - missing])
    huge = draw(st.lists(st.integers(0, 3).map(lambda n: n == 0), min_size=calls, max_size=calls))
    huge = [h and i < 2 for i, h in enumerate(huge)]  # at most 2 per step: a current turn fits any window
    rstatus = draw(st.lists(st.sampled_from(["ok", "ok", "ok", "error"]), min_size=calls, max_size=calls))
    images = draw(st.lists(st.integers(0, 6).map(lambda n: max(0, n - 4)), min_size=calls, max_size=calls))
    orphan_at = draw(st.none() | st.integers(0, len(got)))
    return Step(calls, status, text, got, huge, rstatus, images, orphan_at, draw(st.booleans()), draw(st.booleans()))


@st.composite
def turns(draw) -> list[Turn]:
    out = []
    for i in range(draw(st.integers(1, 9))):
        upload = draw(st.sampled_from([None, None, None, f"up{i}", f"up{i}gone"]))
        text = f"question {i}: " + " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40)))
        out.append(Turn(text, upload, draw(st.lists(steps(), max_size=2))))
    return out


def write_and_build(th: ThreadUnderTest, plan: list[Turn]) -> list[tuple[BuiltContext, Record]]:
    """Write the thread turn by turn, building (and checking) where a runtime would build."""
    builds = []
    n = 0
    for t, turn in enumerate(plan):
        if turn.upload:
            th.add("user", f"[The user uploaded an image: chart{t}.png (artifact {turn.upload}, 12 KB)]",
                   meta={"kind": "upload", "artifact": turn.upload, "image": True})
        newest = th.add("user", turn.text)
        builds.append((th.build(), newest))
        for s, step in enumerate(turn.steps):
            ids = [f"call_{t}_{s}_{k}" for k in range(step.calls)]
            th.add("assistant", step.text, status=step.status,
                   tool_calls=[ToolCall(c, "sql_query", f'{{"sql": "SELECT {k}"}}') for k, c in enumerate(ids)]
                   or None)
            ghost = f"call_{t - 1}_0_0" if step.orphan_late and t else f"ghost_{t}_{s}"
            for pos, k in enumerate(step.results):
                if step.orphan_at == pos:
                    th.add("tool", "late rows", tool_call_id=ghost, name="sql_query")
                n += 1
                content = huge_text(n) if step.huge[k] else f"{k + 1} rows: " + " ".join(WORDS[: k + 3])
                if step.result_status[k] == "error":
                    content = "" if n % 3 == 0 else "Binder Error: column x not found\nLINE 1: ..."
                aids = [f"img{t}_{s}_{k}_{j}" + ("gone" if (n + j) % 5 == 0 else "") for j in range(step.images[k])]
                th.add("tool", content, tool_call_id=ids[k], name="sql_query", status=step.result_status[k],
                       meta={"images": aids, "rows": k + 1} if aids else {"rows": k + 1})
            if step.orphan_at is not None and step.orphan_at >= len(step.results):
                th.add("tool", "late rows", tool_call_id=ghost, name="sql_query")
            if step.build_after:
                builds.append((th.build(), newest))
    return builds


def text_of(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content or ""


def check(built: BuiltContext, newest: Record, preamble: str | None) -> None:
    msgs, m = built.messages, built.manifest
    validate_openai(msgs)
    if preamble is None or built.profile.preamble == "user":
        validate_anthropic(msgs)
    rest = [x for x in msgs if x["role"] != "system"]
    assert rest and rest[0]["role"] == "user", rest[:1]
    assert any(x["role"] == "user" and newest.content in text_of(x) for x in msgs), "newest user message missing"
    # within the budget, unless the current turn alone is larger
    fixed = m.regions["system"] + m.regions["tools"] + m.regions["preamble"]
    s = ContextSettings()
    reserve = s.max_images * s.image_tokens if built.profile.vision else 0  # room kept for images
    budget = min(m.budget_tokens, m.limit_tokens - fixed - reserve)
    if m.regions["current"] <= budget:
        assert m.regions["history"] + m.regions["current"] <= budget + 2, m.regions
    else:
        assert m.regions["history"] == 0, m.regions
    included = [s for a, b in m.included for s in range(a, b + 1)]
    assert included and all(m.first_seq <= s for s in included)
    assert m.trimmed_through_seq == m.first_seq - 1 and newest.seq in included
    stubs = [x for x in msgs if x["role"] == "tool" and x["content"].startswith("[compacted result of")]
    assert len(stubs) == len(m.compacted)
    for x in stubs:
        assert f'read_tool_result("{x["tool_call_id"]}")' in x["content"]
    sent_images = [p for x in msgs if isinstance(x.get("content"), list) for p in x["content"]
                   if p.get("type") == "image_url"]
    assert len(sent_images) == len(m.images) <= 4
    if not built.profile.vision:
        assert not sent_images
    for name, hit in [("trimmed", m.first_seq > 1), ("stubs", bool(stubs)), ("capped", bool(m.capped)),
                      ("images sent", bool(sent_images)), ("orphans", m.dropped_orphans > 0),
                      ("synthetic", m.synthetic_results > 0), ("current over budget", m.regions["current"] > budget)]:
        if hit:
            event(name)


# DATADESK_PROPERTY_EXAMPLES=2000 explores further (a few minutes)
@settings(max_examples=int(os.environ.get("DATADESK_PROPERTY_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=turns(), budget=st.integers(2_000, 6_000) | st.integers(2_000, 40_000), model=st.sampled_from(MODELS),
       preamble=st.none() | st.just("summary: the user analyses store revenue by month."))
def test_random_threads_build_valid_requests(plan, budget, model, preamble) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        th = ThreadUnderTest(Path(tmp) / "thread", make_builder(Path(tmp), history_budget_tokens=budget), model, preamble)
        for built, newest in write_and_build(th, plan):
            check(built, newest, preamble)


# -- deterministic ----------------------------------------------------------------------------


def tool_messages(built: BuiltContext) -> list[dict[str, Any]]:
    return [m for m in built.messages if m["role"] == "tool"]


def test_out_of_order_parallel_results_follow_their_call_in_call_order(tmp_path: Path) -> None:
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path))
    th.add("user", "compare three stores")
    th.add("assistant", "", tool_calls=[ToolCall(f"c{i}", "sql_query", f'{{"sql": "SELECT {i}"}}') for i in range(3)])
    for i in (2, 0, 1):
        th.add("tool", f"result {i}", tool_call_id=f"c{i}", name="sql_query")
    th.add("assistant", "Store 2 leads.")
    th.add("user", "and the others?")
    built = th.build()
    validate_openai(built.messages)
    validate_anthropic(built.messages)
    roles = [m["role"] for m in built.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "assistant", "user"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(built)] == [
        ("c0", "result 0"), ("c1", "result 1"), ("c2", "result 2")]


def test_missing_result_gets_the_synthetic_message(tmp_path: Path) -> None:
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path))
    th.add("user", "two queries")
    th.add("assistant", "", status="cancelled",
           tool_calls=[ToolCall("a", "sql_query", "{}"), ToolCall("b", "sql_query", "{}")])
    th.add("tool", "done", tool_call_id="b", name="sql_query")
    th.add("user", "go on")
    built = th.build()
    validate_openai(built.messages)
    validate_anthropic(built.messages)
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(built)] == [("a", NO_RESULT), ("b", "done")]
    assert NO_RESULT == "no result recorded: the call did not complete"
    assert built.manifest.synthetic_results == 1


def test_orphan_result_is_dropped_and_counted(tmp_path: Path) -> None:
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path))
    th.add("user", "hello")
    th.add("tool", "nobody asked", tool_call_id="ghost", name="sql_query")
    th.add("assistant", "", tool_calls=[ToolCall("a", "sql_query", "{}")])
    th.add("tool", "ok", tool_call_id="a", name="sql_query")
    th.add("tool", "late duplicate-free orphan", tool_call_id="ghost2", name="sql_query")
    th.add("assistant", "Done.")
    th.add("user", "thanks")
    built = th.build()
    validate_openai(built.messages)
    validate_anthropic(built.messages)
    assert all("nobody asked" not in text_of(m) and "orphan" not in text_of(m) for m in built.messages)
    assert built.manifest.dropped_orphans == 2


def turn_text(i: int, tokens: int) -> str:
    """Text of about `tokens` tokens (distinct per turn)."""
    words = [f"{WORDS[(i + k) % len(WORDS)]}{(i * 31 + k) % 97}" for k in range(tokens)]
    text = " ".join(words)
    while count_tokens(text) > tokens:
        text = text[: int(len(text) * 0.95)]
    return text


def test_chunked_trimming_moves_the_window_start_rarely_and_by_chunks(tmp_path: Path) -> None:
    budget = 10_000
    b = make_builder(tmp_path, history_budget_tokens=budget)
    th = ThreadUnderTest(tmp_path / "t", b)
    cost: dict[int, int] = {}  # first seq of a turn -> its tokens (question + answer) as the builder counts them
    starts = []
    for i in range(30):
        q = th.add("user", turn_text(i, 350))
        built = th.build()
        validate_openai(built.messages)
        starts.append(built.manifest.first_seq)
        a = th.add("assistant", turn_text(i + 100, 1_100))
        cost[q.seq] = b._msg_tokens({"role": "user", "content": q.content}) + \
            b._msg_tokens({"role": "assistant", "content": a.content})
        assert 0.12 * budget < cost[q.seq] < 0.18 * budget
    changes = [(i, starts[i - 1], starts[i]) for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert len(changes) >= 3  # the thread is long enough to trim
    assert len(changes) <= len(starts) // 2, starts  # not every turn
    for i, old, new in changes:
        assert new > old
        dropped = sum(c for s, c in cost.items() if old <= s < new)
        assert dropped >= 0.2 * budget, (i, old, new, dropped)
    for (i, _, _), (j, _, _) in zip(changes, changes[1:]):
        assert j - i >= 2, changes


def test_the_anchor_is_kept_where_newest_first_would_move_it(tmp_path: Path) -> None:
    """Turns of ~7% of the budget: newest-first (no previous manifest) moves the window start at
    every turn once the thread is full; the anchored builder keeps it for several turns."""
    budget = 10_000
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path, history_budget_tokens=budget))
    ctx = th.dir / "context.jsonl"
    anchored_starts, naive_starts = [], []
    for i in range(30):
        th.add("user", turn_text(i, 200))
        anchored = th.build(keep_manifest=False)
        saved = ctx.read_bytes() if ctx.exists() else b""
        ctx.unlink(missing_ok=True)  # the naive selection: no anchor, so newest-first
        naive = th.build(keep_manifest=False)
        ctx.write_bytes(saved)
        append_manifest(th.thread, anchored.manifest)
        th.add("assistant", turn_text(i + 100, 500))
        # a window that fits is a suffix within the budget; newest-first takes the longest one
        assert naive.manifest.first_seq <= anchored.manifest.first_seq
        assert naive.manifest.regions["history"] >= anchored.manifest.regions["history"]
        anchored_starts.append(anchored.manifest.first_seq)
        naive_starts.append(naive.manifest.first_seq)
    full = next(i for i, s in enumerate(naive_starts) if s > 1)
    naive_moves = sum(naive_starts[i] != naive_starts[i - 1] for i in range(full, 30))
    anchored_moves = sum(anchored_starts[i] != anchored_starts[i - 1] for i in range(full, 30))
    kept_while_naive_moved = sum(anchored_starts[i] == anchored_starts[i - 1]
                                 and naive_starts[i] != naive_starts[i - 1] for i in range(full, 30))
    assert naive_moves == 30 - full, naive_starts  # one-turn trimming: the start moves every turn
    assert anchored_moves <= naive_moves // 3, (anchored_starts, naive_starts)
    assert kept_while_naive_moved >= 2 * anchored_moves, (anchored_starts, naive_starts)


@pytest.mark.parametrize("covered_through", [None, 0])
def test_images_do_not_push_a_small_window_over_the_limit(tmp_path: Path, covered_through: int | None) -> None:
    """Regression: a vision model with a 32k window (qwen-vl) and the default 32k budget. History
    filled the window minus the fixed part and the 4 images (4,000 tokens) came on top, so the
    9th turn was refused (ContextTooLarge) instead of trimmed; with a summary's coverage given
    (covered_through=0: nothing covered), the uncovered turns were kept and refused the same way."""
    th = ThreadUnderTest(tmp_path / "t", make_builder(tmp_path), model="qwen2.5-vl-72b")
    starts = set()
    for i in range(16):
        th.add("user", "[The user uploaded an image]", meta={"kind": "upload", "artifact": f"img{i}", "image": True})
        th.add("user", turn_text(i, 500))
        th.add("assistant", turn_text(i + 100, 2_000))
        cov = None if covered_through is None else Coverage(covered_through=covered_through)
        built = th.builder.build(th.thread, model=th.model, system_prompt="You are DataDesk.", tools=TOOLS,
                                 turn_id=f"t{i}", step=1, coverage=cov)
        append_manifest(th.thread, built.manifest)
        validate_openai(built.messages)
        validate_anthropic(built.messages)
        m = built.manifest
        assert len(m.images) == min(i + 1, 4) and m.estimated_tokens <= m.limit_tokens
        starts.add(m.first_seq)
    assert len(starts) > 1  # it trimmed rather than refused
