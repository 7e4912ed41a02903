"""The report page (api/report/, threads/report/) over a real analysis thread:
the demo's first analysis (an offloaded SQL result, a chart, an answer) run by the local
sandbox. Pin a chart, a table, a grid view and a paragraph; notes, order, unpin; the exports
(Markdown, self-contained HTML, audited); permissions and bad input; a refresh marks what it
changed and the chart shows its new version."""

from __future__ import annotations

import tempfile

import duckdb
import pytest

from datadesk.audit.event import AuditFilter
from datadesk.llm.demo import demo_model
from datadesk.llm.demo_plans import PLANS
from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.offload.artifacts.store import write_artifact_file
from datadesk.sandbox.base import ChartOutput
from datadesk.threads.report.pins import MAX_NOTE_CHARS, MAX_PINS
from datadesk.tools.charts import CHART_EXT, CHART_FORMAT, chart_title, checked_spec
from tests.conftest import make_harness, parse_sse


@pytest.fixture
def analysed(home):
    h = make_harness(home, demo_model(), sandbox={"backend": "local", "pool_size": 0, "exec_timeout_s": 90,
                                                  "memory_mb": 2048, "run_dir": tempfile.mkdtemp(prefix="ddp-")},
                     refresh={"schedules": False})
    with h.client(timeout=300) as api:
        events = api.turn(PLANS[0].question)
        assert events[-1][1]["status"] == "ok", events[-3:]
        records = api.client.get(f"/api/threads/{api.tid}").json()["records"]
        api.table = next(r["meta"]["artifact"]["id"] for r in records
                         if r["role"] == "tool" and (r.get("meta") or {}).get("artifact"))
        api.chart = next(r["meta"]["images"][0] for r in records
                         if r["role"] == "tool" and (r.get("meta") or {}).get("images"))
        api.answer = next(r["seq"] for r in reversed(records) if r["role"] == "assistant" and r.get("content"))
        yield api


