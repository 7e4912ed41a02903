"""The one way to pull a JSON object out of a model reply (summaries, memory extraction, scripted model)."""

from __future__ import annotations

import json

import pytest

from datadesk.llm.reply_json import extract_json

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
