"""OpenAIChatModel against a real fake OpenAI server over real HTTP (no mocks of the SDK), each
test under both HTTP clients the SDK can use (`llm.http_client`: aiohttp, the default where it is
installed, and httpx)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any

import httpx
import pytest

from datadesk.llm.base import (
    ModelAuthError,
    ModelDelta,
    ModelError,
    ModelNotFound,
    ModelProtocolError,
    ModelReply,
    ModelStreamBroken,
    ModelUnavailable,
)
from datadesk.llm.client import OpenAIChatModel, _retry_after, http_client
from datadesk.settings import LLMSettings, SettingsError, load_settings
from tests.fakes.openai_server import FakeOpenAIServer

KEY = "sk-test-SECRET-0123456789"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "sql_query", "description": "run SQL",
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]


TRANSPORT = {"http_client": "aiohttp"}


@pytest.fixture(autouse=True, params=["aiohttp", "httpx"])
def transport(request):
    """Every test once per HTTP client under the SDK."""
    TRANSPORT["http_client"] = request.param
    yield request.param
    TRANSPORT["http_client"] = "aiohttp"


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer() as s:
        yield s


@pytest.fixture
def srv(server):
    server.clear()
    yield server
    server.clear()


def settings(srv: FakeOpenAIServer, **kw: Any) -> LLMSettings:
    base = dict(base_url=srv.base_url, api_key=KEY, model="fake-model", retry_backoff_s=0.01,
                max_retries=2, timeout_s=5.0, http_client=TRANSPORT["http_client"])
    base.update(kw)
    return LLMSettings(**base)


def collect(cfg: LLMSettings, messages=MESSAGES, tools=()) -> tuple[list[str], ModelReply | None, Exception | None]:
    """Run one stream to the end: (delta texts, final reply, error)."""

    async def go():
        model = OpenAIChatModel(cfg)
        deltas, reply, error = [], None, None
        try:
            async for ev in model.stream(list(messages), list(tools)):
                if isinstance(ev, ModelDelta):
                    assert reply is None, "delta after the reply"
                    deltas.append(ev.text)
                else:
                    assert isinstance(ev, ModelReply) and reply is None
                    reply = ev
        except ModelError as exc:
            error = exc
        finally:
            await model.aclose()
        return deltas, reply, error

    return asyncio.run(go())


def test_text_is_streamed_in_pieces_and_assembled(srv):
    srv.add_text("The answer is forty-two.", chunks=4)
    deltas, reply, error = collect(settings(srv))
    assert error is None
    assert len(deltas) == 4 and "".join(deltas) == "The answer is forty-two."
    assert reply.content == "The answer is forty-two." and reply.tool_calls == []
    assert reply.finish_reason == "stop" and reply.model == "fake-model"
    body = srv.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == MESSAGES and body["model"] == "fake-model"
    assert "tools" not in body and "temperature" not in body  # omitted, not sent empty
    assert srv.request_headers[0]["authorization"] == f"Bearer {KEY}"


def test_tools_and_temperature_are_sent(srv):
    srv.add_text("ok")
    _, reply, error = collect(settings(srv, temperature=0.2), tools=TOOLS)
    assert error is None and reply.content == "ok"
    assert srv.requests[0]["tools"] == TOOLS and srv.requests[0]["temperature"] == 0.2


def test_missing_api_key_sends_placeholder(srv):
    srv.add_text("ok")
    _, reply, error = collect(settings(srv, api_key=None))
    assert error is None and srv.request_headers[0]["authorization"] == "Bearer not-needed"


def test_tool_call_arguments_split_across_chunks(srv):
    args = {"sql": "SELECT building_id, sum(kwh) FROM readings GROUP BY 1 ORDER BY 2 DESC LIMIT 5"}
    srv.add_tool_calls([{"id": "call_1", "name": "sql_query", "arguments": args}], arg_chunks=7)
    deltas, reply, error = collect(settings(srv), tools=TOOLS)
    assert error is None and deltas == []
    assert reply.finish_reason == "tool_calls"
    [call] = reply.tool_calls
    assert (call.id, call.name) == ("call_1", "sql_query")
    assert json.loads(call.arguments) == args


def test_parallel_tool_calls_interleaved(srv):
    calls = [{"id": f"call_{i}", "name": f"tool_{i}", "arguments": {"n": i, "pad": "x" * 20}} for i in range(3)]
    srv.add_tool_calls(calls, text="Let me check.", interleave=True, arg_chunks=4)
    deltas, reply, error = collect(settings(srv), tools=TOOLS)
    assert error is None and "".join(deltas) == "Let me check." == reply.content
    assert [c.id for c in reply.tool_calls] == ["call_0", "call_1", "call_2"]
    assert [c.name for c in reply.tool_calls] == ["tool_0", "tool_1", "tool_2"]
    assert [json.loads(c.arguments)["n"] for c in reply.tool_calls] == [0, 1, 2]


def test_empty_arguments_become_empty_object(srv):
    srv.add_tool_calls([{"id": "c", "name": "list_tables", "arguments": ""}])
    _, reply, _ = collect(settings(srv))
    assert reply.tool_calls[0].arguments == "{}"


def test_tool_call_without_name_is_a_protocol_error(srv):
    srv.add_tool_calls([{"id": "c", "name": None, "arguments": {"x": 1}}])
    _, reply, error = collect(settings(srv))
    assert reply is None and isinstance(error, ModelProtocolError) and "name" in str(error)
    assert len(srv.requests) == 1  # not retried: the endpoint would do it again


def test_usage_with_cached_tokens(srv):
    srv.add_text("hello", prompt_tokens=1200, completion_tokens=3, cached_tokens=1024)
    _, reply, _ = collect(settings(srv))
    u = reply.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens) == (1200, 3, 1203, 1024)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields_kept_raw(srv, field):
    srv.add_text("42.", reasoning="First think, then answer.", reasoning_field=field, chunks=3)
    deltas, reply, _ = collect(settings(srv))
    assert "".join(deltas) == "42."  # reasoning is never shown as answer text
    assert reply.provider_fields == {field: "First think, then answer."}


def test_no_provider_fields_is_none(srv):
    srv.add_text("plain")
    _, reply, _ = collect(settings(srv))
    assert reply.provider_fields is None


def test_429_then_success_is_retried_honouring_retry_after(srv):
    srv.add_error(429, retry_after=0.3)
    srv.add_text("after the wait")
    started = time.monotonic()
    deltas, reply, error = collect(settings(srv))
    assert error is None and reply.content == "after the wait" and "".join(deltas) == reply.content
    assert len(srv.requests) == 2
    assert time.monotonic() - started >= 0.3


def test_huge_retry_after_is_not_waited_for(srv):
    srv.add_error(429, retry_after=3600)
    srv.add_text("soon")
    started = time.monotonic()
    _, reply, error = collect(settings(srv))
    assert error is None and reply.content == "soon" and time.monotonic() - started < 5


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_retried(srv, status):
    srv.add_error(status)
    srv.add_text("recovered")
    _, reply, error = collect(settings(srv))
    assert error is None and reply.content == "recovered" and len(srv.requests) == 2


def test_retries_exhausted_is_unavailable(srv):
    for _ in range(5):
        srv.add_error(503)
    _, reply, error = collect(settings(srv, max_retries=2))
    assert reply is None and isinstance(error, ModelUnavailable)
    assert "503" in str(error) and srv.base_url in str(error) and "2 retries" in str(error)
    assert len(srv.requests) == 3


def test_no_retries_configured(srv):
    srv.add_error(429)
    _, _, error = collect(settings(srv, max_retries=0))
    assert isinstance(error, ModelUnavailable) and "429" in str(error) and len(srv.requests) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_are_clear_and_not_retried(srv, status):
    srv.add_error(status, f"Incorrect API key provided: {KEY}.")  # servers may echo the key
    _, reply, error = collect(settings(srv))
    assert reply is None and isinstance(error, ModelAuthError)
    assert "rejected the API key" in str(error) and f"({status})" in str(error)
    assert KEY not in str(error) and len(srv.requests) == 1


def test_server_side_key_check(srv):
    strict = FakeOpenAIServer(api_key="right-key").start()
    try:
        _, _, error = collect(settings(strict, api_key="wrong-key"))
        assert isinstance(error, ModelAuthError)
        _, reply, error = collect(settings(strict, api_key="right-key"))
        assert error is None and reply.content
    finally:
        strict.stop()


def test_unknown_model_is_not_found(srv):
    _, reply, error = collect(settings(srv, model="gpt-nonexistent"))
    assert reply is None and isinstance(error, ModelNotFound)
    assert "gpt-nonexistent" in str(error) and srv.base_url in str(error)
    assert len(srv.requests) == 1


def test_model_missing_reported_as_400_is_not_found(srv):
    srv.add_error(400, "Invalid model name passed in model=foo", code=None)
    _, _, error = collect(settings(srv))
    assert isinstance(error, ModelNotFound) and "fake-model" in str(error)


def test_other_400_is_a_plain_model_error_not_retried(srv):
    srv.add_error(400, "This model's maximum context length is 8192 tokens.", code="context_length_exceeded")
    _, _, error = collect(settings(srv))
    assert type(error) is ModelError and "maximum context length" in str(error) and len(srv.requests) == 1


def test_stream_options_rejected_falls_back(srv):
    srv.add_error(400, "Unrecognized request argument supplied: stream_options")
    srv.add_text("old server")
    _, reply, error = collect(settings(srv))
    assert error is None and reply.content == "old server"
    assert "stream_options" in srv.requests[0] and "stream_options" not in srv.requests[1]


def test_garbage_sse_is_a_protocol_error(srv):
    srv.add_garbage()
    _, reply, error = collect(settings(srv))
    assert reply is None and isinstance(error, ModelProtocolError) and len(srv.requests) == 1


def test_non_sse_body_is_a_protocol_error(srv):
    srv.add_garbage(b"<html><body>Welcome to nginx!</body></html>", content_type="text/html")
    _, _, error = collect(settings(srv))
    assert isinstance(error, ModelProtocolError) and "OpenAI-compatible" in str(error)


def test_drop_after_text_is_broken_and_not_retried(srv):
    srv.add_drop_after(3, text="The first part of an answer that gets cut", chunks=4)
    srv.add_text("must not be used")
    deltas, reply, error = collect(settings(srv))
    assert reply is None and isinstance(error, ModelStreamBroken)
    assert deltas and "".join(deltas) == error.partial_text  # what the user saw
    assert len(srv.requests) == 1 and srv.pending == 1


def test_drop_before_any_text_is_retried(srv):
    srv.add_drop_after(1)  # only the role chunk went out: nothing reached the caller
    srv.add_text("second try")
    deltas, reply, error = collect(settings(srv))
    assert error is None and "".join(deltas) == "second try" and len(srv.requests) == 2


def test_timeout_is_retried_then_unavailable(srv):
    srv.add_text("too slow", delay_s=2)
    srv.add_text("too slow", delay_s=2)
    _, reply, error = collect(settings(srv, timeout_s=0.2, max_retries=1))
    assert reply is None and isinstance(error, ModelUnavailable) and "timeout" in str(error)
    assert len(srv.requests) == 2


def test_slow_stream_within_timeout_is_fine(srv):
    srv.add_text("slow but steady", delay_s=0.05, chunks=3)
    deltas, reply, error = collect(settings(srv, timeout_s=1))
    assert error is None and len(deltas) == 3 and reply.content == "slow but steady"


def test_endpoint_down_names_the_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}/v1"
    _, reply, error = collect(LLMSettings(base_url=url, api_key=KEY, model="m", retry_backoff_s=0.01, max_retries=1,
                                          http_client=TRANSPORT["http_client"]))
    assert reply is None and isinstance(error, ModelUnavailable)
    assert url in str(error) and "DATADESK_LLM_BASE_URL" in str(error) and KEY not in str(error)


def test_consumer_may_stop_early(srv):
    srv.add_text("a long answer in many pieces", chunks=6)
    srv.add_text("next")

    async def go():
        model = OpenAIChatModel(settings(srv))
        agen = model.stream(MESSAGES, [])
        first = await agen.__anext__()
        await agen.aclose()  # e.g. the user cancelled the turn
        events = [ev async for ev in model.stream(MESSAGES, [])]
        await model.aclose()
        return first, events[-1]

    first, last = asyncio.run(go())
    assert isinstance(first, ModelDelta) and last.content == "next"


def test_api_key_never_in_messages_or_logs(srv, caplog):
    caplog.set_level(logging.DEBUG)
    srv.add_error(429, f"slow down {KEY}")
    srv.add_error(500, f"boom {KEY}")
    srv.add_error(500, f"boom {KEY}")
    _, _, e1 = collect(settings(srv))
    srv.add_error(400, f"bad request for key {KEY}")
    _, _, e2 = collect(settings(srv))
    srv.add_error(404, f"no such model for {KEY}")
    _, _, e3 = collect(settings(srv))
    for err in (e1, e2, e3):
        assert err is not None and KEY not in str(err) and KEY not in repr(err.__cause__)
    assert caplog.records and KEY not in caplog.text


def test_base_url_credentials_are_not_shown():
    model = OpenAIChatModel(LLMSettings(base_url="https://bob:hunter2@llm.example.com/v1/?api-key=zzz", api_key=KEY))
    assert model.base_url == "https://llm.example.com/v1"
    assert model.name == "gpt-4o-mini" and model.is_demo is False
    asyncio.run(model.aclose())


def test_retry_after_parsing():
    assert _retry_after({"retry-after": "2"}) == 2.0
    assert _retry_after({"retry-after-ms": "250"}) == 0.25
    assert _retry_after({}) is None and _retry_after(None) is None
    assert _retry_after({"retry-after": "soon"}) is None
    assert 50 < _retry_after({"retry-after": time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                                                           time.gmtime(time.time() + 60))}) <= 61


def test_fake_server_non_streaming_and_models(srv):
    srv.add_tool_calls([{"id": "c1", "name": "sql_query", "arguments": {"sql": "select 1"}}], text="hm")
    r = httpx.post(f"{srv.base_url}/chat/completions", json={"model": "fake-model", "messages": MESSAGES})
    msg = r.json()["choices"][0]["message"]
    assert r.status_code == 200 and msg["content"] == "hm"
    assert msg["tool_calls"][0]["function"] == {"name": "sql_query", "arguments": '{"sql": "select 1"}'}
    models = httpx.get(f"{srv.base_url}/models").json()
    assert "fake-model" in {m["id"] for m in models["data"]}
    r = httpx.post(f"http://127.0.0.1:{srv.port}/chat/completions", json={"model": "fake-model", "messages": []})
    assert r.json()["choices"][0]["message"]["content"] == srv.default_text


def test_the_http_client_is_the_one_configured(transport):
    client = http_client(transport)
    if transport == "httpx":
        assert client is None  # the SDK's own default
    else:
        assert type(client).__name__.endswith("AioHttpClient")
    assert type(http_client("auto")) is type(http_client("aiohttp"))  # installed here: auto takes it


def test_a_bad_http_client_setting_names_the_key(tmp_path):
    (tmp_path / "datadesk.toml").write_text('[llm]\nhttp_client = "curl"\n')
    with pytest.raises(SettingsError, match=r"llm\.http_client"):
        load_settings({"DATADESK_HOME": str(tmp_path)})


def test_credentials_in_the_base_url_are_sent_as_basic_auth(srv, transport):
    """httpx turns `user:secret@` into Basic auth; aiohttp refuses it next to the key's header, so
    `auto` sends such a URL with httpx and an explicit `aiohttp` says why it cannot."""
    url = srv.base_url.replace("http://", "http://dduser:s3cret-pw@")
    if transport == "aiohttp":
        with pytest.raises(ModelError, match=r"llm\.http_client = \"aiohttp\" cannot send a base URL with credentials"):
            OpenAIChatModel(settings(srv, base_url=url))
        cfg = settings(srv, base_url=url, http_client="auto")
    else:
        cfg = settings(srv, base_url=url)
    srv.add_text("hello there", chunks=2)
    deltas, reply, error = collect(cfg)
    assert error is None and "".join(deltas) == "hello there"
    import base64
    assert srv.request_headers[-1]["authorization"] == "Basic " + base64.b64encode(b"dduser:s3cret-pw").decode()
    assert http_client("auto", url) is None and http_client("httpx", url) is None
