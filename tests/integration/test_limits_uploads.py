"""Bounded uploads (issue 15): zip bombs, sheet bombs, giant CSV cells, damaged Parquet, and an
upload that Stop can cancel. Every bomb is built here, small, from hand-written XML."""

from __future__ import annotations

import asyncio
import io
import os
import random
import string
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from litestar.testing import TestClient

from datadesk.threads.attachments import UploadStopped
from datadesk.chat.turns import TurnConflict
from datadesk.llm.scripted import ScriptedModel
from tests.fakes.sandbox import FakeSandbox

pytestmark = pytest.mark.security

_CT = ('<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
       'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.'
       'relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/'
       'workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
       '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-'
       'officedocument.spreadsheetml.worksheet+xml"/><Override PartName="/xl/sharedStrings.xml" ContentType='
       '"application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>')
_RELS = ('<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/'
         '2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/'
         '2006/relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>')
_WB = ('<?xml version="1.0" encoding="UTF-8"?><workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/'
       '2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets>'
       '<sheet name="Data" sheetId="1" r:id="rId1"/></sheets></workbook>')
_WB_RELS = ('<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/'
            'package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/'
            'officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/><Relationship '
            'Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings"'
            ' Target="sharedStrings.xml"/></Relationships>')
_NS = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'


def sheet_xml(rows) -> str:
    """`rows`: iterable of (row number, [cell xml, ...])."""
    body = "".join(f'<row r="{r}">{"".join(cells)}</row>' for r, cells in rows)
    return f'<?xml version="1.0" encoding="UTF-8"?><worksheet {_NS}><sheetData>{body}</sheetData></worksheet>'


def inline(ref: str, text: str) -> str:
    return f'<c r="{ref}" t="inlineStr"><is><t>{text}</t></is></c>'


def num(ref: str, v: int) -> str:
    return f'<c r="{ref}"><v>{v}</v></c>'


