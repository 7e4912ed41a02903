"""The one way to pull a JSON object out of a model reply (summaries, memory extraction, scripted model)."""

from __future__ import annotations

import json

import pytest

from datadesk.llm.reply_json import extract_json, unwrap_object

OBJ = {"facts": [{"text": "Reports in English", "kind": "preference"}], "n": {"a": 1}}


@pytest.mark.parametrize("wrap", [
    "{}",
    "```json\n{}\n```",
    "```\n{}\n```\nDone.",
    "Here it is: {} - as asked.",
    "<think>maybe {\"facts\": []} or not</think>\n{}",
    "The set {a, b} aside, here is the answer: {}",
    "{}\nrows truncated: shown 20 of 100",
])
def test_the_object_is_found_whatever_is_around_it(wrap: str) -> None:
    body = json.dumps(OBJ)
    assert json.loads(extract_json(wrap.replace("{}", body, 1))) == OBJ


def test_a_broken_object_is_handed_to_the_decoder_and_no_object_is_an_error() -> None:
    assert extract_json('Answer: {"facts": [1, }') == '{"facts": [1, }'
    assert extract_json('{"facts": [') == '{"facts": ['
    with pytest.raises(ValueError, match="no JSON object"):
        extract_json("I could not summarize this.")


@pytest.mark.parametrize("reply", [
    '{"summary": {"a": 1}}', '{"result": {"a": 1}}', '```json\n{"anything": {"a": 1},}\n```',
    json.dumps(json.dumps({"a": 1})), json.dumps({"result": json.dumps({"a": 1})}),
    '{"outer": {"summary": {"a": 1}}}',
])
def test_a_wrapped_object_is_unwrapped(reply: str) -> None:
    assert unwrap_object(reply, _decode_a) == {"a": 1}


def test_an_object_that_validates_is_not_unwrapped_and_the_first_error_is_kept() -> None:
    assert unwrap_object('{"a": {"a": 2}}', lambda s: json.loads(s)) == {"a": {"a": 2}}
    with pytest.raises(ValueError, match="no key a"):
        unwrap_object('{"x": 1, "y": {"a": 1}}', _decode_a)  # two keys: not a wrapper
    with pytest.raises(ValueError, match="no key a"):
        unwrap_object('{"summary": {"b": 1}}', _decode_a)  # the wrapped object fails too


def _decode_a(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict) or "a" not in value or not isinstance(value["a"], int):
        raise ValueError("no key a")
    return value
