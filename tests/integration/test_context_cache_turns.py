"""The append-only window in real turns over the HTTP API (issue 18, item 5).

20 turns, each a tool call with a ~1,600-char result and an answer, under a small budget,
with summaries (a faithful scripted summarizer) and memory on: every request whose manifest
says `window_change: append` starts with every message of the previous request, byte for
byte (system, tools, preamble, history); the window trims a few times, each time in one
large change; and the reusable prefix over the whole thread is far above the window that
compacts by age (`context.append_only = false`), run the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.llm.tokens import count_message, count_tokens
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from datadesk.store.workspaces import ensure_demo_workspace
from tests.conftest import make_harness, parse_sse, wait_until
from tests.scenarios import chart_specs, register_chart_spec
from tests.unit.test_summary import faithful

TURNS = 20
BUDGET = 6_000


def fresh_home(root: Path, warehouse_dir: Path) -> Path:
    """A data dir like the `home` fixture's (demo workspace, its warehouse), memory on."""
    layout = Layout(root)
    data = layout.workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(layout)
    cfg = layout.workspace_config("demo")
    cfg.write_text(cfg.read_text() + "memory = true\n")
    return root


def run(home: Path, append_only: bool) -> tuple[list[list[dict]], list[dict]]:
    big = chart_specs(100)
    steps: list = []
    for i in range(TURNS):
        steps += [tool_step("chart_spec", {"variant": i % 16}, call_id=f"call_{i}"),
                  f"Answer {i}: " + " ".join(f"revenue{i}_{k} rose" for k in range(60))]
    model = ScriptedModel(steps, then="ok")
    h = make_harness(home, model, summary_model=ScriptedModel(then=faithful), summary={"enabled": True},
                     context={"history_budget_tokens": BUDGET, "append_only": append_only})
    _, h.tokens["dana"] = UserStore(h.rt.layout).add("dana", ["demo"], ["memory"])
    h.rt.memory.remember("demo", "dana", "Charts in blue", kind="preference", source="panel", user_asked=True)
    register_chart_spec(h.rt, big)
    with h.client("dana", served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        for i in range(TURNS):
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": f"chart {i}, please"}).text)
            assert events[-1][0] == "done"
            wait_until(lambda: h.rt.summaries.pending == 0)  # the background summary, as between real turns
        tdir = h.rt.threads.get(tid, "dana", ["demo"]).dir
    manifests = [json.loads(x) for x in (tdir / "context.jsonl").read_text().splitlines()]
    assert len(manifests) == len(model.calls) == 2 * TURNS
    return model.calls, manifests


def prefix_share(calls: list[list[dict]]) -> float:
    shared = total = 0
    for prev, cur in zip(calls, calls[1:]):
        tokens = [count_message(m, count_tokens) for m in cur]
        total += sum(tokens)
        for a, b, n in zip(prev, cur, tokens):
            if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
                break
            shared += n
    return shared / total


def test_real_turns_are_append_only_between_trims(tmp_path: Path, demo_warehouse_dir: Path) -> None:
    calls, manifests = run(fresh_home(tmp_path / "a", demo_warehouse_dir), append_only=True)
    changes = [m["window_change"] for m in manifests]
    for i in range(1, len(calls)):
        m = manifests[i]
        assert m["regions"]["history"] + m["regions"]["current"] <= 1.25 * BUDGET + 2  # budget (+ no-gap allowance)
        if changes[i] == "append":
            assert calls[i][:len(calls[i - 1])] == calls[i - 1], i
    assert 2 <= changes.count("trimmed") <= TURNS // 3, changes
    assert any(m.get("summary") for m in manifests) and all(m["memory_facts"] for m in manifests)
    aged_calls, _ = run(fresh_home(tmp_path / "b", demo_warehouse_dir), append_only=False)
    append, aged = prefix_share(calls), prefix_share(aged_calls)
    print(f"\nreal turns, {TURNS} turns, budget {BUDGET:,}: prefix share {append:.1%} append-only, {aged:.1%} aged")
    assert append > aged + 0.1, (append, aged)
