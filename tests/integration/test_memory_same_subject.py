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


def disputed_line(block: str, older: str, newer: str) -> str:
    """The older fact's line of the memory block, checked to carry the dispute label; the
    newer text appears only quoted in that label, never as an entry of its own."""
    lines = [ln for ln in block.splitlines() if ln.startswith("- [")]
    entries = [ln for ln in lines if f") {older}" in ln]
    assert len(entries) == 1, block
    assert not [ln for ln in lines if f") {newer}" in ln], block  # not injected as a fact
    assert f'(disputed: a newer memory says "{newer}"' in entries[0], block
    assert "ask them before relying on either" in entries[0], block
    return entries[0]


def test_without_such_words_it_is_a_conflict_and_only_the_older_is_injected(mem) -> None:  # noqa: F811
    h, model = mem(steps())
    ctx, facts, _ = run(h, "please remember: I prefer blue bars", "remember that I like green bars")
    block = preamble(model.calls[-1])
    disputed_line(block, BLUE, GREEN)  # the older acts, labelled disputed with the newer quoted
    assert len(ctx["memory_facts"]) == 1
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
    facts, last = over_the_wire(home, harness_factory, "actually, green bars from now on")
    block = preamble(last)
    assert "green bars" in block and "blue bars" not in block, block
    assert [f["text"] for f in facts["active"]] == [GREEN]
    assert [f["text"] for f in facts["superseded"]] == [BLUE]


def test_over_the_openai_wire_a_conflict_reaches_the_model_labelled_disputed(home, harness_factory) -> None:
    """Green without a word of change is a conflict: the next thread's request, as the provider
    receives it, carries blue with the dispute label quoting green, so the model asks rather than
    taking blue as settled."""
    facts, last = over_the_wire(home, harness_factory, "remember that I like green bars")
    assert [f["text"] for f in facts["active"]] == [BLUE]
    assert [f["text"] for f in facts["conflict"]] == [GREEN]
    line = disputed_line(preamble(last), BLUE, GREEN)
    assert line.startswith(f"- [{facts['active'][0]['id']}] (preference) {BLUE} (disputed:"), line


def over_the_wire(home, harness_factory, second: str) -> tuple[dict, list[dict]]:
    """Blue, then `second`, then a new thread, against the fake OpenAI server: (the memory
    panel's facts, the messages of the last request the server received)."""
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
        _, facts, _ = run(h, "please remember: I prefer blue bars", second)
        last = server.requests[-1]["messages"]
    return facts, last