def _pin(api, body, status=201):
    r = api.client.post(f"/api/threads/{api.tid}/report/items", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_pin_note_reorder_unpin_and_export(analysed, monkeypatch) -> None:
    api, h = analysed, analysed.h
    base = f"/api/threads/{api.tid}/report"
    empty = api.client.get(base).json()
    assert empty["items"] == [] and empty["title"]  # the thread's title until one is set
    chart = _pin(api, {"kind": "chart", "artifact": api.chart, "note": "Winter peaks."})["item"]
    table = _pin(api, {"kind": "table", "artifact": api.table})["item"]
    view = _pin(api, {"kind": "table", "artifact": api.table,
                      "view": {"sort": ["kwh:desc"], "filter": '[{"column": "kwh", "op": ">", "value": "0"}]'}})["item"]
    para = _pin(api, {"kind": "paragraph", "seq": api.answer, "paragraph": 0})["report"]["items"][-1]
    assert chart["seq"] and chart["image"] == 0 and table["seq"]
    assert para["text"] and para["html"].startswith("<")
    assert para["label"] == f"From the answer to “{PLANS[0].question}”"

    shown = api.client.get(base).json()
    assert [i["id"] for i in shown["items"]] == [chart["id"], table["id"], view["id"], para["id"]]
    assert shown["items"][0]["media_type"].startswith("image/") and shown["items"][0]["note"] == "Winter peaks."
    assert shown["items"][0]["label"] == f"Chart · {PLANS[0].question}"
    assert shown["items"][1]["label"].startswith("Table · result of ")
    assert shown["items"][2]["label"].startswith("Table view · ")
    t = shown["items"][1]["table"]
    assert t["rows"] == t["total_rows"] and len(t["data"]) == 20 and t["columns"]
    v = shown["items"][2]["table"]
    kwh = [c["name"] for c in v["columns"]].index("kwh")
    assert [r[kwh] for r in v["data"]] == sorted((r[kwh] for r in v["data"]), reverse=True)
    assert v["sort"] == [{"column": "kwh", "desc": True}] and v["filters"][0]["op"] == ">"

    r = api.client.patch(f"{base}/items/{table['id']}", json={"note": "The full daily table."})
    assert r.status_code == 200 and r.json()["items"][1]["note"] == "The full daily table."
    r = api.client.put(f"{base}/order", json={"order": [para["id"], table["id"], chart["id"], view["id"]]})
    assert [i["id"] for i in r.json()["items"]] == [para["id"], table["id"], chart["id"], view["id"]]
    assert api.client.put(base, json={"title": "Energy through the year"}).json()["title"] == "Energy through the year"
    r = api.client.delete(f"{base}/items/{view['id']}")
    assert r.status_code == 200 and [i["id"] for i in r.json()["items"]] == [para["id"], table["id"], chart["id"]]

    md = api.client.get(f"{base}?format=md")
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    text = md.text
    assert text.startswith("# Energy through the year") and "data:image/png;base64," in text
    assert "**Note:** The full daily table." in text and "---:" in text and para["text"] in text
    assert text.index(para["text"]) < text.index("The full daily table.") < text.index("data:image/png")
    page = api.client.get(f"{base}?format=html")
    assert page.status_code == 200 and "script-src" not in page.headers["content-security-policy"]
    assert "img-src data:" in page.headers["content-security-policy"]
    body = page.text
    assert "<h1>Energy through the year</h1>" in body and body.count('<section class="item') == 3
    assert '<img src="data:image/png;base64,' in body and "/api/" not in body and 'class=num' in body
    assert "break-before:page" in body  # print: a page per item
    # past the export's image budget, a chart is named, not embedded
    monkeypatch.setattr("datadesk.api.report.page.MAX_EMBEDDED_BYTES", 10)
    monkeypatch.setattr("datadesk.threads.report.markdown.MAX_EMBEDDED_BYTES", 10)
    assert "too large to embed" in api.client.get(f"{base}?format=html").text
    assert "data:image" not in api.client.get(f"{base}?format=md").text
    monkeypatch.undo()
    # both exports are audited
    exports = list(h.rt.audit.entries(AuditFilter(action="export", user="alice")))
    assert {"report md", "report html"} <= {e.detail for e in exports}
    assert all(e.thread == api.tid and e.bytes for e in exports)
    # the document on disk
    thread = h.rt.threads.get(api.tid, "alice", ["demo"])
    raw = thread.read_doc("report")
    assert raw and b'"version":1' in raw.replace(b" ", b"")
    # clearing the chat removes its report with the rest
    assert api.client.post(f"/api/threads/{api.tid}/clear").status_code == 200
    assert thread.read_doc("report") is None
    assert api.client.get(base).json()["items"] == []


def test_bad_input_and_permissions(analysed) -> None:
    api, h = analysed, analysed.h
    base = f"/api/threads/{api.tid}/report"
    cases = [
        ({"kind": "chart", "artifact": api.table}, 400, "not a chart"),
        ({"kind": "table", "artifact": api.chart}, 400, "not a table"),
        ({"kind": "chart"}, 400, "needs `artifact`"),
        ({"kind": "paragraph", "seq": 1}, 400, "not an answer"),
        ({"kind": "paragraph", "seq": api.answer, "paragraph": 999}, 400, "paragraph 999"),
        ({"kind": "table", "artifact": api.table, "view": {"sort": ["nope:asc"]}}, 400, "view"),
        ({"kind": "table", "artifact": "art_missing"}, 404, "not found"),
        ({"kind": "chart", "artifact": api.chart, "note": "x" * (MAX_NOTE_CHARS + 1)}, 400, "note"),
        ({"kind": "picture", "artifact": api.chart}, 400, "kind"),
        ({"kind": "chart", "artifact": api.chart, "colour": "red"}, 400, "colour"),
    ]
    for body, status, words in cases:
        r = api.client.post(f"{base}/items", json=body)
        assert r.status_code == status, (body, r.text)
        assert words in r.text, (body, r.text)
    item = _pin(api, {"kind": "chart", "artifact": api.chart})["item"]
    r = api.client.patch(f"{base}/items/pin_nothere", json={"note": "x"})
    assert r.status_code == 404 and "pin_nothere" in r.json()["error"]
    r = api.client.patch(f"{base}/items/{item['id']}", json={"note": "x" * (MAX_NOTE_CHARS + 1)})
    assert r.status_code == 400 and r.json()["extra"]["field"] == "note"
    r = api.client.put(f"{base}/order", json={"order": []})
    assert r.status_code == 400 and item["id"] in r.json()["error"]
    r = api.client.put(f"{base}/order", json={"order": [item["id"], "pin_other"]})
    assert r.status_code == 400 and "pin_other" in r.json()["error"]
    assert api.client.get(f"{base}?format=pdf").status_code == 400
    assert api.client.put(base, json={"title": "t" * 500}).status_code == 400
    for _ in range(MAX_PINS - 1):
        _pin(api, {"kind": "chart", "artifact": api.chart})
    r = api.client.post(f"{base}/items", json={"kind": "chart", "artifact": api.chart})
    assert r.status_code == 400 and f"at most {MAX_PINS}" in r.json()["error"]
    # another user (even in the same workspace) reaches nothing of it
    bob = h.auth("bob")
    assert api.client.get(base, headers=bob).status_code == 404
    r = api.client.post(f"{base}/items", json={"kind": "chart", "artifact": api.chart}, headers=bob)
    assert r.status_code == 404
    assert api.client.delete(f"{base}/items/{item['id']}", headers=bob).status_code == 404
    assert api.client.get(f"{base}?format=md", headers=bob).status_code == 404


def test_a_cookie_session_needs_the_csrf_token(analysed) -> None:
    api, h = analysed, analysed.h
    base = f"/api/threads/{api.tid}/report"
    with h.client(signed_in=False, thread=False) as anon:
        assert anon.client.get(base).status_code == 401
        pin = {"kind": "chart", "artifact": api.chart}
        assert anon.client.post(f"{base}/items", json=pin).status_code in (401, 403)
        csrf = anon.client.post("/api/login", json={"token": h.tokens["alice"]}).json()["csrf"]
        for method, url, body in [("POST", f"{base}/items", pin), ("PUT", base, {"title": "x"}),
                                  ("PUT", f"{base}/order", {"order": []}),
                                  ("PATCH", f"{base}/items/pin_x", {"note": "x"}),
                                  ("DELETE", f"{base}/items/pin_x", None)]:
            r = anon.client.request(method, url, json=body)
            assert r.status_code == 403 and "X-CSRF-Token" in r.json()["error"], (method, url, r.text)
        r = anon.client.post(f"{base}/items", json=pin, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 201, r.text
        assert anon.client.get(base).json()["items"][0]["kind"] == "chart"  # a GET needs no token


def test_a_refresh_marks_what_it_changed(analysed, home) -> None:
    api, h = analysed, analysed.h
    base = f"/api/threads/{api.tid}/report"
    chart = _pin(api, {"kind": "chart", "artifact": api.chart})["item"]
    table = _pin(api, {"kind": "table", "artifact": api.table})["item"]
    para = _pin(api, {"kind": "paragraph", "seq": api.answer})["item"]
    before = {i["id"]: i for i in api.client.get(base).json()["items"]}
    assert all("mark" not in i for i in before.values())

    h.rt.sources.get("demo").warehouse.close()
    con = duckdb.connect(str(home / "workspaces/demo/data/warehouse.duckdb"))
    con.execute("DELETE FROM readings WHERE building_id = 'B02' AND ts >= '2025-01-01'")
    con.close()
    events = parse_sse(api.client.post(f"/api/threads/{api.tid}/refresh").text)
    report = events[-2][1]["report"]
    assert report["status"] == "ok" and report["changes"] == 1

    after = api.client.get(base).json()
    assert after["refreshed"]["at"] == report["finished"]
    items = {i["id"]: i for i in after["items"]}
    t = items[table["id"]]
    assert t["mark"]["at"] == report["finished"] and t["mark"]["changed"]
    assert any(c.startswith("rows ") for c in t["mark"]["changes"]) and any("sum of" in c for c in t["mark"]["changes"])
    assert t["table"]["rows"] == before[table["id"]]["table"]["rows"] - 31  # the table reads the new data
    c = items[chart["id"]]
    assert c["artifact"] != api.chart and c["pinned_artifact"] == api.chart  # the chart drawn again
    assert "new version of the chart" in c["mark"]["changes"][0]
    p = items[para["id"]]
    assert p["mark"]["stale"]
    md = api.client.get(f"{base}?format=md").text
    assert "updated by refresh at" in md and "rows " in md


def _vega_artifact(api, rows: int = 30, columns: int = 10) -> str:
    """A `vega-lite` chart artifact as the python tool saves one (tools/charts.py), written to the
    thread's artifact store directly (the local kernel has no Altair)."""
    thread = api.h.rt.threads.get(api.tid, "alice", ["demo"])
    values = [{"month": f"2024-{m % 12 + 1:02d}", "kwh": 1000 * m, "note": "long " * 40,
               **{f"extra{k}": k for k in range(columns - 3)}} for m in range(rows)]
    spec = {"title": "Monthly kWh", "data": {"values": values}, "mark": "bar",
            "encoding": {"x": {"field": "month", "type": "ordinal"}, "y": {"field": "kwh", "type": "quantitative"}}}
    data, spec = checked_spec(ChartOutput(mime="application/vnd.vegalite.v5+json", spec=spec))
    origin = ArtifactOrigin(source="python", user="alice", thread=api.tid, workspace="demo", tool="python")
    art = write_artifact_file(thread.artifacts_dir, data, CHART_EXT, "deliverable",
                              "application/vnd.vegalite.v5+json", origin)
    art.format, art.title = CHART_FORMAT, chart_title(spec)
    api.h.rt.artifacts.save(thread, art)
    return art.id


def test_a_vega_lite_chart_pins_and_exports_as_its_data(analysed) -> None:
    api = analysed
    base = f"/api/threads/{api.tid}/report"
    aid = _vega_artifact(api)
    item = _pin(api, {"kind": "chart", "artifact": aid, "note": "Interactive."})["item"]
    assert item["kind"] == "chart" and item["artifact"] == aid
    shown = api.client.get(base).json()["items"][0]
    assert shown["format"] == "vega-lite" and shown["title"] == "Monthly kWh" and shown["artifact"] == aid
    assert shown["media_type"] == "application/vnd.vegalite.v5+json" and shown["note"] == "Interactive."
    assert _pin(api, {"kind": "chart", "artifact": aid, "view": {"sort": []}}, 400)

    md = api.client.get(f"{base}?format=md").text
    assert "**Monthly kWh**" in md and "Interactive chart: open the thread in DataDesk to explore it" in md
    head = next(line for line in md.splitlines() if line.startswith("| month"))
    assert head.count("|") == 9  # 8 columns of the 10
    rows = [line for line in md.splitlines() if line.startswith("| 2024-")]
    assert len(rows) == 20 and "20 of 30 rows" in md and "long " * 20 not in md  # cells cut
    assert "| 29,000 |" not in md and "| 19,000 |" in md and "---:" in md
    page = api.client.get(f"{base}?format=html").text
    assert '<figure class="vega-lite">' in page and "<strong>Monthly kWh</strong>" in page
    assert "Interactive chart: open the thread in DataDesk to explore it" in page
    assert page.count("<tr>") == 21 and "<script" not in page and "/api/" not in page
    # a vega-lite artifact is a chart, not a table
    assert "not a table" in api.client.post(f"{base}/items", json={"kind": "table", "artifact": aid}).text
