"""CSV dialects and workbooks through every door of the real app (issue 26): a semicolon CSV with a
decimal comma and `.` thousands, tab, pipe, quoted fields with delimiters inside, a title block,
a totals line, UTF-16 (with and without BOM), Windows-1252, UTF-8 with BOM. Each text comes in
as an upload (its bytes in that encoding), a paste (a message too long for the model) and a
tool's result; the three artifacts hold the same typed table, exactly the rows and the sums.
Then: the re-import of an upload with the analyst's options (and a 400 naming each bad field),
and a workbook of two sheets with a title row and a merged header: two artifacts."""

from __future__ import annotations

import io

import openpyxl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel
from tests.doors import door_app, new_thread, through

N = 200
NBSP, NNBSP = "\u00a0", "\u202f"


def _amount(i: int) -> float:
    return round(((i * 7_919_993) % 400_000_000) / 100 - 1_000_000, 2)


def _eu(value: float, group: str = ".") -> str:
    """1234567.5 -> "1.234.567,50" (or with spaces as thousands)."""
    return f"{value:,.2f}".replace(",", "\0").replace(".", ",").replace("\0", group)


def _rows(fmt, names=("region", "amount", "qty", "note")) -> tuple[list[str], float, int]:
    lines, total, qty = [], 0.0, 0
    for i in range(N):
        a = _amount(i)
        total += a
        qty += i
        lines.append(fmt(i, a))
    return lines, round(total, 2), qty


def _eu_text(title: bool = True, totals: bool = True, group: str = ".", region: str = "r") -> tuple[str, float, int]:
    lines, total, qty = _rows(lambda i, a: f'{region}{i % 7};{_eu(a, group)};{i};"note; {i}"')
    head = "Sales report 2024\nExported 2024-05-01\n\n" if title else ""
    tail = f"Total;{_eu(total)};{qty};\n" if totals else ""
    return head + "region;amount;qty;note\n" + "\n".join(lines) + "\n" + tail, total, qty


def _simple(delim: str, title: str = "") -> tuple[str, float, int]:
    lines, total, qty = _rows(lambda i, a: delim.join([f"r{i % 7}", f"{a:.2f}", str(i), f'"x{delim} {i}"'
                                                       if delim != "\t" else f"x, {i}"]))
    return title + delim.join(["region", "amount", "qty", "note"]) + "\n" + "\n".join(lines) + "\n", total, qty


def _cases() -> dict[str, tuple[str, bytes, float, int]]:
    eu, total, qty = _eu_text()
    cases = {"eu": (eu, eu.encode(), total, qty)}
    cases["eu_utf16_bom"] = (eu, b"\xff\xfe" + eu.encode("utf-16-le"), total, qty)
    cases["eu_utf16_no_bom"] = (eu, eu.encode("utf-16-le"), total, qty)
    cases["eu_utf16_be_bom"] = (eu, b"\xfe\xff" + eu.encode("utf-16-be"), total, qty)
    cases["eu_utf8_bom"] = (eu, b"\xef\xbb\xbf" + eu.encode(), total, qty)
    latin, total, qty = _eu_text(region="Genève €")
    cases["eu_cp1252"] = (latin, latin.encode("cp1252"), total, qty)
    spaced, total, qty = _eu_text(title=False, group=NBSP)
    spaced = spaced.replace(NBSP + "0", NNBSP + "0").replace(NBSP + "1", " 1")  # all three kinds of space
    cases["eu_space_thousands"] = (spaced, spaced.encode(), total, qty)
    for name, delim in (("tab", "\t"), ("pipe", "|"), ("quoted_comma", ",")):
        text, total, qty = _simple(delim)
        cases[name] = (text, text.encode(), total, qty)
    text, total, qty = _simple(",", title="Quarterly export\nsource: ERP\n\n")
    cases["comma_title"] = (text, text.encode(), total, qty)
    return cases


CASES = _cases()


@pytest.fixture
def app(harness_factory):
    with door_app(harness_factory) as app:
        yield app


def _through(door: str, text: str, data: bytes, app) -> tuple[dict, pa.Table, str]:
    return through(door, text, app, data=data, filename="export.csv")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_dialect_is_the_same_table_through_every_door(case: str, app) -> None:
    text, data, total, qty = CASES[case]
    got = {door: _through(door, text, data, app) for door in ("upload", "paste", "tool")}
    schema = got["upload"][1].schema
    assert schema.names == ["region", "amount", "qty", "note"]
    assert schema.field("amount").type == pa.float64() and schema.field("qty").type == pa.int64()
    for door, (art, table, told) in got.items():
        assert table.schema == schema, (door, table.schema)
        assert art["rows"] == table.num_rows == N, (door, art["rows"])
        assert round(pc.sum(table["amount"]).as_py(), 2) == total, door
        assert pc.sum(table["qty"]).as_py() == qty, door
        assert table["note"][1].as_py() in ("note; 1", "x, 1", "x; 1", "x| 1", "x\t 1"), table["note"][1]
        if case.startswith("eu") and "space" not in case:
            assert "a totals line was left out: 'Total;" in art["shape"], (door, art["shape"])
            assert "a totals line was left out" in told, door
    upload = got["upload"][0]
    if case.startswith("eu"):
        assert upload["reading"]["decimal"] == "," and upload["reading"]["delimiter"] == ";"
        assert "decimal comma" in upload["shape"]
    if case in ("eu", "eu_cp1252", "eu_utf16_bom"):
        assert upload["reading"]["header_row"] == 4
        assert "2 lines above the header were skipped: 'Sales report 2024 / Exported 2024-05-01'" in got["upload"][2]
    assert upload["can_reimport"] is True


