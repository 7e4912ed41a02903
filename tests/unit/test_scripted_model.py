"""ScriptedModel (test double) and the demo model used when no LLM is configured."""

from __future__ import annotations

import asyncio
import json

import pytest

from datadesk.domain.records import ToolCall, Usage
from datadesk.llm.base import ModelDelta, ModelReply, ModelStreamBroken
from datadesk.llm.scripted import (
    DEMO_BANNER,
    FINISHED_TEXT,
    ScriptedModel,
    ScriptStep,
    demo_model,
    parse_tool_result,
    tool_step,
)
from tests.conftest import until

TOOLS = [{"type": "function", "function": {"name": "sql_query", "parameters": {"type": "object"}}}]


def play(model, messages, tools=TOOLS):
    async def go():
        return [ev async for ev in model.stream(messages, tools)]

    return asyncio.run(go())


def user(text):
    return [{"role": "user", "content": text}]


def test_text_step_streams_chunks_then_reply():
    model = ScriptedModel(["Hello there, analyst!"], chunk_size=5)
    events = play(model, user("hi"))
    deltas, reply = events[:-1], events[-1]
    assert all(isinstance(d, ModelDelta) for d in deltas) and len(deltas) == 5
    assert "".join(d.text for d in deltas) == "Hello there, analyst!"
    assert isinstance(reply, ModelReply) and reply.content == "Hello there, analyst!"
    assert reply.tool_calls == [] and reply.finish_reason == "stop" and reply.model == "scripted"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


def test_tool_step_and_exhaustion():
    call = ToolCall(id="call_1", name="sql_query", arguments='{"sql": "select 1"}')
    model = ScriptedModel([ScriptStep(tool_calls=[call]), "done"])
    first = play(model, user("q"))
    assert len(first) == 1 and first[0].tool_calls == [call] and first[0].finish_reason == "tool_calls"
    assert play(model, user("q"))[-1].content == "done"
    assert play(model, user("q"))[-1].content == FINISHED_TEXT
    assert play(model, user("q"))[-1].content == FINISHED_TEXT
    assert model.remaining == 0


def test_tool_step_helper():
    step = tool_step("sql_query", {"sql": "select 2"}, call_id="c9")
    assert step.tool_calls == [ToolCall(id="c9", name="sql_query", arguments='{"sql": "select 2"}')]


def test_callable_steps_see_the_context():
    def react(messages, tools):
        last = messages[-1]
        return f"tool said {last['content']} via {tools[0]['function']['name']}"

    async def areact(messages, tools):
        await asyncio.sleep(0)
        return ScriptStep(text=f"{len(messages)} messages")

    model = ScriptedModel([tool_step("sql_query", {"sql": "x"}, call_id="c1"), react, areact])
    play(model, user("go"))
    ctx = user("go") + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "sql_query", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    assert play(model, ctx)[-1].content == "tool said 42 via sql_query"
    assert play(model, ctx)[-1].content == "3 messages"


def test_calls_are_recorded_as_copies():
    model = ScriptedModel(["a", "b"])
    msgs = user("first")
    play(model, msgs)
    msgs[0]["content"] = "mutated"
    msgs.append({"role": "user", "content": "second"})
    play(model, msgs, tools=[])
    assert model.calls[0] == user("first")
    assert [m["content"] for m in model.calls[1]] == ["mutated", "second"]
    assert model.tools_seen == [TOOLS, []]


def test_max_recorded_bounds_memory():
    model = ScriptedModel([], max_recorded=2)
    for i in range(5):
        play(model, user(str(i)))
    assert [c[0]["content"] for c in model.calls] == ["3", "4"]


def test_explicit_usage_and_provider_fields():
    step = ScriptStep(text="x", usage=Usage(prompt_tokens=7, cached_tokens=5),
                      provider_fields={"reasoning_content": "hmm"})
    reply = play(ScriptedModel([step]), user("q"))[-1]
    assert reply.usage.cached_tokens == 5 and reply.provider_fields == {"reasoning_content": "hmm"}


def test_delay_lets_a_cancel_land_mid_reply():
    model = ScriptedModel([ScriptStep(text="a" * 40, delay_s=0.05)], chunk_size=4)
    seen = []

    async def consume():
        async for ev in model.stream(user("q"), []):
            seen.append(ev)

    async def go():
        task = asyncio.create_task(consume())
        await until(lambda: seen)  # the stream has begun
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert 1 <= len(seen) < 10 and all(isinstance(e, ModelDelta) for e in seen)


def test_gate_holds_the_step():
    async def go():
        gate = asyncio.Event()
        model = ScriptedModel([ScriptStep(text="released", gate=gate)])
        task = asyncio.create_task(_collect(model))
        await until(lambda: model.calls)  # the step is resolved: only the gate holds it now
        await asyncio.sleep(0.05)  # time in which it must not finish
        assert not task.done()
        gate.set()
        return await asyncio.wait_for(task, 1)

    events = asyncio.run(go())
    assert events[-1].content == "released"


