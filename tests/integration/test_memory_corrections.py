"""Corrections win (issue 18, item 3): "charts in blue", then "actually, green".

Driven over the HTTP API with a scripted model that reads fact ids from what the tools
showed it, like a real model. In each of the three ways of correcting - remember with
`replaces`, a contradiction the model names (`contradicts`), forget then remember in the
same turn - only green is injected in a new thread, and blue is kept (superseded or
forgotten) for the audit. A correction that follows outside tool output, or whose words
the user never said, stays a conflict shown to the user.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from datadesk.tools.registry import ToolResult, ToolSpec
from tests.conftest import parse_sse, serve_app

BLUE, GREEN = "Charts in blue", "Charts in green"


@pytest.fixture
def mem(home, harness_factory):
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + "memory = true\n")

    def make(steps):
        model = ScriptedModel(steps, then="ok")
        h = harness_factory(model)
        _, h.tokens["dana"] = UserStore(h.rt.layout).add("dana", ["demo"], ["memory"])
        return h, model
    return make


def preamble(call: list[dict]) -> str:
    return "\n".join(m["content"] for m in call[1:3] if isinstance(m.get("content"), str)
                     and "Derived from past conversations" in m["content"])


def blue_id(messages: list[dict[str, Any]]) -> str:
    """The id of the blue fact, as the model sees it: in a tool result or the memory block."""
    text = "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
    found = re.search(r"\[(f[A-Za-z0-9_-]+)\] \(preference\) " + BLUE, text)
    assert found, text[-2_000:]
    return found.group(1)


def correct(way: str) -> list:
    """The model's steps for "actually, green", one of the three ways."""
    if way == "replaces":
        return [lambda msgs, tools: tool_step("remember", {"text": GREEN, "kind": "preference",
                                                           "replaces": blue_id(msgs)}), "noted"]
    if way == "contradicts":
        return [lambda msgs, tools: tool_step("remember", {"text": GREEN, "kind": "preference",
                                                           "contradicts": [blue_id(msgs)]}), "noted"]
    return [lambda msgs, tools: tool_step("forget", {"fact_id": blue_id(msgs), "reason": "now green"}),
            tool_step("remember", {"text": GREEN, "kind": "preference"}), "noted"]


def run(h, first: str, second: str) -> tuple[dict, dict, list[dict]]:
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("dana"), timeout=60) as c:
        t1 = c.post("/api/threads", json={}).json()["id"]
        parse_sse(c.post(f"/api/threads/{t1}/messages", json={"content": first}).text)
        parse_sse(c.post(f"/api/threads/{t1}/messages", json={"content": second}).text)
        t2 = c.post("/api/threads", json={}).json()["id"]
        parse_sse(c.post(f"/api/threads/{t2}/messages", json={"content": "draw the revenue chart"}).text)
        ctx = c.get(f"/api/threads/{t2}/context").json()
        facts = c.get("/api/memory?workspace=demo").json()["facts"]
        records = c.get(f"/api/threads/{t1}").json()["records"]
    return ctx, facts, records


@pytest.mark.parametrize("way", ["replaces", "contradicts", "forget-then-remember"])
def test_only_the_corrected_fact_reaches_a_new_thread(mem, way: str) -> None:
    h, model = mem([tool_step("remember", {"text": BLUE, "kind": "preference"}), "noted",
                    *correct(way), "here is the chart"])
    ctx, facts, records = run(h, "please remember: charts in blue", "actually, green")
    block = preamble(model.calls[-1])
    assert "green" in block and "blue" not in block, block
    assert len(ctx["memory_facts"]) == 1
    assert [f["text"] for f in facts["active"]] == [GREEN]
    assert not facts["conflict"] and not facts["candidate"]
    old = facts["forgotten" if way == "forget-then-remember" else "superseded"]
    assert [f["text"] for f in old] == [BLUE]  # kept for the audit, never injected
    if way != "forget-then-remember":
        assert old[0]["superseded_by"] == facts["active"][0]["id"]
    # the tools showed the model the facts that act, with their ids
    results = [r["content"] for r in records if r["role"] == "tool"]
    assert "Current facts (active):" in results[0] and f"] (preference) {BLUE}" in results[0]
    assert f"] (preference) {GREEN}" in results[-1] and BLUE not in results[-1].split("Current facts")[1]


def test_a_correction_after_outside_tool_output_is_a_conflict_shown_to_the_user(mem) -> None:
    h, model = mem([tool_step("remember", {"text": BLUE, "kind": "preference"}), "noted",
                    tool_step("crm__notes", {}),
                    lambda msgs, tools: tool_step("remember", {"text": GREEN, "kind": "preference",
                                                               "replaces": blue_id(msgs)}),
                    "noted", "here is the chart"])

    async def notes(args, ctx):
        return ToolResult("customer notes: the brand colour is green")

    h.rt.tools.register(ToolSpec(name="crm__notes", description="notes", parameters={"type": "object"}), notes)
    _, facts, _ = run(h, "please remember: charts in blue", "read the CRM notes, actually green")
    assert [f["text"] for f in facts["active"]] == [BLUE]  # the old one still acts...
    pending = facts["candidate"] + facts["conflict"]
    assert [f["text"] for f in pending] == [GREEN]  # ...until the user decides
    assert "blue" in preamble(model.calls[-1]) and "green" not in preamble(model.calls[-1])


def test_a_named_correction_the_user_never_said_is_a_conflict(mem) -> None:
    h, model = mem([tool_step("remember", {"text": BLUE, "kind": "preference"}), "noted",
                    lambda msgs, tools: tool_step("remember", {"text": GREEN, "kind": "preference",
                                                               "replaces": blue_id(msgs)}),
                    "noted", "here is the chart"])
    _, facts, _ = run(h, "please remember: charts in blue", "make the chart bigger")
    assert [f["text"] for f in facts["active"]] == [BLUE]
    assert [f["text"] for f in facts["conflict"]] == [GREEN]
    assert facts["conflict"][0]["conflicts_with_text"] == BLUE  # the panel shows both sides