def test_upload_of_a_semicolon_csv_is_read(app) -> None:
    h, client, _, _ = app
    tid = new_thread(h, client)
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("eu.csv", b"a;b;c\n1;2;3")}, headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    art = r.json()["artifact"]
    assert art["rows"] == 1 and [c["name"] for c in art["schema"]] == ["a", "b", "c"]


# ------------------------------------------------------------------- re-import

def _upload(app, name: str, data: bytes) -> tuple[str, dict]:
    h, client, _, _ = app
    tid = new_thread(h, client)
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": (name, data)}, headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    return tid, r.json()["artifact"]


WRONG_GUESS = "Sales;2024\nregion;amount\nnörth;1,234\nsöuth;2,000\neast;3,500\n".encode("cp1252")


def test_reimport_with_the_analysts_options_replaces_the_artifact(app) -> None:
    h, client, _, _ = app
    auth = h.auth("alice")
    tid, art = _upload(app, "sales.csv", WRONG_GUESS)
    assert art["schema"][0]["name"] == "Sales" and art["rows"] == 4  # the title taken for the header
    assert art["reading"]["decimal"] == "." and art["reading"]["encoding"] == "cp1252"
    thread = h.rt.threads.get(tid, "alice", ["demo"])
    kept = h.rt.artifacts.load(thread, art["id"])
    assert kept.original_bytes == len(WRONG_GUESS) and kept.stored_bytes == kept.bytes + len(WRONG_GUESS)
    assert (thread.artifacts_dir / kept.original).read_bytes() == WRONG_GUESS
    options = {"delimiter": ";", "decimal": ",", "header_row": 2, "encoding": "cp1252"}
    r = client.post(f"/api/threads/{tid}/artifacts/{art['id']}/reimport", json=options, headers=auth)
    assert r.status_code == 200, r.text
    new = r.json()["artifact"]
    assert new["id"] == art["id"] and new["sandbox_path"] == art["sandbox_path"] and new["rows"] == 3
    assert new["schema"] == [{"name": "region", "type": "string"}, {"name": "amount", "type": "double"}]
    assert new["reading"]["chosen"] == ["delimiter", "decimal", "header_row"] and new["created"] == art["created"]
    table = pq.read_table(io.BytesIO(client.get(f"/api/artifacts/{art['id']}/download", headers=auth).content))
    assert table.to_pylist()[0] == {"region": "nörth", "amount": 1.234}
    assert round(pc.sum(table["amount"]).as_py(), 3) == 6.734
    records = client.get(f"/api/threads/{tid}", headers=auth).json()["records"]
    assert records[-1]["meta"]["reimport"] is True and "REPLACED" in records[-1]["content"]
    assert "decimal ','" in records[-1]["content"] and "rows: 3" in records[-1]["content"]
    # other users reach nothing; a non-CSV upload cannot be re-imported
    assert client.post(f"/api/threads/{tid}/artifacts/{art['id']}/reimport", json=options,
                       headers=h.auth("bob")).status_code == 404
    tid2, parquet_like = _upload(app, "x.json", b'[{"a": 1}, {"a": 2}]')
    r = client.post(f"/api/threads/{tid2}/artifacts/{parquet_like['id']}/reimport", json=options, headers=auth)
    assert r.status_code == 400 and "only a CSV or TSV upload" in r.json()["error"]
    # expired: its data and its original are gone, and the re-import says so
    h.rt.artifacts.expire(thread, art["id"])
    assert not (thread.artifacts_dir / kept.original).exists()
    r = client.post(f"/api/threads/{tid}/artifacts/{art['id']}/reimport", json=options, headers=auth)
    assert r.status_code == 400 and "expired" in r.json()["error"]


@pytest.mark.parametrize("body,field", [
    ({"delimiter": ":"}, "delimiter"), ({"decimal": "x"}, "decimal"), ({"header_row": -2}, "header_row"),
    ({"header_row": "two"}, "header_row"), ({"encoding": "ebcdic"}, "encoding"), ({"sheet": "A"}, "sheet"),
    ({"decimal": ",", "thousands": ","}, "thousands"), ([1, 2], "body"),
])
def test_bad_reimport_options_are_a_400_naming_the_field(app, body, field) -> None:
    h, client, _, _ = app
    tid, art = _upload(app, "sales.csv", WRONG_GUESS)
    r = client.post(f"/api/threads/{tid}/artifacts/{art['id']}/reimport", json=body, headers=h.auth("alice"))
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"{field}: ") and r.json()["extra"]["field"] == field
    again = client.get(f"/api/artifacts/{art['id']}", headers=h.auth("alice")).json()
    assert again["rows"] == art["rows"]  # nothing changed


