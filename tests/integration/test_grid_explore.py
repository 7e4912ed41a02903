"""The grid as an explorer (issue 32): column profiles, every filter kind, group-by, the chart
step and the question as title, over the 190,560-row demo artifact, checked against DuckDB over
the same data; bad filters are 400s naming the filter; CSV timestamps in their shortest form."""

from __future__ import annotations

import csv
import io
import json
from urllib.parse import urlencode

import duckdb
import pytest

from tests.integration.test_grid_api import N_READINGS, grid_env, rows  # noqa: F401  (grid_env: a fixture)


def get(client, h, aid, what, user="alice", **params):
    q = []
    for k, v in params.items():
        if k == "filter":
            q.append((k, json.dumps(v)))
            continue
        for item in (v if isinstance(v, list) else [v]):
            q.append((k, item))
    return client.get(f"/api/artifacts/{aid}/{what}?{urlencode(q)}", headers=h.auth(user))


def one(sql: str, tbl) -> object:  # noqa: ARG001  (tbl: read by DuckDB's replacement scan)
    return duckdb.sql(sql).fetchall()[0][0]


def test_profile_of_a_number_column(grid_env) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    r = get(client, h, aid, "profile", column="kwh", bins="10")
    assert r.status_code == 200, r.text
    p = r.json()
    lo, hi, mean, nulls, distinct = duckdb.sql(
        "SELECT min(kwh), max(kwh), avg(kwh), count(*) - count(kwh), count(DISTINCT kwh) FROM tbl").fetchall()[0]
    assert p["rows"] == N_READINGS and p["nulls"] == nulls and p["distinct"] == distinct
    assert p["min"] == pytest.approx(lo) and p["max"] == pytest.approx(hi) and p["mean"] == pytest.approx(mean)
    bins = p["histogram"]
    assert len(bins) == 10 and sum(b["count"] for b in bins) == N_READINGS - nulls
    assert bins[0]["low"] == pytest.approx(lo) and bins[-1]["high"] == pytest.approx(hi)
    width = (hi - lo) / 10
    third = one(f"SELECT count(*) FROM tbl WHERE kwh >= {lo + 3 * width} AND kwh < {lo + 4 * width}", tbl)
    assert abs(bins[3]["count"] - third) <= 2  # float edges: a value on a boundary may fall either side


def test_profile_of_text_and_date_columns_and_of_a_view(grid_env) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    p = get(client, h, aid, "profile", column="building_id").json()
    top = duckdb.sql("SELECT building_id, count(*) n FROM tbl GROUP BY 1 ORDER BY n DESC, 1 LIMIT 10").fetchall()
    assert [(t["value"], t["count"]) for t in p["top"]] == top
    assert p["top_other"] == N_READINGS - p["nulls"] - sum(n for _, n in top)
    assert p["distinct"] == one("SELECT count(DISTINCT building_id) FROM tbl", tbl)
    d = get(client, h, aid, "profile", column="ts").json()
    lo, hi = duckdb.sql("SELECT min(ts), max(ts) FROM tbl").fetchall()[0]
    assert d["min"] == lo.isoformat(sep=" ") and d["max"] == hi.isoformat(sep=" ")
    assert len(d["histogram"]) == 20 and sum(b["count"] for b in d["histogram"]) == N_READINGS - d["nulls"]
    assert d["histogram"][0]["low"].startswith(lo.date().isoformat())
    v = get(client, h, aid, "profile", column="kwh", filter=[{"column": "building_id", "op": "=", "value": "B07"}])
    assert v.json()["rows"] == one("SELECT count(*) FROM tbl WHERE building_id = 'B07'", tbl)
    assert v.json()["filters"] == [{"column": "building_id", "op": "=", "value": "B07"}]


