"""Summaries that get made with real OpenAI-compatible servers (issue 18, item 1), and the
constraint that is never silently lost (item 2), over the HTTP API.

The chat model and the summarizer are both the real `OpenAIChatModel` talking HTTP to the
fake server (tests/fakes/openai_server.py). The fake answers turn requests with the seed
scenario (a SQL call, then fifteen large chart specs) and summary requests in the way of a
given kind of server:
(a) prose unless the request carries the JSON schema (`response_format: json_schema`);
(b) the JSON in a fenced block with a sentence before it;
(c) invalid JSON twice, then valid;
(d) never a summary at all: then the task state and the "dropped unsummarised" notice carry it.
In each case "exclude holidays" reaches the request for "recompute" after 16 turns under a
small history budget.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import pytest

from datadesk.llm.client import OpenAIChatModel
from datadesk.settings import LLMSettings
from tests.conftest import wait_until
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.scenarios import SEED, chart_specs, register_chart_spec
from tests.unit.test_summary import fake_fields

SUMMARY_SYSTEM = "You maintain the running summary"
TURNS = 15  # chart turns after the seed; "recompute" is the 17th user message
SMALL = 3_000  # a budget the uncovered turns cannot stay within (with the allowance)


def is_summary_request(req: dict[str, Any]) -> bool:
    msgs = req.get("messages") or []
    return bool(msgs) and str(msgs[0].get("content", "")).startswith(SUMMARY_SYSTEM)


def turn_reply(req: dict[str, Any], note: bool = False) -> FakeReply:
    """The seed scenario's chat model: a tool call per user turn, then a short answer; with
    `note`, the first turn also records the user's constraint with `note_constraint`."""
    last = req["messages"][-1]
    if last["role"] == "tool":
        return FakeReply(text="Done: the chart is updated.")
    text = str(last.get("content", ""))
    if "recompute" in text:
        return FakeReply(text="Recomputed.")
    if text == SEED:
        calls = [{"name": "sql_query", "arguments": {"sql": "SELECT 1"}}]
        if note:
            calls.append({"name": "note_constraint",
                          "arguments": {"text": "exclude holidays", "user_words": "exclude holidays"}})
        return FakeReply(tool_calls=calls)
    variant = int(re.search(r"\((\d+)\)", text).group(1))
    return FakeReply(tool_calls=[{"name": "chart_spec", "arguments": {"variant": variant}}])


def summary_json(req: dict[str, Any]) -> str:
    return json.dumps(fake_fields(req["messages"]))


def prose_unless_schema(req: dict[str, Any]) -> FakeReply:
    fmt = req.get("response_format") or {}
    if fmt.get("type") == "json_schema" and fmt.get("json_schema", {}).get("schema"):
        return FakeReply(text=summary_json(req))
    return FakeReply(text="The user is analysing office energy use and keeps changing chart colours.")


def fenced_with_sentence(req: dict[str, Any]) -> FakeReply:
    return FakeReply(text="Sure, here is the updated summary:\n```json\n" + summary_json(req) + "\n```\n")


class InvalidTwice:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, req: dict[str, Any]) -> FakeReply:
        self.calls += 1
        if self.calls <= 2:
            return FakeReply(text='{"goal": "energy use", "active_constraints": [exclude holidays], ')
        return FakeReply(text=summary_json(req))


