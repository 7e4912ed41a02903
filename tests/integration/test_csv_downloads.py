"""CSV downloads of tables (issue 24): the grid's rows.csv and download?format=csv. Formula-like
text cells get a leading ' unless formulas=keep (typed numbers never); STRUCT, LIST and MAP
columns are JSON text; what cannot be written is an error status before the stream starts, and
a failure once it runs is logged and cuts the response (a real server: no clean end)."""

from __future__ import annotations

import csv
import io
import json
import logging
from decimal import Decimal
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.llm.scripted import ScriptedModel
from tests.conftest import make_harness, serve_app

FORMULAS = ["=HYPERLINK(\"http://x\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\ry", "plain", None]
ESCAPED = ["'=HYPERLINK(\"http://x\")", "'+1+cmd|' /C calc'!A0", "'-2+3", "'@SUM(A1)", "'\tx", "'\ry", "plain", ""]


def _table() -> pa.Table:
    n = len(FORMULAS)
    return pa.table({
        "=label": pa.array(FORMULAS),
        "amount": pa.array([-5, -1, 0, 1, 2, 3, 4, None]),
        "price": pa.array([Decimal("-1.50")] * n, pa.decimal128(6, 2)),
        "ratio": pa.array([-0.25] * n),
    })


def _nested() -> pa.Table:
    return pa.table({
        "id": [1, 2, 3],
        "point": pa.array([{"x": 1, "tag": "=a"}, None, {"x": -3, "tag": None}]),
        "items": pa.array([[1, 2], [], None]),
        "attrs": pa.array([[("k", 1.5)], None, [("-", 2.0)]], pa.map_(pa.string(), pa.float64())),
        "raw": pa.array([b"\xff\x00", None, b"="], pa.binary()),
    })


def _parquet_artifact(h, tid: str, table: pa.Table, name: str = "t.parquet", **write) -> tuple[str, Path]:
    handle = h.rt.threads.get(tid, "alice", ["demo"])
    buf = io.BytesIO()
    pq.write_table(table, buf, **write)
    origin = ArtifactOrigin(source="python", user="alice", thread=tid, workspace="demo", filename=name)
    art = h.rt.artifacts.save_bytes(handle, buf.getvalue(), "parquet", "deliverable",
                                    "application/vnd.apache.parquet", origin)
    return art.id, h.rt.artifacts.data_path(handle, art)


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def _both(client, h, aid: str, query: str = "") -> list[httpx.Response]:
    auth = h.auth("alice")
    return [client.get(f"/api/artifacts/{aid}/download?format=csv{'&' + query if query else ''}", headers=auth),
            client.get(f"/api/artifacts/{aid}/rows.csv{'?' + query if query else ''}", headers=auth)]