def test_reimport_that_finds_no_rows_keeps_the_artifact(app) -> None:
    h, client, _, _ = app
    tid, art = _upload(app, "sales.csv", WRONG_GUESS)
    r = client.post(f"/api/threads/{tid}/artifacts/{art['id']}/reimport", json={"header_row": 5},
                    headers=h.auth("alice"))
    assert r.status_code == 400 and "no data rows" in r.json()["error"] and "nothing was changed" in r.json()["error"]
    assert client.get(f"/api/artifacts/{art['id']}", headers=h.auth("alice")).json()["rows"] == 4


# --------------------------------------------------------------------- workbooks

def _workbook() -> bytes:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sales"
    ws.append(["Sales by quarter 2024"])
    ws.merge_cells("A1:E1")
    ws.append([])
    ws.append(["Region", "Q1", None, "Q2", None])
    for cells in ("B3:C3", "D3:E3", "A3:A4"):
        ws.merge_cells(cells)
    ws.append([None, "sales", "units", "sales", "units"])
    for i in range(50):
        ws.append([f"r{i}", i * 1.5, i, i * 2.5, 2 * i])
    ws.append(["Total", sum(i * 1.5 for i in range(50)), sum(range(50)), sum(i * 2.5 for i in range(50)), 2450])
    wb.create_sheet("Notes")
    costs = wb.create_sheet("Sheet2")
    costs.append(["item", "cost"])
    for i in range(30):
        costs.append([f"i{i}", i * 10])
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def test_every_sheet_of_a_workbook_is_its_own_artifact(app) -> None:
    h, client, _, _ = app
    auth = h.auth("alice")
    tid = new_thread(h, client)
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("sales.xlsx", _workbook())}, headers=auth)
    assert r.status_code == 201, r.text
    body = r.json()
    arts = body["artifacts"]
    assert [a["name"] for a in arts] == ["sales.xlsx — Sales", "sales.xlsx — Sheet2"]
    assert body["artifact"] == arts[0] and body["skipped_sheets"] == [{"sheet": "Notes", "why": "empty"}]
    assert [a["rows"] for a in arts] == [50, 30]
    assert [c["name"] for c in arts[0]["schema"]] == ["Region", "Q1 sales", "Q1 units", "Q2 sales", "Q2 units"]
    sales = pq.read_table(io.BytesIO(client.get(f"/api/artifacts/{arts[0]['id']}/download", headers=auth).content))
    costs = pq.read_table(io.BytesIO(client.get(f"/api/artifacts/{arts[1]['id']}/download", headers=auth).content))
    assert pc.sum(sales["Q1 sales"]).as_py() == sum(i * 1.5 for i in range(50))
    assert pc.sum(sales["Q2 units"]).as_py() == 2450 and pc.sum(costs["cost"]).as_py() == 4350
    assert "a totals row was left out" in arts[0]["shape"] and "'Sales by quarter 2024'" in arts[0]["shape"]
    assert arts[0]["reading"]["merged_header"] is True and not arts[0]["can_reimport"]
    rec = client.get(f"/api/threads/{tid}", headers=auth).json()["records"][-1]
    assert rec["meta"]["artifacts"] == [a["id"] for a in arts] and rec["meta"]["skipped_sheets"] == ["Notes (empty)"]
    assert "uploaded a file: sales.xlsx" in rec["content"] and f"'Sheet2' -> {arts[1]['id']}" in rec["content"]
    assert "Skipped sheets: 'Notes' (empty)" in rec["content"] and rec["content"].count("NOT the full data") == 2
    r = client.get(f"/api/artifacts/{arts[1]['id']}/download", headers=auth)
    assert "sales_sheet2.parquet" in r.headers["content-disposition"]


def test_a_workbook_whose_later_sheet_fails_keeps_nothing(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), offload={"upload_max_columns": 4})
    wb = openpyxl.Workbook()
    wb.active.append(["a", "b"])
    wb.active.append([1, 2])
    wide = wb.create_sheet("Wide")
    wide.append(["x"] * 5)
    wide.append(list(range(5)))
    buf = io.BytesIO()
    wb.save(buf)
    with TestClient(h.app()) as client:
        tid = new_thread(h, client)
        r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("b.xlsx", buf.getvalue())},
                        headers=h.auth("alice"))
        assert r.status_code == 413 and "columns" in r.json()["error"], r.text
        adir = h.rt.threads.get(tid, "alice", ["demo"]).artifacts_dir
        assert [p.name for p in adir.iterdir() if p.name != ".lock"] == []
        assert client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"] == []