def xlsx(path: Path, sheet: str, shared: str | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """A minimal workbook; `shared` is the sharedStrings.xml body (may be huge: written in chunks)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", _CT)
        zf.writestr("_rels/.rels", _RELS)
        zf.writestr("xl/workbook.xml", _WB)
        zf.writestr("xl/_rels/workbook.xml.rels", _WB_RELS)
        zf.writestr("xl/worksheets/sheet1.xml", sheet)
        zf.writestr("xl/sharedStrings.xml", shared or f'<sst {_NS} count="0" uniqueCount="0"></sst>')
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return path


def shared_strings_bomb(path: Path, unpacked: int, random_text: bool = False) -> Path:
    """sharedStrings.xml of about `unpacked` bytes, streamed into the zip (never held whole)."""
    rnd = random.Random(1)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in (("[Content_Types].xml", _CT), ("_rels/.rels", _RELS), ("xl/workbook.xml", _WB),
                           ("xl/_rels/workbook.xml.rels", _WB_RELS),
                           ("xl/worksheets/sheet1.xml", sheet_xml([(1, ['<c r="A1" t="s"><v>0</v></c>'])]))):
            zf.writestr(name, text)
        with zf.open("xl/sharedStrings.xml", "w", force_zip64=True) as out:
            out.write(f'<sst {_NS}>'.encode())
            written = 0
            while written < unpacked:
                if random_text:
                    word = "".join(rnd.choices(string.ascii_letters, k=64))
                    chunk = "".join(f"<si><t>{word[i:]}{i}</t></si>" for i in range(64)).encode()
                else:
                    chunk = b"<si><t>" + b"A" * (1 << 20) + b"</t></si>"
                out.write(chunk)
                written += len(chunk)
            out.write(b"</sst>")
    return path


@pytest.fixture
def make(harness_factory):
    def start(**offload):
        h = harness_factory(ScriptedModel(then="ok"), offload=offload)
        FakeSandbox(h.rt)
        return h
    return start


def _refused(h, client, path_or_bytes, name: str, status: int, *needles: str) -> None:
    tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    r = client.post(f"/api/threads/{tid}/uploads", files={"file": (name, data)}, headers=h.auth("alice"))
    assert r.status_code == status, r.text
    for needle in needles:
        assert needle in r.json()["error"], r.json()["error"]
    adir = h.rt.threads.get(tid, "alice", ["demo"]).artifacts_dir
    assert [p.name for p in adir.iterdir() if p.name != ".lock"] == [] if adir.exists() else True
    assert client.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["records"] == []
    assert not h.rt.turns.running(tid)


def test_shared_strings_bomb_is_refused_before_inflating(make, tmp_path) -> None:
    h = make()
    bomb = shared_strings_bomb(tmp_path / "ss.xlsx", 32 * 1024**2)  # 32 MiB of "A": ratio ~1000:1
    with TestClient(h.app()) as client:
        _refused(h, client, bomb, "ss.xlsx", 413, "upload_max_zip_ratio", "sharedStrings.xml")


def test_unpacked_size_limit(make, tmp_path) -> None:
    h = make(upload_max_unpacked_bytes=2 * 1024**2)
    bomb = shared_strings_bomb(tmp_path / "ss.xlsx", 3 * 1024**2, random_text=True)
    with TestClient(h.app()) as client:
        _refused(h, client, bomb, "ss.xlsx", 413, "upload_max_unpacked_bytes", "2 MiB")


def test_nested_archives_are_refused(make, tmp_path) -> None:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        zf.writestr("a.txt", "x")
    book = xlsx(tmp_path / "n.xlsx", sheet_xml([(1, [inline("A1", "a")]), (2, [num("A2", 1)])]),
                extra={"xl/media/payload.bin": inner.getvalue()})
    # a zip of zips (not a workbook at all) is an unsupported type
    level = inner.getvalue()
    for i in range(50):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"level{i}.zip", level)
        level = buf.getvalue()
    h = make()
    with TestClient(h.app()) as client:
        _refused(h, client, book, "n.xlsx", 413, "another archive", "payload.bin")
        _refused(h, client, level, "nested.zip", 400, "unsupported")


def test_sheet_bomb_stops_at_the_row_limits(make, tmp_path) -> None:
    h = make(upload_max_rows=1_000)
    many = xlsx(tmp_path / "rows.xlsx", sheet_xml(
        [(1, [inline("A1", "n")])] + [(r, [num(f"A{r}", r)]) for r in range(2, 5_000)]))
    # one cell far down: openpyxl fills the gap with empty rows (the 60 M-row bomb in small)
    gap = xlsx(tmp_path / "gap.xlsx", sheet_xml([(1, [inline("A1", "n")]), (2, [num("A2", 1)]),
                                                  (60_000_000, [num("A60000000", 2)])]))
    with TestClient(h.app()) as client:
        _refused(h, client, many, "rows.xlsx", 413, "1,000 rows", "upload_max_rows")
        _refused(h, client, gap, "gap.xlsx", 413, "1,000 rows")


def test_sheet_bomb_stops_at_excels_own_grid(make, tmp_path) -> None:
    h = make()
    gap = xlsx(tmp_path / "gap.xlsx", sheet_xml([(1, [inline("A1", "n")]), (2, [num("A2", 1)]),
                                                  (1_048_577, [num("A1048577", 2)])]))
    with TestClient(h.app()) as client:
        _refused(h, client, gap, "gap.xlsx", 413, "1,048,576 rows")


def test_xlsx_columns_and_cells(make, tmp_path) -> None:
    h = make(upload_max_columns=10, upload_max_cell_bytes=1_000)
    wide = xlsx(tmp_path / "wide.xlsx", sheet_xml([(1, [inline("A1", "a"), inline("Z1", "z")])]))
    big = xlsx(tmp_path / "cell.xlsx", sheet_xml([(1, [inline("A1", "a")]), (2, [inline("A2", "x" * 5_000)])]))
    with TestClient(h.app()) as client:
        _refused(h, client, wide, "wide.xlsx", 413, "26 columns", "upload_max_columns")
        _refused(h, client, big, "cell.xlsx", 413, "row 2, column 1", "upload_max_cell_bytes")


def test_xlsx_time_limit(make, tmp_path) -> None:
    h = make(upload_max_seconds=0.000001)
    slow = xlsx(tmp_path / "slow.xlsx", sheet_xml([(r, [num(f"A{r}", r)]) for r in range(1, 5_000)]))
    with TestClient(h.app()) as client:
        _refused(h, client, slow, "slow.xlsx", 413, "upload_max_seconds")


def test_csv_giant_cell_is_refused_while_streaming(make) -> None:
    h = make()
    head = b"a,b\n" + b"1,x\n" * 3
    giant = head + b'4,"' + b"y" * (8 * 1024**2) + b'"\n5,z\n'  # 5th line: one 8 MiB cell
    mid = head + b"4," + b"y" * (2 * 1024**2) + b"\n5,z\n"  # fits a block (4 MiB) but not a cell
    with TestClient(h.app()) as client:
        _refused(h, client, giant, "giant.csv", 413, "longer than 4 MiB", "upload_max_cell_bytes")
        _refused(h, client, mid, "mid.csv", 413, "column 'b'", "1 MiB cell limit")


def test_csv_rows_and_columns(make) -> None:
    h = make(upload_max_rows=100, upload_max_columns=50)
    with TestClient(h.app()) as client:
        _refused(h, client, b"a,b\n" + b"1,2\n" * 500, "rows.csv", 413, "100 rows")
        wide = ",".join(f"c{i}" for i in range(60)).encode() + b"\n" + b",".join([b"1"] * 60) + b"\n"
        _refused(h, client, wide, "wide.csv", 413, "60 columns")


def test_damaged_parquet_is_a_400(make) -> None:
    buf = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(50_000)), "s": [f"v{i}" for i in range(50_000)]}), buf,
                   compression="snappy")
    data = bytearray(buf.getvalue())
    for at in range(200, len(data) - 2_000, 997):  # scramble the data pages, keep the footer
        data[at] ^= 0xFF
    h = make()
    with TestClient(h.app()) as client:
        _refused(h, client, bytes(data), "bad.parquet", 400, "bad.parquet")


def test_stop_cancels_an_upload_and_frees_the_thread(make) -> None:
    h = make()
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    thread = h.rt.threads.get(tid, "alice", ["demo"])
    user = h.rt.users.get("alice")
    data = b"a,b\n" + b"12345,hello world\n" * 2_000_000  # ~36 MB: many batches of conversion
    h.rt.offload.progress_interval_s = 0.0  # report after the first batch

    async def scenario() -> None:
        converting = asyncio.Event()

        async def receive(fd: int) -> str:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            return "big.csv"

        up = asyncio.ensure_future(h.rt.attachments.upload(thread, user, receive,
                                                           progress=lambda **kw: converting.set()))
        done, _ = await asyncio.wait([up, asyncio.ensure_future(converting.wait())], timeout=30,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert up not in done, up.result()
        assert h.rt.turns.running(tid)
        assert await h.rt.turns.cancel(tid) is True
        with pytest.raises(UploadStopped, match="stopped"):
            await up
        assert not h.rt.turns.running(tid)

    asyncio.run(scenario())
    assert [p.name for p in thread.artifacts_dir.iterdir() if p.name != ".lock"] == []
    assert thread.records() == [] if hasattr(thread, "records") else True


def test_pasted_table_while_a_turn_runs_leaves_no_artifact(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="ok"), context={"max_message_tokens": 100})
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    thread = h.rt.threads.get(tid, "alice", ["demo"])
    user = h.rt.users.get("alice")
    table = "a,b\n" + "".join(f"{i},value {i}\n" for i in range(2_000))

    async def scenario() -> None:
        turn = h.rt.turns.reserve(tid, "alice")
        try:
            with pytest.raises(TurnConflict):
                await h.rt.attachments.message_text(thread, user, table)
        finally:
            h.rt.turns.release(turn)
        assert "saved as a file" in await h.rt.attachments.message_text(thread, user, table)

    asyncio.run(scenario())
    files = [p.name for p in thread.artifacts_dir.iterdir() if p.name != ".lock"]
    assert len([f for f in files if f.endswith(".parquet")]) == 1  # only the accepted one


def test_xlsx_parse_runs_in_a_memory_bounded_child(make, tmp_path) -> None:
    """Shared strings are all held before the first row: only a child's RLIMIT_AS bounds them."""
    h = make(upload_max_memory_bytes=450 * 1024**2)
    body = "".join(f"<si><t>{n}</t></si>" for n in range(1_600_000))  # ~34 MiB: under 1/12 of the limit
    book = xlsx(tmp_path / "strings.xlsx", sheet_xml([(1, ['<c r="A1" t="s"><v>0</v></c>'])]),
                shared=f"<sst {_NS}>{body}</sst>")
    ok = xlsx(tmp_path / "ok.xlsx", sheet_xml([(1, [inline("A1", "n")]), (2, [num("A2", 7)])]))
    with TestClient(h.app()) as client:
        _refused(h, client, book, "strings.xlsx", 413, "needed more than 450 MiB", "upload_max_memory_bytes")
        tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        r = client.post(f"/api/threads/{tid}/uploads", files={"file": ("ok.xlsx", ok.read_bytes())},
                        headers=h.auth("alice"))
        assert r.status_code == 201 and r.json()["artifact"]["rows"] == 1, r.text


def test_stop_kills_an_xlsx_parse_in_its_child(make, tmp_path) -> None:
    h = make()
    body = "".join(f"<si><t>{n}</t></si>" for n in range(1_500_000))  # seconds of parsing in the child
    book = xlsx(tmp_path / "slow.xlsx", sheet_xml([(1, ['<c r="A1" t="s"><v>0</v></c>'])]),
                shared=f"<sst {_NS}>{body}</sst>").read_bytes()
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
    thread = h.rt.threads.get(tid, "alice", ["demo"])
    user = h.rt.users.get("alice")

    async def scenario() -> float:
        received = asyncio.Event()

        async def receive(fd: int) -> str:
            with os.fdopen(fd, "wb") as out:
                out.write(book)
            received.set()
            return "slow.xlsx"

        up = asyncio.ensure_future(h.rt.attachments.upload(thread, user, receive))
        await received.wait()
        await asyncio.sleep(0.5)  # the child is parsing the shared strings now
        assert not up.done()
        assert await h.rt.turns.cancel(tid) is True
        with pytest.raises(UploadStopped):
            await up
        return 0.0

    asyncio.run(scenario())
    assert not h.rt.turns.running(tid)
    assert [p.name for p in thread.artifacts_dir.iterdir() if p.name != ".lock"] == []


def test_shared_strings_too_big_for_the_memory_limit_are_refused_at_once(make, tmp_path) -> None:
    h = make(upload_max_memory_bytes=64 * 1024**2)  # shared strings may unpack to 5 MiB
    body = "".join(f"<si><t>{n}</t></si>" for n in range(600_000))  # ~11 MB
    book = xlsx(tmp_path / "strings.xlsx", sheet_xml([(1, ['<c r="A1" t="s"><v>0</v></c>'])]),
                shared=f"<sst {_NS}>{body}</sst>")
    with TestClient(h.app()) as client:
        _refused(h, client, book, "strings.xlsx", 413, "shared strings", "upload_max_memory_bytes")