class Wrapped:
    """Answers wrapped three ways in turn: `{"summary": {...}}`, a JSON string holding the
    object, and `{"result": "<the object as a JSON string>"}`."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, req: dict[str, Any]) -> FakeReply:
        self.calls += 1
        obj = fake_fields(req["messages"])
        forms = [json.dumps({"summary": obj}), json.dumps(json.dumps(obj)), json.dumps({"result": json.dumps(obj)})]
        return FakeReply(text=forms[(self.calls - 1) % 3])


def never_a_summary(req: dict[str, Any]) -> FakeReply:
    return FakeReply(text="I would rather not summarise this conversation.")


def run_seed(server: FakeOpenAIServer, harness_factory, summarize: Callable[[dict[str, Any]], FakeReply],
             provider: str = "auto", pin: bool = False, note: bool = False, budget: int = 6_000) -> dict[str, Any]:
    """The seed scenario over the HTTP API; the requests, manifests and the thread's state after it."""
    server.responder = lambda req: summarize(req) if is_summary_request(req) else turn_reply(req, note)
    llm = LLMSettings(base_url=server.base_url, api_key="k", model="fake-model", max_retries=0, provider=provider)
    h = harness_factory(OpenAIChatModel(llm), llm={"provider": provider},
                        context={"history_budget_tokens": budget}, summary={"enabled": True})
    register_chart_spec(h.rt, chart_specs(900))
    with h.client("bob", served=True, timeout=120) as api:
        c, tid = api.client, api.tid
        assert c.post(f"/api/threads/{tid}/messages", json={"content": SEED}).status_code == 200
        if pin:  # the user pins their own first message in the UI
            assert c.post(f"/api/threads/{tid}/task-state", json={"seq": 1}).status_code == 200
        for i in range(1, TURNS + 1):
            c.post(f"/api/threads/{tid}/messages", json={"content": f"make the chart colours warmer ({i})"})
            wait_until(lambda: h.rt.summaries.pending == 0, timeout=60)
        c.post(f"/api/threads/{tid}/messages", json={"content": "recompute"})
        wait_until(lambda: h.rt.summaries.pending == 0, timeout=60)
        state = c.get(f"/api/threads/{tid}/task-state").json()
        tdir = h.rt.threads.get(tid, "bob", ["demo"]).dir
    turns = [r for r in server.requests if not is_summary_request(r)]
    summaries = [r for r in server.requests if is_summary_request(r)]
    manifests = [json.loads(x) for x in (tdir / "context.jsonl").read_text().splitlines()]
    summary = json.loads((tdir / "summary.json").read_text()) if (tdir / "summary.json").exists() else None
    return {"recompute": turns[-1], "summaries": summaries, "manifests": manifests, "summary": summary,
            "state": state}


@pytest.fixture
def server():
    with FakeOpenAIServer(models=None) as srv:
        yield srv


def assert_carried_by_the_summary(out: dict[str, Any]) -> None:
    recompute = out["recompute"]
    assert "exclude holidays" in json.dumps(recompute["messages"]).lower()
    users = [m.get("content") for m in recompute["messages"] if m["role"] == "user"]
    assert SEED not in users, "the seed turn should have left the window"
    assert out["summary"] is not None and "exclude holidays" in out["summary"]["active_constraints"]
    assert all(m.get("gap_through_seq") is None for m in out["manifests"]), "a record left uncovered"
    assert out["state"]["summary"]["state"] == "ok", out["state"]["summary"]
    items = out["state"]["task_state"]["items"]  # the summary's constraint went into the task state too
    assert any(i["text"] == "exclude holidays" and i["status"] == "active" for i in items), items


def assert_carried_by_the_task_state(out: dict[str, Any], source: str) -> None:
    """No summary was ever made: the task state carries the constraint, and the model and the
    user are told that earlier history was dropped unsummarised, and why."""
    assert out["summary"] is None
    messages = out["recompute"]["messages"]
    text = json.dumps(messages).lower()
    assert "exclude holidays" in text
    assert SEED not in [m.get("content") for m in messages if m["role"] == "user"]
    assert "dropped unsummarised" in text and "no json object" in text
    gap = out["manifests"][-1]["gap_through_seq"]
    assert gap and gap >= 1
    state = out["state"]
    assert state["summary"]["state"] == "failed" and "no JSON object" in state["summary"]["reason"]
    assert state["summary"]["dropped_unsummarised_through_seq"] == gap
    active = [i for i in state["task_state"]["items"] if i["status"] == "active"]
    assert [(i["source"], i["kind"]) for i in active] == [(source, "constraint")], active
    assert "exclude holidays" in active[0]["text"]


