"""A new fact on the subject of an active one (issue 31, item 6): "prefers blue bars", then
"prefers green bars" with no id named by the model. The two are never injected side by side:
the user's words say it changes ("actually ... now") and green supersedes blue, or they do
not and green is a conflict (blue, the older, still acts alone until the user resolves it).

Driven over the HTTP API with the scripted model of test_memory_corrections.py; the next
thread's memory block is what is checked.
"""

from __future__ import annotations

import pytest

from datadesk.llm.scripted import tool_step
from tests.integration.test_memory_corrections import mem, preamble, run  # noqa: F401 - the fixture

BLUE, GREEN = "Prefers blue bars", "Prefers green bars"


def steps() -> list:
    return [tool_step("remember", {"text": BLUE, "kind": "preference"}), "noted",
            tool_step("remember", {"text": GREEN, "kind": "preference"}), "noted", "here is the chart"]


@pytest.mark.parametrize("said", ["actually, I prefer green bars now", "use green bars instead",
                                  "I no longer want blue: green bars"])
def test_the_users_words_say_it_changes_green_supersedes_blue(mem, said: str) -> None:  # noqa: F811
    h, model = mem(steps())
    ctx, facts, _ = run(h, "please remember: I prefer blue bars", said)
    block = preamble(model.calls[-1])
    assert "green bars" in block and "blue bars" not in block, block
    assert [f["text"] for f in facts["active"]] == [GREEN]
    assert [f["text"] for f in facts["superseded"]] == [BLUE]  # kept as history
    assert facts["superseded"][0]["superseded_by"] == facts["active"][0]["id"]
    assert len(ctx["memory_facts"]) == 1


def test_without_such_words_it_is_a_conflict_and_only_the_older_is_injected(mem) -> None:  # noqa: F811
    h, model = mem(steps())
    _, facts, _ = run(h, "please remember: I prefer blue bars", "remember that I like green bars")
    block = preamble(model.calls[-1])
    assert "blue bars" in block and "green bars" not in block, block
    assert [f["text"] for f in facts["active"]] == [BLUE]
    assert [f["text"] for f in facts["conflict"]] == [GREEN]
    assert facts["conflict"][0]["conflicts_with_text"] == BLUE


def test_a_different_subject_is_not_touched(mem) -> None:  # noqa: F811
    h, model = mem([tool_step("remember", {"text": BLUE, "kind": "preference"}), "noted",
                    tool_step("remember", {"text": "Reports in English", "kind": "preference"}), "noted", "ok"])
    _, facts, _ = run(h, "please remember: I prefer blue bars", "actually, reports in English now")
    assert sorted(f["text"] for f in facts["active"]) == sorted([BLUE, "Reports in English"])
    assert "blue bars" in preamble(model.calls[-1]) and "English" in preamble(model.calls[-1])


def test_over_the_openai_wire_the_next_thread_sees_only_green(home, harness_factory) -> None:
    """The same with the real `OpenAIChatModel` against the fake server (tool calls in Chat
    Completions shape), the model naming no id."""
    from datadesk.llm.client import OpenAIChatModel
    from datadesk.settings import LLMSettings
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore
    from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

    def reply(req: dict) -> FakeReply:
        last = req["messages"][-1]
        if last["role"] == "tool":
            return FakeReply(text="noted")
        text = str(last.get("content", ""))
        if "bars" in text:
            fact = GREEN if "green" in text else BLUE
            return FakeReply(tool_calls=[{"name": "remember", "arguments": {"text": fact, "kind": "preference"}}])
        return FakeReply(text="here is the chart")

    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + "memory = true\n")
    with FakeOpenAIServer(models=None) as server:
        server.responder = reply
        llm = LLMSettings(base_url=server.base_url, api_key="k", model="fake-model", max_retries=0)
        h = harness_factory(OpenAIChatModel(llm))
        _, h.tokens["dana"] = UserStore(h.rt.layout).add("dana", ["demo"], ["memory"])
        _, facts, _ = run(h, "please remember: I prefer blue bars", "actually, green bars from now on")
        last = server.requests[-1]["messages"]
    block = preamble(last)
    assert "green bars" in block and "blue bars" not in block, block
    assert [f["text"] for f in facts["active"]] == [GREEN]
    assert [f["text"] for f in facts["superseded"]] == [BLUE]
