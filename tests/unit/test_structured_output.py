"""Summaries asked for with the strongest JSON mode the server supports (issue 18, item 1):
profiles say which, the summarizer sends it, degrades when a server refuses it, reads what
comes back tolerantly and retries with the model's own validation error."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from datadesk.context.profiles import profile_for, provider_for, structured_output_for, summary_output
from datadesk.domain.records import Record
from datadesk.llm.client import OpenAIChatModel
from datadesk.llm.reply_json import extract_json, strip_trailing_commas
from datadesk.llm.scripted import ScriptedModel
from datadesk.settings import ContextSettings, LLMSettings, Settings, SummarySettings
from datadesk.summary.model import SUMMARY_SCHEMA, response_format
from datadesk.summary.summarizer import Summarizer, SummaryError
from tests.fakes.openai_server import FakeOpenAIServer
from tests.unit.test_summary import fake_fields, faithful

RECORDS = [Record(seq=1, role="user", ts=0.0, content="analyse energy use, exclude holidays"),
           Record(seq=2, role="assistant", ts=0.0, content="Done.")]


def summarize(model, output: str = "none", **settings) -> tuple[object, object]:
    summarizer = Summarizer(model, SummarySettings(**settings), output=output)
    return summarizer, asyncio.run(summarizer.summarize(None, RECORDS, 0))


# -- profiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("model,provider,url,mode", [
    ("gpt-4o-mini", "auto", "https://api.openai.com/v1", "json_schema"),
    ("gpt-4o-mini", "auto", None, "json_schema"),  # the family knows
    ("qwen2.5:14b", "auto", "http://127.0.0.1:11434/v1", "json_schema"),  # Ollama
    ("Qwen/Qwen2.5-7B-Instruct", "vllm", "http://10.0.0.5:8000/v1", "json_schema"),
    ("deepseek-chat", "auto", "https://api.deepseek.com/v1", "json_object"),
    ("qwen-plus", "auto", "https://dashscope.aliyuncs.com/compatible-mode/v1", "json_object"),
    ("qwen2.5", "auto", "http://10.0.0.5:8000/v1", "json_object"),  # unknown server: the family
    ("claude-3-5-sonnet", "generic", None, "none"),
    ("scripted", "auto", None, "none"),
])
def test_profiles_say_which_json_mode(model: str, provider: str, url: str | None, mode: str) -> None:
    assert structured_output_for(model, ContextSettings(), provider, url) == mode


def test_a_profile_override_wins_and_bad_values_are_named() -> None:
    ctx = msgspec.convert({"profiles": {"my-*": {"structured_output": "none"}}}, ContextSettings)
    assert structured_output_for("my-model", ctx, "openai", None) == "none"
    assert profile_for("my-model", ctx).structured_output == "none"
    bad = msgspec.convert({"profiles": {"x*": {"structured_output": "xml"}}}, ContextSettings)
    with pytest.raises(ValueError, match="structured_output must be one of"):
        structured_output_for("x1", bad)
    with pytest.raises(ValueError, match="llm.provider must be one of"):
        provider_for("openia", None)


def test_the_runtime_asks_the_configured_endpoint_as_its_provider_says() -> None:
    llm = LLMSettings(base_url="http://127.0.0.1:9/v1", api_key="k", model="fake-model", provider="vllm")
    assert summary_output(OpenAIChatModel(llm), Settings(llm=llm)) == "json_schema"
    assert summary_output(ScriptedModel(), Settings(llm=llm)) == "none"  # not that endpoint's client


def test_the_schema_is_strict_and_complete() -> None:
    fmt = response_format("json_schema")
    assert fmt["json_schema"]["strict"] is True and fmt["json_schema"]["schema"] is SUMMARY_SCHEMA
    assert SUMMARY_SCHEMA["additionalProperties"] is False
    assert set(SUMMARY_SCHEMA["required"]) == set(SUMMARY_SCHEMA["properties"])
    assert response_format("json_object") == {"type": "json_object"} and response_format("none") is None


# -- the tolerant reader ---------------------------------------------------------------------


def test_trailing_commas_fences_and_sentences_are_tolerated() -> None:
    body = '{"a": [1, 2,], "b": {"c": "x,}",},}'
    assert json.loads(extract_json(f"Sure! Here it is:\n```json\n{body}\n```\nAnything else?")) == \
        {"a": [1, 2], "b": {"c": "x,}"}}
    assert strip_trailing_commas('["a,]", 1 , ]') == '["a,]", 1  ]'
    with pytest.raises(ValueError, match="prose"):
        extract_json("The user wants charts in blue.")


# -- the summarizer's requests ----------------------------------------------------------------


def test_the_mode_travels_as_response_format() -> None:
    for mode in ("json_schema", "json_object", "none"):
        model = ScriptedModel(then=faithful)
        summarize(model, mode)
        assert model.formats == [response_format(mode)]


def test_invalid_twice_then_valid_with_three_attempts_and_its_own_error_shown() -> None:
    answers = iter(['{"goal": "x", "active_constraints": [exclude holidays]}', "no JSON here, sorry"])
    model = ScriptedModel(then=lambda m, t: next(answers, None) or faithful(m, t))
    _, summary = summarize(model, max_attempts=3)
    assert summary.active_constraints == ["exclude holidays"] and len(model.calls) == 3
    retry = model.calls[2]
    assert retry[-2] == {"role": "assistant", "content": "no JSON here, sorry"}  # its own latest answer
    assert "not a valid summary: no JSON object" in retry[-1]["content"]


def test_with_no_valid_answer_the_reason_is_short_and_named() -> None:
    model = ScriptedModel(then="I'd rather describe it in words.")
    with pytest.raises(SummaryError) as err:
        summarize(model, max_attempts=2)
    assert str(err.value) == ("the summarizer gave no valid summary in 2 attempts "
                              "(last: no JSON object in the reply (it is prose, not JSON))")


def test_a_server_that_refuses_the_schema_is_asked_in_json_mode_then_plainly() -> None:
    with FakeOpenAIServer() as srv:
        srv.add_error(400, "response_format json_schema is not supported by this model")
        srv.add_error(400, "response_format json_object is not supported")
        srv.responder = lambda req: None  # then the queue: a valid answer below
        srv.add_text(json.dumps(fake_fields([{}, {"content": "[#1 user] exclude holidays"}])))
        model = OpenAIChatModel(LLMSettings(base_url=srv.base_url, api_key="k", model="fake-model", max_retries=0))
        summarizer = Summarizer(model, SummarySettings(), output="json_schema")

        async def main():
            try:
                return await summarizer.summarize(None, RECORDS, 0)
            finally:
                await model.aclose()

        summary = asyncio.run(main())
        formats = [r.get("response_format") for r in srv.requests]
    assert [f and f["type"] for f in formats] == ["json_schema", "json_object", None]
    assert summarizer.output == "none"  # remembered for the next refresh
    assert summary.active_constraints == ["exclude holidays"]


def test_another_refusal_does_not_weaken_the_mode() -> None:
    with FakeOpenAIServer() as srv:
        srv.add_error(400, "This model's maximum context length is 8192 tokens")
        model = OpenAIChatModel(LLMSettings(base_url=srv.base_url, api_key="k", model="fake-model", max_retries=0))
        summarizer = Summarizer(model, SummarySettings(), output="json_schema")

        async def main():
            try:
                return await summarizer.summarize(None, RECORDS, 0)
            finally:
                await model.aclose()

        with pytest.raises(SummaryError, match="maximum context length"):
            asyncio.run(main())
    assert summarizer.output == "json_schema"