async def _collect(model):
    return [ev async for ev in model.stream(user("q"), [])]


def test_error_step_raises_after_text():
    model = ScriptedModel([ScriptStep(text="partial", error=ModelStreamBroken("cut"))])
    seen = []

    async def go():
        async for ev in model.stream(user("q"), []):
            seen.append(ev)

    with pytest.raises(ModelStreamBroken):
        asyncio.run(go())
    assert "".join(e.text for e in seen) == "partial"


def test_bad_step_type_is_rejected():
    with pytest.raises(TypeError):
        play(ScriptedModel([42]), user("q"))


# -- demo model ---------------------------------------------------------------

def test_demo_model_is_labelled():
    model = demo_model()
    assert model.is_demo is True and model.name == "demo (no LLM configured)"


def _demo_round(question, tool_content):
    model = demo_model()
    first = play(model, user(question))[-1]
    [call] = first.tool_calls
    assert call.name == "sql_query"
    sql = json.loads(call.arguments)["sql"]
    ctx = user(question) + [
        {"role": "assistant", "content": first.content,
         "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "name": "sql_query", "content": tool_content},
    ]
    events = play(model, ctx)
    assert all(isinstance(e, ModelDelta) for e in events[:-1])
    return sql, events[-1]


def test_demo_queries_then_answers_with_numbers():
    result = {"columns": ["name", "city", "total_kwh"],
              "rows": [["Harbor Tower", "Oslo", 123456.5], ["Mill House", "Bergen", 98765.25]], "row_count": 2}
    sql, reply = _demo_round("Which buildings use the most energy?", json.dumps(result))
    assert "FROM readings" in sql and "LIMIT 5" in sql
    assert reply.content.startswith("**Demo model — no LLM is configured.**")
    assert "DATADESK_LLM_BASE_URL" in reply.content and "DATADESK_LLM_MODEL" in reply.content
    assert "Harbor Tower" in reply.content and "123,456.5" in reply.content and reply.tool_calls == []


def test_demo_month_question_and_trailing_notice():
    content = json.dumps({"columns": ["month", "total_kwh"], "rows": [["2024-01", 5000.0], ["2024-02", 4200]]})
    content += "\n(notice: result truncated to 2 rows; full result saved as an artifact)"
    sql, reply = _demo_round("Show the monthly consumption", content)
    assert "month" in sql.lower()
    assert "2024-01" in reply.content and "5,000" in reply.content and "4,200" in reply.content


def test_demo_survives_unparseable_tool_result():
    _, reply = _demo_round("temperature effect?", "Error: Catalog Error: Table readings does not exist")
    assert reply.content.startswith(DEMO_BANNER) and "Table readings does not exist" in reply.content


def test_demo_without_sql_tool_just_answers():
    reply = play(demo_model(), user("hello"), tools=[])[-1]
    assert reply.tool_calls == [] and reply.content.startswith(DEMO_BANNER)


def test_parse_tool_result():
    assert parse_tool_result('{"columns":["a"],"rows":[[1]]}\nmore text') == {"columns": ["a"], "rows": [[1]]}
    assert parse_tool_result("not json") is None
    assert parse_tool_result('{"other": 1}') is None


@pytest.mark.parametrize("question", [
    "top buildings", "per month please", "holidays vs normal days", "does temperature matter",
    "occupancy effect", "compare hvac types", "which city uses most",
])
def test_demo_sql_runs_on_the_demo_schema(question):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.execute("CREATE TABLE buildings(building_id INTEGER, name VARCHAR, city VARCHAR, floor_area_m2 DOUBLE,"
                " year_built INTEGER, hvac_type VARCHAR)")
    con.execute("CREATE TABLE readings(building_id INTEGER, ts TIMESTAMP, kwh DOUBLE, temperature_c DOUBLE,"
                " occupancy INTEGER)")
    con.execute("CREATE TABLE holidays(date DATE, name VARCHAR)")
    con.execute("INSERT INTO buildings VALUES (1,'A','Oslo',1000,1990,'heat_pump'),(2,'B','Bergen',500,2005,'gas')")
    con.execute("INSERT INTO readings VALUES (1,'2024-01-01 10:00',12.5,-3.2,40),(2,'2024-02-03 11:00',7,4.5,12)")
    con.execute("INSERT INTO holidays VALUES ('2024-01-01','New Year')")
    first = play(demo_model(), user(question))[-1]
    sql = json.loads(first.tool_calls[0].arguments)["sql"]
    assert con.execute(sql).fetchall()
