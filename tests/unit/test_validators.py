"""The request validators themselves: each rule accepts a good request and rejects a bad one."""

from __future__ import annotations

import pytest

from tests.validators import to_anthropic, validate_anthropic, validate_openai

SYS = {"role": "system", "content": "rules"}
IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def user(text="hi"):
    return {"role": "user", "content": text}


def asst(text="ok", *call_ids, args='{"q": 1}'):
    msg = {"role": "assistant", "content": text}
    if call_ids:
        msg["tool_calls"] = [{"id": c, "type": "function", "function": {"name": "sql", "arguments": args}}
                             for c in call_ids]
    return msg


def tool(call_id, text="rows"):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


GOOD = [
    [SYS, user()],
    [SYS, {"role": "system", "content": "summary"}, user(), asst("hello")],
    [SYS, user(), asst(None, "a", "b"), tool("b"), tool("a"), asst("done"), user("more")],
    [SYS, user(), asst("", "a"), tool("a"), {"role": "user", "content": [{"type": "text", "text": "images"}, IMG]},
     asst("seen")],
    [user("no system prompt"), asst("x")],
    [SYS, user(), user("again"), asst("merged for Anthropic")],
]


@pytest.mark.parametrize("messages", GOOD)
def test_good_requests_pass_both(messages):
    validate_openai(messages)
    validate_anthropic(messages)


# -- OpenAI rules ---------------------------------------------------------------------------

OPENAI_BAD = [
    ("system after", [SYS, user(), {"role": "system", "content": "late"}], "system messages go only at the start"),
    ("unanswered then user", [SYS, user(), asst(None, "a", "b"), tool("a"), user()], "unanswered: b"),
    ("user between call and result", [SYS, user(), asst(None, "a"), user(), tool("a")], "unanswered: a"),
    ("tool with no call", [SYS, user(), tool("x")], "answers no preceding assistant tool_calls"),
    ("tool answered twice", [SYS, user(), asst(None, "a"), tool("a"), tool("a")], "answers it twice"),
    ("tool after another message", [SYS, user(), asst(None, "a"), tool("a"), asst("t"), tool("a")],
     "does not directly follow"),
    ("duplicate ids", [SYS, user(), asst(None, "a"), tool("a"), asst(None, "a"), tool("a")], "duplicate tool_call id"),
    ("ends unanswered", [SYS, user(), asst(None, "a")], "ends before every tool call"),
    ("bad role", [SYS, {"role": "function", "content": "x"}], "role 'function'"),
    ("tool content list", [SYS, user(), asst(None, "a"), {"role": "tool", "tool_call_id": "a",
                                                           "content": [{"type": "text", "text": "x"}]}],
     "tool content must be a string"),
    ("user bad part", [SYS, {"role": "user", "content": [{"type": "audio", "data": "x"}]}], "type 'audio'"),
    ("image in assistant", [SYS, user(), {"role": "assistant", "content": [IMG]}], "type 'image_url'"),
    ("image without url", [SYS, {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "image_url.url"),
    ("assistant empty", [SYS, user(), {"role": "assistant", "content": None}], "neither content nor tool_calls"),
    ("arguments object", [SYS, user(), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "sql", "arguments": {"q": 1}}}]}, tool("a")],
     "arguments must be a JSON string"),
    ("empty", [], "non-empty list"),
    ("only system", [SYS], "no user or assistant message"),
    ("user content none", [SYS, {"role": "user", "content": None}], "user content must be"),
]


@pytest.mark.parametrize("name,messages,expected", OPENAI_BAD, ids=[b[0] for b in OPENAI_BAD])
def test_openai_rejects(name, messages, expected):
    with pytest.raises(AssertionError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        validate_openai(messages)


def test_openai_results_in_any_order_but_all_before_other_messages():
    validate_openai([SYS, user(), asst(None, "a", "b", "c"), tool("c"), tool("a"), tool("b"), asst("x")])
    with pytest.raises(AssertionError, match="message 4: user message before every tool call"):
        validate_openai([SYS, user(), asst(None, "a", "b"), tool("b"),
                         {"role": "user", "content": "image"}, tool("a")])


# -- Anthropic rules ------------------------------------------------------------------------

ANTHROPIC_BAD = [
    ("system not at start", [SYS, user(), asst("x"), {"role": "system", "content": "summary"}, user()],
     "system message after the conversation started"),
    ("first turn assistant", [SYS, asst("hi"), user()], "the first turn is 'assistant'"),
    ("tool_use unanswered", [SYS, user(), asst(None, "a", "b"), tool("a"), asst("x")],
     r"tool_use ids \['b'\] have no tool_result"),
    ("tool_use at the end", [SYS, user(), asst(None, "a")], r"tool_use ids \['a'\]"),
    ("text before tool_result", [SYS, user(), asst(None, "a"), user("look"), tool("a")],
     "text block comes before the tool_result blocks"),
    ("image before tool_result", [SYS, user(), asst(None, "a"), {"role": "user", "content": [IMG]}, tool("a")],
     "image block comes before the tool_result blocks"),
    ("orphan tool_result", [SYS, user(), asst("x"), tool("zz")], "no matching tool_use in the previous"),
    ("tool_result for an older turn", [SYS, user(), asst(None, "a"), tool("a"), asst("x"), tool("a")],
     "no matching tool_use in the previous"),
    ("empty user text", [SYS, user(""), asst("x")], "empty content"),
    ("blank text part", [SYS, {"role": "user", "content": [{"type": "text", "text": " "}, IMG]}],
     "empty text block"),
    ("empty assistant", [SYS, user(), asst(""), user()], "empty content"),
    ("duplicate tool_use", [SYS, user(), asst(None, "a"), tool("a"), asst(None, "a"), tool("a")],
     "duplicate tool_use id"),
    ("arguments not an object", [SYS, user(), asst(None, "a", args="[1]"), tool("a")], "must be an object"),
    ("arguments not json", [SYS, user(), asst(None, "a", args="{oops"), tool("a")], "not JSON"),
    ("only system", [SYS], "no user or assistant message"),
]


@pytest.mark.parametrize("name,messages,expected", ANTHROPIC_BAD, ids=[b[0] for b in ANTHROPIC_BAD])
def test_anthropic_rejects(name, messages, expected):
    with pytest.raises(AssertionError, match=expected):
        validate_anthropic(messages)


def test_anthropic_conversion_merges_and_orders():
    system, turns = to_anthropic([SYS, {"role": "system", "content": "summary"}, user("preamble"), user("q"),
                                  asst("", "a", "b"), tool("b"), tool("a"),
                                  {"role": "user", "content": [{"type": "text", "text": "images"}, IMG]},
                                  asst("answer")])
    assert system == "rules\n\nsummary"
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
    assert [b["type"] for b in turns[0]["content"]] == ["text", "text"]
    assert [b["type"] for b in turns[1]["content"]] == ["tool_use", "tool_use"]  # the empty text is left out
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text", "image"]


def test_user_preamble_is_fine_for_anthropic_but_a_late_system_one_is_not():
    validate_anthropic([SYS, user("[summary]"), user("q"), asst("a")])
    with pytest.raises(AssertionError):
        validate_openai([SYS, user("q"), {"role": "system", "content": "[summary]"}])
