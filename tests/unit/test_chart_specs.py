"""Vega-Lite specs from the kernel (tools/charts.py): what is kept, what is refused and why, and
the title each chart gets."""

from __future__ import annotations

import json

import pytest

from datadesk.sandbox.base import ChartOutput
from datadesk.sandbox.execution import ExecutionCollector
from datadesk.tools.charts import ChartRefused, chart_title, checked_spec, save_charts

MIME = "application/vnd.vegalite.v5+json"
BAR = {"data": {"values": [{"k": "a", "v": 1}]}, "mark": "bar",
       "encoding": {"x": {"field": "k", "type": "nominal"}, "y": {"field": "v", "type": "quantitative"}}}


def test_a_spec_is_kept_as_compact_json() -> None:
    data, spec = checked_spec(ChartOutput(MIME, BAR))
    assert json.loads(data) == BAR == spec and b" " not in data


def test_a_spec_as_json_text_is_read() -> None:
    assert checked_spec(ChartOutput(MIME, json.dumps(BAR)))[1] == BAR


@pytest.mark.parametrize("spec, words", [
    ([1, 2], "must be a JSON object, not list"),
    ("{not json", "not valid JSON"),
    ({"data": {"values": []}}, "no mark, layer, concat"),
    ({"layer": [{"data": {"url": "https://x.test/a.csv"}, "mark": "bar"}]}, "its data names a url"),
])
def test_bad_specs_are_refused_naming_what_is_wrong(spec, words) -> None:
    with pytest.raises(ChartRefused, match=words):
        checked_spec(ChartOutput(MIME, spec))


def test_a_spec_over_the_cap_says_to_aggregate_first() -> None:
    big = {**BAR, "data": {"values": [{"k": str(i), "v": i} for i in range(5000)]}}
    with pytest.raises(ChartRefused) as exc:
        checked_spec(ChartOutput(MIME, big), limit=10_000)
    assert "5,000 data rows" in str(exc.value) and "aggregate first" in str(exc.value)


def test_nan_is_refused_with_the_fix() -> None:
    saved, lines = save_charts([ChartOutput(MIME, {**BAR, "data": {"values": [{"k": "a", "v": float("nan")}]}})],
                               lambda *a: pytest.fail("saved"))
    assert saved == [] and "NaN" in lines[0]


@pytest.mark.parametrize("spec, title", [
    ({**BAR, "title": "Sales"}, "Sales"),
    ({**BAR, "title": {"text": ["Sales", "2024"]}}, "Sales 2024"),
    ({"layer": [BAR, {**BAR, "title": "Inner"}]}, "Inner"),
    ({**BAR, "encoding": {"x": {"field": "k"}, "y": {"field": "v", "aggregate": "sum"}}}, "sum of v by k"),
    ({**BAR, "encoding": {"x": {"field": "k", "title": "Region"}, "y": {"field": "v", "title": "Total"}}},
     "Total by Region"),
    ({"mark": "bar"}, None),
])
def test_chart_titles(spec, title) -> None:
    assert chart_title(spec) == title


def test_the_collector_takes_charts_and_drops_altairs_text_stand_in(tmp_path) -> None:
    c = ExecutionCollector(tmp_path)
    c.on_iopub({"msg_type": "execute_result", "content": {"data": {
        "application/vnd.vegalite.v6.json": BAR, "text/plain": "<VegaLite 6 object>"}}})
    c.on_iopub({"msg_type": "display_data", "content": {"data": {MIME: BAR, "text/plain": "alt"}}})
    r = c.finish({"content": {"status": "ok"}})
    assert [ch.mime for ch in r.charts] == ["application/vnd.vegalite.v6.json", MIME]
    assert r.result is None and r.stdout == ""