FILTERS = [
    ({"column": "kwh", "op": ">=", "value": 50}, "kwh >= 50"),
    ({"column": "kwh", "op": "<=", "value": "20.5"}, "kwh <= 20.5"),
    ({"column": "occupancy", "op": "!=", "value": 0}, "occupancy != 0"),
    ({"column": "building_id", "op": "!=", "value": "B07"}, "building_id != 'B07'"),
    ({"column": "kwh", "op": "between", "value": [50, 100]}, "kwh BETWEEN 50 AND 100"),
    ({"column": "building_id", "op": "in", "value": ["B01", "B03", "nope"]}, "building_id IN ('B01', 'B03')"),
    ({"column": "ts", "op": ">=", "value": "2024-03-01"}, "ts >= TIMESTAMP '2024-03-01'"),
    ({"column": "ts", "op": "<", "value": "2024-03-01 12:00"}, "ts < TIMESTAMP '2024-03-01 12:00'"),
    ({"column": "ts", "op": "between", "value": ["2024-01-01", "2024-01-31"]},
     "ts >= DATE '2024-01-01' AND ts < DATE '2024-02-01'"),  # a date-only high takes in that whole day
    ({"column": "ts", "op": "<=", "value": "2024-01-31"}, "ts < DATE '2024-02-01'"),
    ({"column": "ts", "op": "=", "value": "2024-03-01"}, "ts >= DATE '2024-03-01' AND ts < DATE '2024-03-02'"),
    ({"column": "ts", "op": "!=", "value": "2024-03-01"}, "ts < DATE '2024-03-01' OR ts >= DATE '2024-03-02'"),
    ({"column": "ts", "op": ">", "value": "2024-12-31"}, "ts >= DATE '2025-01-01'"),
    ({"column": "ts", "op": "=", "value": "2024-03-01 05:00"}, "ts = TIMESTAMP '2024-03-01 05:00'"),
    ({"column": "ts", "op": "between", "value": ["2024-01-01 06:00", "2024-01-01 18:30"]},
     "ts BETWEEN TIMESTAMP '2024-01-01 06:00' AND TIMESTAMP '2024-01-01 18:30'"),
]


@pytest.mark.parametrize("flt,sql", FILTERS, ids=[s for _, s in FILTERS])
def test_each_filter_kind_matches_duckdb(grid_env, flt, sql) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    r = rows(client, h, aid, filter=[flt], limit="5")
    assert r.status_code == 200, r.text
    expected = one(f"SELECT count(*) FROM tbl WHERE {sql}", tbl)
    assert 0 < expected < N_READINGS and r.json()["rows"] == expected
    echoed = r.json()["filters"][0]
    assert echoed["column"] == flt["column"] and echoed["op"] == flt["op"]
    csv_text = client.get(f"/api/artifacts/{aid}/rows.csv?" + urlencode({"filter": json.dumps([flt])}),
                          headers=h.auth("alice")).text
    assert len(csv_text.strip().splitlines()) == expected + 1


BAD_FILTERS = [
    ({"column": "kwh", "op": "between", "value": [1]}, "filter 1 (kwh between): give the range as [low, high]"),
    ({"column": "kwh", "op": "between", "value": ["ten", 20]}, "filter 1 (kwh between): 'ten' is not a number"),
    ({"column": "kwh", "op": "in", "value": []}, "filter 1 (kwh in): give a list of 1-500 values"),
    ({"column": "kwh", "op": "in", "value": "B01"}, "filter 1 (kwh in): give a list"),
    ({"column": "ts", "op": ">=", "value": "last week"}, "filter 1 (ts >=): 'last week' is not a date or timestamp"),
    ({"column": "kwh", "op": "~", "value": 1}, "filter 1 (kwh): unknown op '~'"),
    ({"column": "kwh; DROP TABLE x", "op": "=", "value": 1}, "filter: no column 'kwh; DROP TABLE x'"),
    ({"column": "kwh", "op": ">"}, "filter 1 (kwh >): a value is needed"),
    ({"column": "kwh", "op": "in", "value": [{"x": 1}]}, "filter 1 (kwh in): a value is needed"),
]


@pytest.mark.parametrize("flt,message", BAD_FILTERS, ids=[m[:40] for _, m in BAD_FILTERS])
def test_bad_filters_are_400_naming_the_filter(grid_env, flt, message) -> None:  # noqa: F811
    h, client, aid, _ = grid_env
    for what in ("rows", "rows.csv", "profile", "groups"):
        extra = {"column": "kwh"} if what == "profile" else {"by": "building_id"} if what == "groups" else {}
        r = get(client, h, aid, what, filter=[flt], **extra)
        assert r.status_code == 400, (what, r.text)
        assert message in r.json()["detail"], (what, r.json()["detail"])
        assert r.json()["extra"]["param"] == "filter"


def test_the_second_bad_filter_is_named_by_its_position(grid_env) -> None:  # noqa: F811
    h, client, aid, _ = grid_env
    r = rows(client, h, aid, filter=[{"column": "building_id", "op": "=", "value": "B01"},
                                     {"column": "occupancy", "op": "<", "value": "1.5"}])
    assert r.status_code == 400 and "filter 2 (occupancy <): '1.5' is not a whole number" in r.json()["detail"]


