"""The context builder in real turns: cache-stable prefix, calibration, compaction and paging,
chunked trimming, profiles, the manifest endpoint, oversized messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datadesk.context.builder import ContextBuilder, Preamble
from datadesk.store.threads import Thread
from datadesk.context.calibration import Calibration
from datadesk.domain.records import Record, ToolCall
from datadesk.llm.client import OpenAIChatModel
from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.llm.tokens import count_tokens
from datadesk.settings import ContextSettings, LLMSettings, ModelProfileSettings
from datadesk.store.threadlog import ThreadLog
from tests.scenarios import SEED, chart_specs, register_chart_spec
from tests.conftest import parse_sse
from tests.fakes.openai_server import FakeOpenAIServer


def llm(server: FakeOpenAIServer) -> OpenAIChatModel:
    return OpenAIChatModel(LLMSettings(base_url=server.base_url, api_key="k", model="fake-model",
                                       retry_backoff_s=0.01))


def raw_tokens(req: dict) -> int:
    """What our builder estimates for a request, before calibration."""
    total = sum(count_tokens(json.dumps(t, separators=(",", ":"))) for t in req.get("tools", []))
    for m in req["messages"]:
        total += 4 + count_tokens(m.get("content") or "" if isinstance(m.get("content"), (str, type(None)))
                                  else "".join(p.get("text", "") for p in m["content"]))
        for c in m.get("tool_calls") or ():
            total += count_tokens(c["function"]["name"]) + count_tokens(c["function"]["arguments"]) + 4
    return total


def test_stable_prefix_and_calibration_converges(harness_factory) -> None:
    with FakeOpenAIServer() as fake:
        fake.usage_fn = lambda req: round(1.3 * raw_tokens(req))
        for i in range(4):
            fake.add_tool_calls([{"id": f"call_{i}", "name": "sql_query",
                                  "arguments": {"sql": f"SELECT {i} AS n"}}])
            fake.add_text(f"answer {i}", cached_tokens=100)
        h = harness_factory(llm(fake))
        with h.client("bob", served=True, timeout=60) as api:
            c, tid = api.client, api.tid
            for i in range(4):
                parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": f"question {i}"}).text)
            ctx = c.get(f"/api/threads/{tid}/context").json()
            assert c.get(f"/api/threads/{tid}/context", headers=h.auth("alice")).status_code == 404
        firsts = {json.dumps(r["messages"][0]) for r in fake.requests}
        tools = {json.dumps(r["tools"]) for r in fake.requests}
        assert len(fake.requests) == 8 and len(firsts) == 1 and len(tools) == 1  # byte-for-byte stable
    assert ctx["calibration"] == pytest.approx(1.3 * 1.05, rel=0.02)
    assert ctx["usage"]["prompt_tokens"] == pytest.approx(ctx["estimated_tokens"], rel=0.1)
    assert ctx["cache_ratio"] == pytest.approx(100 / ctx["usage"]["prompt_tokens"], rel=0.01)
    assert ctx["regions"]["tools"] > 0 and ctx["water"] == "ok" and ctx["profile"] == "default"
    tdir = h.rt.threads.get(tid, "bob", ["demo"]).dir
    assert len((tdir / "context.jsonl").read_text().splitlines()) == 8




def test_seed_scenario_compacts_pages_back_and_trims_in_chunks(harness_factory) -> None:
    big = chart_specs(1500)
    steps: list = [tool_step("sql_query", {"sql": "SELECT date_trunc('day', ts) d, sum(kwh) FROM readings "
                                                  "WHERE ts >= '2025-01-01' GROUP BY 1"}, call_id="call_q"),
                   "Energy last month, holidays excluded: ..."]
    for i in range(1, 16):
        steps += [tool_step("chart_spec", {"variant": i}, call_id=f"call_c{i}"), f"Updated colours ({i})."]
    steps += [tool_step("read_tool_result", {"call_id": "call_c1", "limit": 50_000}, call_id="call_back"),
              "Here is the first spec again."]
    model = ScriptedModel(steps)
    h = harness_factory(model, context={"history_budget_tokens": 7_000})

    register_chart_spec(h.rt, big)
    with h.client("bob", served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        c.post(f"/api/threads/{tid}/messages", json={"content": SEED})
        for i in range(1, 16):
            c.post(f"/api/threads/{tid}/messages", json={"content": f"make the chart colours warmer ({i})"})
        events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "show spec 1 again"}).text)
        tdir = h.rt.threads.get(tid, "bob", ["demo"]).dir
    back = next(d for e, d in events if e == "tool.finished" and d["call_id"] == "call_back")
    records = list(ThreadLog(tdir / "log.jsonl"))
    paged = next(r for r in records if r.tool_call_id == "call_back").content
    assert big[1] in paged  # brought back whole
    assert back["ok"]
    # old results are stubs in later requests, recent ones are capped, none is lost in the log
    late = model.calls[-2]
    tool_msgs = {m["tool_call_id"]: m["content"] for m in late if m["role"] == "tool"}
    old = [cid for cid in tool_msgs if cid.startswith("call_c") and int(cid[6:]) < 14]
    assert old and all('read_tool_result("' in tool_msgs[cid] and "compacted result of chart_spec" in tool_msgs[cid]
                       for cid in old)
    assert any("more chars" in tool_msgs.get(f"call_c{i}", "") for i in (14, 15))
    assert all(r.content == big[int(r.tool_call_id[6:])] for r in records if (r.tool_call_id or "").startswith("call_c"))
    # the window trims in chunks: its start moves rarely, by at least 20% of the budget
    manifests = [json.loads(x) for x in (tdir / "context.jsonl").read_text().splitlines()]
    starts = [m["first_seq"] for m in manifests]
    moves = [i for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert moves and len(moves) < len(starts) / 3
    for m in manifests:
        assert m["regions"]["history"] + m["regions"]["current"] <= 7_000 * 1.01 or m["first_seq"] == m["last_seq"]
    assert manifests[-1]["trimmed_through_seq"] > 0 and any(m["compacted"] for m in manifests)
    assert SEED not in json.dumps(model.calls[-1]) or manifests[-1]["first_seq"] == 1


def _thread_with_images_and_reasoning(tdir: Path) -> None:
    log = ThreadLog(tdir / "log.jsonl")
    add = lambda **kw: log.append(lambda seq: Record(seq=seq, ts=1.0, **kw))  # noqa: E731
    add(role="user", content="plot it")
    add(role="assistant", content="", tool_calls=[ToolCall("c1", "python", '{"code": "plt.show()"}')],
        provider_fields={"reasoning_content": "I should plot"})
    add(role="tool", tool_call_id="c1", name="python", content="status: ok\nimage: artifact aimg1",
        meta={"images": ["aimg1"]})
    add(role="assistant", content="Here it is.", provider_fields={"reasoning_content": "done"})
    add(role="user", content="thanks")


def _builder(tmp: Path, **profiles) -> ContextBuilder:
    settings = ContextSettings(profiles={k: ModelProfileSettings(**v) for k, v in profiles.items()})
    return ContextBuilder(settings, count_tokens, Calibration(tmp / "cal.json", 0.05),
                          artifact_status=lambda d, a: "ready",
                          image_bytes=lambda d, a: b"\x89PNG\r\n\x1a\nfake")


@pytest.mark.parametrize("model,vision,preamble_role", [
    ("gpt-4o-mini", True, "system"),
    ("qwen2.5-72b-instruct", False, "user"),
])
def test_profiles_shape_the_request(tmp_path: Path, model, vision, preamble_role) -> None:
    from tests.validators import validate_anthropic, validate_openai

    _thread_with_images_and_reasoning(tmp_path)
    built = _builder(tmp_path).build(Thread(tmp_path), model=model, system_prompt="sys", tools=[],
                                     turn_id="t", step=1, preamble=Preamble(text="goal: energy; constraint: exclude holidays"))
    msgs = built.messages
    assert msgs[1]["role"] == preamble_role and "may be outdated" in msgs[1]["content"]
    validate_openai(msgs)
    if preamble_role == "user":
        validate_anthropic(msgs)
    image_parts = [p for m in msgs if isinstance(m.get("content"), list) for p in m["content"]
                   if p.get("type") == "image_url"]
    if vision:
        assert len(image_parts) == 1 and built.manifest.images == ["aimg1"]
        after = msgs[[i for i, m in enumerate(msgs) if m["role"] == "tool"][-1] + 1]
        assert after["role"] == "user" and after["content"][0]["text"] == "images produced by the previous tool call"
    else:
        assert not image_parts and "[image aimg1.png, artifact aimg1]" in json.dumps(msgs)
    assert all("reasoning_content" not in m for m in msgs)


@pytest.mark.parametrize("data,mime", [
    (b"\x89PNG\r\n\x1a\nfake", "image/png"),
    (b"\xff\xd8\xff\xe0fake-jpeg", "image/jpeg"),
    (b"GIF89afake", "image/gif"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 fake", "image/webp"),
])
def test_images_travel_with_their_own_media_type(tmp_path: Path, data: bytes, mime: str) -> None:
    """A JPEG, GIF or WebP chart or upload is sent as what it is, not labelled image/png."""
    _thread_with_images_and_reasoning(tmp_path)
    settings = ContextSettings()
    builder = ContextBuilder(settings, count_tokens, Calibration(tmp_path / "cal.json", 0.05),
                             artifact_status=lambda d, a: "ready", image_bytes=lambda d, a: data)
    built = builder.build(Thread(tmp_path), model="gpt-4o-mini", system_prompt="sys", tools=[], turn_id="t", step=1)
    urls = [p["image_url"]["url"] for m in built.messages if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]
    assert len(urls) == 1 and urls[0].startswith(f"data:{mime};base64,")


def test_reasoning_is_replayed_when_the_profile_says_so(tmp_path: Path) -> None:
    _thread_with_images_and_reasoning(tmp_path)
    built = _builder(tmp_path, **{"deepseek*": {"replay_reasoning": True}}).build(
        Thread(tmp_path), model="deepseek-r1", system_prompt="sys", tools=[], turn_id="t", step=1)
    assert [m.get("reasoning_content") for m in built.messages if m["role"] == "assistant"] == [
        "I should plot", "done"]


def test_water_levels_and_refusal(tmp_path: Path) -> None:
    log = ThreadLog(tmp_path / "log.jsonl")
    log.append(lambda seq: Record(seq=seq, role="user", ts=1.0, content="word " * 7_000))
    small = _builder(tmp_path, **{"tiny*": {"window_tokens": 8_000, "reserved_output_tokens": 1_000}})
    with pytest.raises(Exception, match=r"about [\d,]+ tokens but tiny-model takes 7,000.*current"):
        small.build(Thread(tmp_path), model="tiny-model", system_prompt="sys", tools=[], turn_id="t", step=1)
    mid = _builder(tmp_path, **{"mid*": {"window_tokens": 9_000, "reserved_output_tokens": 1_000}})
    built = mid.build(Thread(tmp_path), model="mid-model", system_prompt="sys", tools=[], turn_id="t", step=1)
    assert built.manifest.water == "compact" and built.manifest.level > 0.85
    tools = [{"type": "function", "function": {"name": f"t{i}", "description": "d " * 400,
                                                 "parameters": {"type": "object"}}} for i in range(5)]
    with pytest.raises(Exception, match=r"tool definitions take .* largest: t\d"):
        mid.build(Thread(tmp_path), model="mid-model", system_prompt="sys", tools=tools, turn_id="t", step=1)


def test_oversized_messages_become_artifacts_or_are_refused(harness_factory) -> None:
    from tests.fakes.sandbox import FakeSandbox

    model = ScriptedModel(then="ok")
    h = harness_factory(model)
    FakeSandbox(h.rt)
    csv = "building,kwh\n" + "".join(f"B{i % 20:02d},{i * 0.5}\n" for i in range(150_000))
    with h.client(served=True, timeout=60) as api:
        c, tid = api.client, api.tid
        r = c.post(f"/api/threads/{tid}/messages", json={"content": csv})
        assert r.status_code == 200 and parse_sse(r.text)[-1][1]["status"] == "ok"
        rec = c.get(f"/api/threads/{tid}").json()["records"][0]
        assert "pasted a table" in rec["content"] and "rows: 150,000" in rec["content"]
        assert count_tokens(rec["content"]) < 2_500
        assert c.get(f"/api/threads/{tid}/artifacts").json()[0]["rows"] == 150_000
        r = c.post(f"/api/threads/{tid}/messages", json={"content": "lorem ipsum dolor " * 60_000})
        assert r.status_code == 413 and "too long for the model" in r.json()["error"]
    assert len(model.calls) == 1