def test_a_prose_server_gets_the_schema_and_answers_with_it(server, harness_factory) -> None:
    out = run_seed(server, harness_factory, prose_unless_schema, provider="vllm")
    assert out["summaries"], "the summarizer was never asked"
    fmt = out["summaries"][0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert set(fmt["json_schema"]["schema"]["required"]) >= {"goal", "active_constraints", "superseded"}
    assert_carried_by_the_summary(out)


def test_a_prose_server_without_the_schema_fails_visibly(server, harness_factory) -> None:
    """The same server asked in JSON mode only answers prose: no summary is made, and that is said."""
    out = run_seed(server, harness_factory, prose_unless_schema, provider="deepseek")
    assert out["summaries"][0]["response_format"] == {"type": "json_object"}
    assert out["summary"] is None
    assert out["state"]["summary"]["state"] == "failed"
    assert "no JSON object" in out["state"]["summary"]["reason"]


def test_a_fenced_answer_with_a_sentence_before_it_is_read(server, harness_factory) -> None:
    out = run_seed(server, harness_factory, fenced_with_sentence)
    assert out["summaries"][0]["response_format"] == {"type": "json_object"}  # generic server: JSON mode
    assert_carried_by_the_summary(out)


def test_a_wrapped_answer_is_unwrapped_before_validation(server, harness_factory) -> None:
    summarizer = Wrapped()
    out = run_seed(server, harness_factory, summarizer)
    assert_carried_by_the_summary(out)
    # each wrapped answer validated at once: no retry call showing the model an error
    assert summarizer.calls == len(out["summaries"]) and summarizer.calls >= 2
    assert not any("error" in json.dumps(r["messages"][2:]).lower() for r in out["summaries"])


def test_invalid_json_twice_then_valid(server, harness_factory) -> None:
    summarizer = InvalidTwice()
    out = run_seed(server, harness_factory, summarizer)
    assert summarizer.calls >= 3
    retry = out["summaries"][1]["messages"]
    assert retry[-2]["role"] == "assistant" and "exclude holidays" in retry[-2]["content"]  # its own answer
    assert "not a valid summary" in retry[-1]["content"]  # and what is wrong with it
    assert_carried_by_the_summary(out)


def test_no_summary_ever_the_uncovered_records_stay_within_the_allowance(server, harness_factory) -> None:
    """At 6,000 tokens the sixteen compacted turns fit the allowance (25% over): nothing leaves."""
    out = run_seed(server, harness_factory, never_a_summary)
    messages = out["recompute"]["messages"]
    assert SEED in [m.get("content") for m in messages if m["role"] == "user"]
    assert all(m["trimmed_through_seq"] == 0 and m.get("gap_through_seq") is None for m in out["manifests"])
    assert out["state"]["summary"]["state"] == "failed"  # the user sees it although nothing was lost yet


def test_no_summary_ever_the_model_noted_the_constraint(server, harness_factory) -> None:
    out = run_seed(server, harness_factory, never_a_summary, note=True, budget=SMALL)
    assert_carried_by_the_task_state(out, "model")


def test_no_summary_ever_the_user_pinned_the_message(server, harness_factory) -> None:
    out = run_seed(server, harness_factory, never_a_summary, pin=True, budget=SMALL)
    assert_carried_by_the_task_state(out, "user")


def test_no_summary_ever_nothing_noted_the_notice_quotes_the_user(server, harness_factory) -> None:
    """Neither a note nor a pin: the notice of dropped history quotes the user's own messages."""
    out = run_seed(server, harness_factory, never_a_summary, budget=SMALL)
    preamble = next(m["content"] for m in out["recompute"]["messages"] if "dropped unsummarised" in m["content"])
    assert f"- #1: {SEED}" in preamble
    assert out["state"]["task_state"]["items"] == [] and out["manifests"][-1]["gap_through_seq"]