def test_group_by_with_count_sum_mean(grid_env) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    flt = [{"column": "kwh", "op": ">", "value": 50}]
    r = get(client, h, aid, "groups", by="building_id", agg=["count", "sum:kwh", "mean:kwh"], filter=flt)
    assert r.status_code == 200, r.text
    g = r.json()
    want = duckdb.sql("SELECT building_id, count(*), sum(kwh), avg(kwh) FROM tbl WHERE kwh > 50 "
                      "GROUP BY 1 ORDER BY 1").fetchall()
    assert [c["name"] for c in g["columns"]] == ["building_id", "count", "sum(kwh)", "mean(kwh)"]
    assert g["groups"] == len(want) and g["rows"] == sum(w[1] for w in want)
    for got, exp in zip(g["data"], want):
        assert got[0] == exp[0] and got[1] == exp[1]
        assert got[2] == pytest.approx(exp[2]) and got[3] == pytest.approx(exp[3])
    top = get(client, h, aid, "groups", by=["building_id"], agg="sum:kwh", sort="sum(kwh):desc", limit="3").json()
    assert len(top["data"]) == 3 and top["data"][0][0] == max(want, key=lambda w: w[2])[0]
    months = get(client, h, aid, "groups", by="ts:month").json()
    exp_months = duckdb.sql("SELECT date_trunc('month', ts), count(*) FROM tbl GROUP BY 1 ORDER BY 1").fetchall()
    assert [row[1] for row in months["data"]] == [n for _, n in exp_months]
    assert months["columns"][0]["name"] == "ts (month)"


@pytest.mark.parametrize("params,param,message", [
    ({}, "by", "name 1-3 columns"),
    ({"by": "nope"}, "by", "no column 'nope'"),
    ({"by": "building_id:month"}, "by", "only a date or timestamp column"),
    ({"by": "building_id", "agg": "sum:building_id"}, "agg", "not a number"),
    ({"by": "building_id", "agg": "median:kwh"}, "agg", "use count, sum:<column> or mean:<column>"),
    ({"by": "building_id", "sort": "kwh"}, "sort", "not a column of the result"),
    ({"by": "building_id", "limit": "0"}, "limit", "out of range"),
    ({"by": "building_id", "color": "red"}, "color", "unknown parameter"),
])
def test_bad_group_by_is_400_naming_the_parameter(grid_env, params, param, message) -> None:  # noqa: F811
    h, client, aid, _ = grid_env
    r = get(client, h, aid, "groups", **params)
    assert r.status_code == 400 and r.json()["extra"]["param"] == param and message in r.json()["detail"], r.text


def test_bad_profile_requests_and_other_users(grid_env) -> None:  # noqa: F811
    h, client, aid, _ = grid_env
    assert get(client, h, aid, "profile").json()["extra"]["param"] == "column"
    assert "no column 'nope'" in get(client, h, aid, "profile", column="nope").json()["detail"]
    assert get(client, h, aid, "profile", column="kwh", bins="500").json()["extra"]["param"] == "bins"
    assert get(client, h, aid, "profile", column="kwh", user="bob").status_code == 404
    assert get(client, h, aid, "groups", by="building_id", user="bob").status_code == 404


def test_csv_timestamps_in_their_shortest_exact_form(grid_env) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    text = client.get(f"/api/artifacts/{aid}/rows.csv", headers=h.auth("alice")).text
    reader = csv.DictReader(io.StringIO(text))
    first = next(reader)
    assert first["ts"] == tbl.column("ts")[0].as_py().isoformat(sep=" ")  # 2024-01-01 00:00:00, no .000000
    assert ".000" not in text[:20_000]
    full = client.get(f"/api/artifacts/{aid}/download?format=csv", headers=h.auth("alice")).text
    assert full.splitlines()[1] == text.splitlines()[1]


def test_question_is_the_title_and_the_chart_step_runs_the_view(grid_env) -> None:  # noqa: F811
    h, client, aid, tbl = grid_env
    page = rows(client, h, aid, limit="1").json()
    assert page["question"] == "go" and page["thread"]
    assert "question" not in rows(client, h, aid, limit="1", offset="1").json()
    flt = [{"column": "kwh", "op": "between", "value": [10, 20]}]
    step = get(client, h, aid, "chart-step", by="building_id", agg="sum:kwh", filter=flt).json()
    code = step["arguments"]["code"]
    assert step["tool"] == "python" and step["thread"] == page["thread"]
    assert "# question: go" in code and "kwh between 10 and 20" in code and "savefig" in code
    assert "'10', '20'" in code  # the values travel as parameters, not in the SQL
    sql = code.split("SQL = ", 1)[1].splitlines()[0]
    assert "10" not in sql.replace(aid, "")
    hist = get(client, h, aid, "chart-step", column="kwh").json()["arguments"]["code"]
    assert "ax.hist" in hist
    assert get(client, h, aid, "chart-step", column="nope").status_code == 400
