"""Operating a server (issue 29 item 3) on the embedded set: `/api/ready` apart from
`/api/health`, `/metrics` behind `server.metrics_token`, the counters moving after a turn, and
JSON log lines that name the turn and the thread."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from datadesk.api.logs import JsonLines, TurnFields
from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.settings import iter_setting_names, load_settings
from tests.fakes.sandbox import FakeSandbox

TOKEN = "metrics-" + "t" * 24
SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT 3000"  # offloaded (rows > threshold)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of sample `name{labels}` in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)$", line)
        if m and m.group(1) == name and dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")) == labels:
            return float(m.group(3))
    return 0.0


def logging_step(messages, tools):
    """The model's first step: a log line from inside the turn (its task), then the SQL call."""
    logging.getLogger("tests.operate").warning("the model is asked (%d messages)", len(messages))
    return tool_step("sql_query", {"sql": SQL})


@pytest.fixture
def served(harness_factory):
    model = ScriptedModel([logging_step, "done"], then="ok")
    h = harness_factory(model, server={"metrics_token": TOKEN})
    FakeSandbox(h.rt)  # large results are offloaded only where python can read them
    with h.client() as api:
        yield h, api


def scrape(api) -> str:
    r = api.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


def test_ready_is_apart_from_health(served) -> None:
    _, api = served
    r = api.client.get("/api/ready")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and set(body["checks"]) == {"disk"} and body["checks"]["disk"]["ok"]
    assert api.client.get("/api/health").status_code == 200


def test_ready_fails_on_a_full_disk(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), store={"min_free_mb": 10**12})  # more than any disk
    with h.client(thread=False) as api:
        r = api.client.get("/api/ready")
        assert r.status_code == 503, r.text
        assert "store.min_free_mb" in r.json()["error"] and r.json()["ready"] is False
        assert api.client.get("/api/health").status_code == 200  # alive, just not ready


def test_metrics_token_refused_and_accepted(served) -> None:
    _, api = served
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        r = api.client.get("/metrics", headers={**headers, "Authorization": headers.get("Authorization", "")})
        assert r.status_code == 401, (headers, r.text)
        assert "server.metrics_token" in r.json()["error"]
    r = api.client.get("/metrics", headers={"Authorization": f"Bearer {api.h.tokens['alice']}"})
    assert r.status_code == 401  # a user's token is not the scraper's
    assert "datadesk_turns_running" in scrape(api)


def test_metrics_off_without_a_token(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client(thread=False) as api:
        r = api.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 404 and "server.metrics_token" in r.json()["error"]


def test_counters_move_after_a_turn(served) -> None:
    _, api = served
    before = scrape(api)
    events = api.turn("how much energy?")
    assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events[-3:]
    after = scrape(api)
    assert metric(after, "datadesk_turns_finished_total", outcome="ok") == \
        metric(before, "datadesk_turns_finished_total", outcome="ok") + 1
    assert metric(after, "datadesk_turn_duration_seconds_count", outcome="ok") >= 1
    assert metric(after, "datadesk_turns_running") == 0
    assert metric(after, "datadesk_tool_duration_seconds_count", tool="sql_query", outcome="ok") == \
        metric(before, "datadesk_tool_duration_seconds_count", tool="sql_query", outcome="ok") + 1
    assert metric(after, "datadesk_offload_rows_total") - metric(before, "datadesk_offload_rows_total") == 3000
    assert metric(after, "datadesk_offload_bytes_total", format="parquet") > \
        metric(before, "datadesk_offload_bytes_total", format="parquet")
    assert metric(after, "datadesk_http_responses_total", status="200") > \
        metric(before, "datadesk_http_responses_total", status="200")


def test_429_is_counted(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), server={"metrics_token": TOKEN, "request_burst_per_user": 3,
                                                          "requests_per_minute_per_user": 1})
    with h.client(thread=False) as api:
        before = metric(scrape(api), "datadesk_http_responses_total", status="429")
        codes = [api.client.get("/api/threads").status_code for _ in range(6)]
        assert 429 in codes
        assert metric(scrape(api), "datadesk_http_responses_total", status="429") == before + codes.count(429)


def test_json_log_lines_carry_the_turn_and_thread(served, caplog) -> None:
    h, api = served
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    keep = Keep()
    keep.setFormatter(JsonLines())
    keep.addFilter(TurnFields())
    root = logging.getLogger()
    root.addHandler(keep)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        events = api.turn("how much energy?")
        time.sleep(0.2)
    finally:
        root.removeHandler(keep)
        root.setLevel(level)
    turn_id = next(d["turn_id"] for e, d in events if e == "done")
    parsed = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "message", "pid"} <= set(p) for p in parsed)
    mine = [p for p in parsed if p.get("turn_id") == turn_id]
    asked = [p for p in parsed if p["logger"] == "tests.operate"]
    assert asked and all(p.get("turn_id") == turn_id for p in asked), parsed  # a line of the turn names it
    assert all(p["thread_id"] == api.tid for p in mine)


def test_json_formatter_keeps_tracebacks_and_outside_lines_plain() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom %s", ("now",), None)
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    TurnFields().filter(record)
    out = json.loads(JsonLines().format(record))
    assert out["message"] == "boom now" and "ValueError: bad" in out["exc"] and "turn_id" not in out


def test_settings_have_their_variables(tmp_path) -> None:
    s = load_settings({"DATADESK_HOME": str(tmp_path), "DATADESK_METRICS_TOKEN": "abc",
                       "DATADESK_LOG_FORMAT": "json"})
    assert s.server.metrics_token == "abc" and s.server.log_format == "json"
    assert {"server.metrics_token", "server.log_format"} <= set(iter_setting_names())