@pytest.mark.security
def test_formula_cells_get_a_quote_and_typed_numbers_stay_numbers(api) -> None:
    h, client, tid = api.h, api.client, api.tid
    aid, _ = _parquet_artifact(h, tid, _table())
    for r in _both(client, h, aid):
        assert r.status_code == 200, r.text
        rows = _rows(r.text)
        assert rows[0] == ["'=label", "amount", "price", "ratio"]  # a column name is a cell too
        assert [row[0] for row in rows[1:]] == ESCAPED, r.url
        assert [row[1] for row in rows[1:]] == ["-5", "-1", "0", "1", "2", "3", "4", ""]  # numbers untouched
        assert {row[2] for row in rows[1:]} == {"-1.50"} and {row[3] for row in rows[1:]} == {"-0.25"}
    for r in _both(client, h, aid, "formulas=keep"):
        assert r.status_code == 200, r.text
        rows = _rows(r.text)
        assert rows[0][0] == "=label" and [row[0] for row in rows[1:]] == [v or "" for v in FORMULAS]
    for r in _both(client, h, aid, "formulas=escape"):
        assert [row[0] for row in _rows(r.text)[1:]] == ESCAPED
    for r in _both(client, h, aid, "formulas=yes"):
        assert r.status_code == 400 and r.json()["error"].startswith("formulas:"), r.text
    r = client.get(f"/api/artifacts/{aid}/download?formulas=keep", headers=h.auth("alice"))
    assert r.status_code == 400 and "format=csv only" in r.json()["error"]
    # a filtered, sorted view escapes the same way
    view = "sort=amount:desc&filter=" + json.dumps([{"column": "amount", "op": "<", "value": "0"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?{view}", headers=h.auth("alice"))
    assert [row[:2] for row in _rows(r.text)[1:]] == [["'+1+cmd|' /C calc'!A0", "-1"], ["'=HYPERLINK(\"http://x\")", "-5"]]


@pytest.mark.security
def test_a_csv_the_code_wrote_escapes_its_text_but_not_its_numbers(api) -> None:
    h, client, tid = api.h, api.client, api.tid
    handle = h.rt.threads.get(tid, "alice", ["demo"])
    body = "who,delta\n" + "".join(f"{'=cmd()' if i % 2 else 'ok'},{-i}\n" for i in range(100))
    origin = ArtifactOrigin(source="python", user="alice", thread=tid, workspace="demo", filename="d.csv")
    art = h.rt.artifacts.save_bytes(handle, body.encode(), "csv", "deliverable", "text/csv", origin)
    rows = _rows(client.get(f"/api/artifacts/{art.id}/rows.csv", headers=h.auth("alice")).text)
    assert rows[2] == ["'=cmd()", "-1"] and rows[99] == ["ok", "-98"]  # DuckDB read delta as a number


def test_struct_list_and_map_columns_are_json_text(api) -> None:
    h, client, tid = api.h, api.client, api.tid
    aid, _ = _parquet_artifact(h, tid, _nested())
    for r in _both(client, h, aid):
        assert r.status_code == 200, r.text
        rows = _rows(r.text)
        assert rows[0] == ["id", "point", "items", "attrs", "raw"]
        assert json.loads(rows[1][1]) == {"x": 1, "tag": "=a"} and json.loads(rows[3][1]) == {"x": -3, "tag": None}
        assert json.loads(rows[1][2]) == [1, 2] and json.loads(rows[2][2]) == [] and rows[3][2] == ""
        assert json.loads(rows[1][3]) == {"k": 1.5} and rows[2][3] == "" and json.loads(rows[3][3]) == {"-": 2.0}
        assert [row[4] for row in rows[1:]] == ["0xff00", "", "0x3d"]  # bytes as the grid shows them


def _damage_row_group(path: Path, group: int) -> None:
    """Overwrite the page header at the start of `group`'s first column: reading it fails."""
    offset = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 64)


def _long(n: int = 300_000) -> pa.Table:
    return pa.table({"id": pa.array(range(n)), "note": pa.array([f"n{i}" for i in range(n)])})


def test_a_table_that_cannot_be_written_is_an_error_status_not_an_empty_200(api) -> None:
    h, client, tid = api.h, api.client, api.tid
    aid, path = _parquet_artifact(h, tid, _long(1_000), row_group_size=1_000, use_dictionary=False)
    _damage_row_group(path, 0)
    for r in _both(client, h, aid):
        assert r.status_code == 422, (r.url, r.status_code, r.text[:200])
        assert "could not be" in r.json()["error"] and r.headers["content-type"].startswith("application/json")
    # an empty table is its header
    aid, _ = _parquet_artifact(h, tid, _nested().slice(0, 0))
    for r in _both(client, h, aid):
        assert r.status_code == 200 and r.text == '"id","point","items","attrs","raw"\n'


def _cut(url: str, headers: dict) -> tuple[int, int]:
    """(status, bytes received) of a download the server cuts: httpx must see it incomplete."""
    got = 0
    with httpx.Client(timeout=60) as c, c.stream("GET", url, headers=headers) as r:
        status = r.status_code
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete|closed"):
            for chunk in r.iter_bytes():
                got += len(chunk)
    return status, got


class _Logged(logging.Handler):
    """The records of one logger (the app's logging setup replaces the root handlers caplog uses)."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> "_Logged":
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


def test_a_failure_mid_stream_is_logged_and_cuts_the_download(home: Path) -> None:
    h = make_harness(home, ScriptedModel(then="ok"), offload={"stream_timeout_s": 0.03})
    with serve_app(h.app()) as base, _Logged("datadesk.offload") as logged:
        tid = httpx.post(f"{base}/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        aid, path = _parquet_artifact(h, tid, _long(), row_group_size=100_000, use_dictionary=False)
        _damage_row_group(path, 2)  # the first batches read, the third row group does not
        status, got = _cut(f"{base}/api/artifacts/{aid}/download?format=csv", h.auth("alice"))
        assert status == 200 and got > 1_000_000
        assert any(f"the CSV download of artifact {aid} was cut after 196608 rows" in x for x in logged.lines)
        # the grid's CSV: the check passes, then the stream's deadline (offload.stream_timeout_s)
        # interrupts the sort of a large view once the response has started
        aid, _ = _parquet_artifact(h, tid, _long(2_000_000), row_group_size=200_000)
        status, _ = _cut(f"{base}/api/artifacts/{aid}/rows.csv?sort=note:desc", h.auth("alice"))
        assert status == 200
        assert any(f"the CSV download of the table {aid}.parquet" in x and "offload.stream_timeout_s" in x
                   for x in logged.lines), logged.lines
