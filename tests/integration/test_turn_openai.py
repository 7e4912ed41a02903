"""A full turn through the real HTTP API (uvicorn on 127.0.0.1), the real OpenAI client,
a fake OpenAI-compatible server, and the real DuckDB demo warehouse."""

from __future__ import annotations

import json

import httpx

from datadesk.llm.client import OpenAIChatModel
from datadesk.settings import LLMSettings
from tests.conftest import parse_sse, serve_app
from tests.fakes.openai_server import FakeOpenAIServer


N_READINGS = 20 * 24 * 397  # hourly, 20 buildings, 2024-01-01 .. 2025-01-31


def llm(server: FakeOpenAIServer, **kw) -> OpenAIChatModel:
    return OpenAIChatModel(LLMSettings(base_url=server.base_url, api_key="sk-test-secret", model="fake-model",
                                       retry_backoff_s=0.01, **kw))


def test_full_turn_with_parallel_tool_calls(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls(
            [
                {"id": "call_a", "name": "sql_query", "arguments": {"sql": "SELECT count(*) AS n FROM readings"}},
                {"id": "call_b", "name": "sql_query",
                 "arguments": {"sql": "SELECT count(*) AS n FROM buildings"}},
            ],
            arg_chunks=4, interleave=True,
        )
        fake.add_text("There are 190,080 readings from 20 buildings.", chunks=5, cached_tokens=128)
        h = harness_factory(llm(fake))
        with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=30) as c:
            tid = c.post("/api/threads", json={"title": "energy"}).json()["id"]
            resp = c.post(f"/api/threads/{tid}/messages", json={"content": "How many readings and buildings?"})
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = parse_sse(resp.text)
            detail = c.get(f"/api/threads/{tid}").json()

        # the second call of the same user waits for the first one's query slot, said as progress
        waits = [d["message"] for e, d in events if e == "tool.progress"]
        assert all(w.startswith("waiting for a query slot") for w in waits), waits
        kinds = [e for e, _ in events if e != "tool.progress"]
        # order: both tools start, both finish, then the streamed answer, completed, done
        assert kinds[:2] == ["tool.started", "tool.started"]
        assert sorted(kinds[2:4]) == ["tool.finished", "tool.finished"]
        # the 5 chunks of the answer, coalesced into fewer text events (chat/journal.py)
        assert set(kinds[4:-2]) == {"message.delta"} and 1 <= len(kinds[4:-2]) <= 5
        assert kinds[-2:] == ["message.completed", "done"]
        assert events[-1][1]["status"] == "ok"
        finished = {d["call_id"]: d for e, d in events if e == "tool.finished"}
        assert finished["call_a"]["ok"] and str(N_READINGS) in finished["call_a"]["preview"]
        assert "20" in finished["call_b"]["preview"]
        assert "".join(d["text"] for e, d in events if e == "message.delta") == \
            "There are 190,080 readings from 20 buildings."
        completed = events[-2][1]
        assert completed["usage"]["cached_tokens"] == 128

        # the log on disk: user, assistant with both calls, two tool records, final answer
        records = detail["records"]
        roles = [r["role"] for r in records]
        assert roles == ["user", "assistant", "tool", "tool", "assistant"]
        calls = records[1]["tool_calls"]
        assert [c["id"] for c in calls] == ["call_a", "call_b"]
        assert json.loads(calls[0]["arguments"]) == {"sql": "SELECT count(*) AS n FROM readings"}
        assert {r["tool_call_id"] for r in records[2:4]} == {"call_a", "call_b"}
        assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
        assert records[4]["content"].startswith("There are 190,080")
        assert records[4]["usage"]["cached_tokens"] == 128

        # the second model request carried both results, paired with their calls
        second = fake.requests[1]["messages"]
        assert second[0]["role"] == "system"
        assert [m["role"] for m in second[1:]] == ["user", "assistant", "tool", "tool"]
        assert [m["tool_call_id"] for m in second[3:5]] == ["call_a", "call_b"]
        assert str(N_READINGS) in second[3]["content"]
        names = [t["function"]["name"] for t in fake.requests[0]["tools"]]
        assert names[0] == "sql_query"
        assert {"requery_artifact", "read_tool_result", "load_skill", "compact"} <= set(names)
        assert "python" not in names  # the sandbox is off in this harness
        # the API key travelled only as the bearer header
        assert fake.request_headers[0]["authorization"] == "Bearer sk-test-secret"
        # one manifest per model request
        tdir = h.rt.threads.get(tid, "alice", ["demo"]).dir
        manifests = (tdir / "context.jsonl").read_text().splitlines()
        assert len(manifests) == 2 and json.loads(manifests[1])["last_seq"] == 4


def test_reasoning_content_is_stored_raw(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_text("42", reasoning="first I think")
        h = harness_factory(llm(fake))
        with h.client("bob", served=True, timeout=30) as api:
            c, tid = api.client, api.tid
            c.post(f"/api/threads/{tid}/messages", json={"content": "answer?"})
            rec = c.get(f"/api/threads/{tid}").json()["records"][-1]
    assert rec["provider_fields"]["reasoning_content"] == "first I think"
    assert rec["content"] == "42"


def test_model_errors_become_error_events_and_the_thread_continues(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.add_garbage()
        fake.add_error(401, "Incorrect API key provided")
        fake.add_text("back to normal")
        h = harness_factory(llm(fake, max_retries=0))
        with h.client("bob", served=True, timeout=30) as api:
            c, tid = api.client, api.tid
            first = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "one"}).text)
            second = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "two"}).text)
            third = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "three"}).text)
            records = c.get(f"/api/threads/{tid}").json()["records"]
    assert [e for e, _ in first] == ["error", "done"] and first[-1][1]["status"] == "error"
    assert second[0][1]["kind"] == "model" and "api key" in second[0][1]["message"].lower()
    assert "sk-test-secret" not in json.dumps(second)
    assert third[-2][0] == "message.completed" and third[-1][1]["status"] == "ok"
    assert [(r["role"], r.get("status", "ok")) for r in records] == [
        ("user", "ok"), ("assistant", "error"), ("user", "ok"), ("assistant", "error"),
        ("user", "ok"), ("assistant", "ok")]
    # failed steps are not replayed to the model
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["system", "user", "user", "user"]


def test_model_endpoint_down(harness_factory) -> None:
    from tests.conftest import free_port

    model = OpenAIChatModel(LLMSettings(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="k",
                                        model="m", max_retries=1, retry_backoff_s=0.01))
    h = harness_factory(model)
    with h.client("bob", served=True, timeout=30) as api:
        c, tid = api.client, api.tid
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "hi"}).text)
    assert events[0][0] == "error" and "127.0.0.1" in events[0][1]["message"]
    assert events[-1] == ("done", {"turn_id": events[-1][1]["turn_id"], "status": "error"})
