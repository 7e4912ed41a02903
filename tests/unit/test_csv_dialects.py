"""CSV dialects and encodings (readers/csv/dialect.py, encoding.py, plan.py) and a workbook's
sheets (readers/excel/layout.py): what is sniffed, what is read, what is left out and said."""

from __future__ import annotations

from pathlib import Path

import openpyxl
import pyarrow as pa
import pytest

from datadesk.offload.readers import file_tables, parse_text, sniff_file
from datadesk.offload.readers.casts import local_numbers
from datadesk.offload.readers.csv.dialect import ChoiceError, ReadChoices, sniff_dialect
from datadesk.offload.readers.csv.encoding import ENCODINGS, sniff_encoding
from datadesk.offload.readers.csv.plan import plan_file
from datadesk.offload.readers.csv.pyarrow_engine import csv_batches
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.limits import UploadLimits

EU = ("Sales report 2024\nExported 2024-05-01\n\nregion;amount;qty;note\n"
      'north;1.234,56;3;"a; b"\nsouth;12,5;4;x\neast;-2.000,00;1;\nTotal;-753,94;8;\n')


def _table(batches) -> pa.Table:
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")


@pytest.mark.parametrize("text,delimiter,decimal,thousands,header_row", [
    (EU, ";", ",", ".", 4),
    ("a;b;c\n1;2;3\n", ";", ".", "", 1),
    ("a\tb\n1,5\t2\nx, y\t3\n", "\t", ",", "", 1),
    ("a|b|c\n1|2|3\n4|5|6\n", "|", ".", "", 1),
    ('a,b\n"x, y",2\n"multi\nline",3\n', ",", ".", "", 1),
    ("k;v\na;1 234,56\nb;2\u00a0345,5\nc;3\u202f000\n", ";", ",", " ", 1),
    ('k,v\na,"1,234.5"\nb,"2,000.25"\n', ",", ".", ",", 1),
    ("My report\nid,name,v\n1,x,2.5\n2,y,3.5\n", ",", ".", "", 2),
    ("sep=;\na;b\n1,5;2\n3;4\n", ";", ",", "", 2),
])
def test_sniffed_dialects(text, delimiter, decimal, thousands, header_row) -> None:
    d = sniff_dialect(text, True)
    assert (d.delimiter, d.decimal, d.thousands, d.header_row) == (delimiter, decimal, thousands, header_row)


@pytest.mark.parametrize("text", [
    "hello world\nthis is prose, with a comma\nno table here\n", "single,line", "",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",  # a Markdown table is not a pipe-separated file
])
def test_not_delimited(text) -> None:
    assert sniff_dialect(text, True) is None


def test_title_and_totals_are_left_out_and_said(tmp_path: Path) -> None:
    p = tmp_path / "eu.csv"
    p.write_text(EU)
    dialect, span = plan_file(p)
    table = _table(csv_batches(p, dialect=dialect, span=span))
    assert table.column_names == ["region", "amount", "qty", "note"]
    assert table.column("amount").to_pylist() == [1234.56, 12.5, -2000.0]
    assert table.column("note").to_pylist() == ["a; b", "x", ""]
    said = dialect.describe()
    assert "2 lines above the header were skipped: 'Sales report 2024 / Exported 2024-05-01'" in said
    assert "a totals line was left out: 'Total;-753,94;8;'" in said and "decimal comma" in said


@pytest.mark.parametrize("encoding,bom", [
    ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
    ("utf-16-le", b""), ("utf-16-be", b""), ("cp1252", b""),
])
def test_encodings(tmp_path: Path, encoding: str, bom: bytes) -> None:
    text = EU.replace("north", "Köln €").replace("south", "Genève")
    p = tmp_path / "f.csv"
    p.write_bytes(bom + text.encode(encoding))
    assert sniff_file(p) == "csv"
    (table,) = file_tables(p, "csv")
    got = _table(table.stream)
    assert got.column("region").to_pylist() == ["Köln €", "Genève", "east"]
    assert got.column("amount").to_pylist() == [1234.56, 12.5, -2000.0]
    assert got.column_names[0] == "region"  # no BOM left in the first name


def test_encoding_sniff() -> None:
    assert sniff_encoding(b"a,b\n1,2\n", True) == "utf-8"
    assert sniff_encoding("a;b\né;€\n".encode("cp1252"), True) == "cp1252"
    assert sniff_encoding("a,b\n".encode("utf-16-le"), True) == "utf-16-le"
    assert sniff_encoding(bytes(range(256)) * 4, True) is None  # binary: NULs in no UTF-16 pattern
    assert sniff_encoding("é".encode() * 10 + b"\xc3", False) == "utf-8"  # a character cut by the head's end


def test_bad_bytes_are_named_with_the_encoding(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes(b"a;b\n1;x\n2;\x81\n")
    (table,) = file_tables(p, "csv")
    with pytest.raises(TabularParseError, match=r"not cp1252 at byte 10 \(line 3\); re-import it with another encoding"):
        list(table.stream)


def test_errors_name_the_line_of_the_file(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_text("Title\n\na;b\n1;2\n3;4\n5;6;7\n8;9\n")
    (table,) = file_tables(p, "csv")
    with pytest.raises(TabularParseError, match="CSV line 6: expected 2 columns, got 3"):
        list(table.stream)


def test_a_file_without_a_header_gets_column_names(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_text("1,x,2.5\n2,y,3.5\n3,z,1\n")
    (table,) = file_tables(p, "csv")
    assert _table(table.stream).column_names == ["column_1", "column_2", "column_3"]


def test_choices_override_the_guess(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes("x\ny\nname;v\nJosé;1,5\nA;2\n".encode("cp1252"))
    choices = ReadChoices(delimiter=";", decimal=",", header_row=3, encoding="cp1252")
    (table,) = file_tables(p, "csv", choices=choices)
    got = _table(table.stream)
    assert got.to_pylist() == [{"name": "José", "v": 1.5}, {"name": "A", "v": 2.0}]
    assert table.stream.facts.reading["chosen"] == ["delimiter", "decimal", "header_row"]
    numbers = tmp_path / "n.csv"
    numbers.write_text("1;2\n3;4\n")
    (guessed,) = file_tables(numbers, "csv")
    assert _table(guessed.stream).column_names == ["column_1", "column_2"]  # sniffed: no header
    (header,) = file_tables(numbers, "csv", choices=ReadChoices(header_row=1))
    assert _table(header.stream).to_pylist() == [{"1": 3, "2": 4}]  # the user says line 1 is the header


@pytest.mark.parametrize("body,field", [
    ({"delimiter": "x"}, "delimiter"), ({"decimal": ";"}, "decimal"), ({"header_row": -1}, "header_row"),
    ({"header_row": "3"}, "header_row"), ({"header_row": True}, "header_row"), ({"encoding": "klingon"}, "encoding"),
    ({"thousands": "_"}, "thousands"), ({"decimal": ",", "thousands": ","}, "thousands"), ({"sheet": 1}, "sheet"),
    ([1], "body"),
])
def test_bad_choices_name_the_field(body, field) -> None:
    with pytest.raises(ChoiceError) as err:
        ReadChoices.parse(body, ENCODINGS)
    assert err.value.field == field and str(err.value).startswith(f"{field}: ")


def test_choices_parse() -> None:
    c = ReadChoices.parse({"delimiter": "tab", "decimal": ",", "header_row": 3, "encoding": "Windows-1252"}, ENCODINGS)
    assert c == ReadChoices(delimiter="\t", decimal=",", header_row=3, encoding="cp1252")


def test_local_numbers() -> None:
    assert local_numbers(pa.array(["1.234,56", "12,5", None, "", "-3"]), ",", ".").to_pylist() == \
        [1234.56, 12.5, None, None, -3.0]
    assert local_numbers(pa.array(["1.234", "12"]), ",", ".").to_pylist() == [1234, 12]
    assert local_numbers(pa.array(["1 234,5", "2\u00a0000,25", "3\u202f000"]), ",", " ").to_pylist() == \
        [1234.5, 2000.25, 3000.0]
    kept = pa.array(["1,234.5", "x"])
    assert local_numbers(kept, ".", ",") is kept  # one value is no number: nothing is changed


def test_tool_text_reads_the_same_dialect() -> None:
    stream = parse_text(EU)
    table = _table(stream)
    assert table.column("amount").to_pylist() == [1234.56, 12.5, -2000.0]
    assert "decimal comma" in stream.facts.shape and "a totals line was left out" in stream.facts.shape
    assert stream.facts.prose == ["Sales report 2024", "Exported 2024-05-01"]


def test_sniff_reads_a_cut_sample() -> None:
    """A 64 KiB head cut mid-record is sniffed (its speed: bench/csv_sniff.py)."""
    rows = "".join(f"r{i};{i:,}.{i % 100:02d};{i};\"n; {i}\"\n".replace(",", ".", 1) for i in range(3000))
    sample = ("region;amount;qty;note\n" + rows)[:64 * 1024]
    for _ in range(10):
        assert sniff_dialect(sample, False).delimiter == ";"


# ----------------------------------------------------------------------- Excel

def _workbook(path: Path) -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sales"
    ws.append(["Sales 2024"])
    ws.merge_cells("A1:E1")
    ws.append([])
    ws.append(["Region", "Q1", None, "Q2", None])
    ws.merge_cells("B3:C3")
    ws.merge_cells("D3:E3")
    ws.merge_cells("A3:A4")
    ws.append([None, "sales", "units", "sales", "units"])
    ws.append(["north", 1.5, 2, 3, 4])
    ws.append(["south", 2.5, 3, 4, 5])
    ws.append(["Total", 4, 5, 7, 9])
    wb.create_sheet("Empty")
    other = wb.create_sheet("Sheet2")
    other.append(["k", "v"])
    other.append(["a", 1])
    wb.save(path)


@pytest.mark.parametrize("memory", [0, 2 * 1024**3], ids=["in-process", "child"])
def test_every_sheet_with_its_layout(tmp_path: Path, memory: int) -> None:
    path = tmp_path / "book"
    _workbook(path)
    tables = list(file_tables(path, "xlsx", limits=UploadLimits(memory_bytes=memory).started()))
    assert [(t.name, t.skipped) for t in tables] == [("Sales", None), ("Empty", "empty"), ("Sheet2", None)]
    sales = _table(tables[0].stream)
    assert sales.column_names == ["Region", "Q1 sales", "Q1 units", "Q2 sales", "Q2 units"]
    assert sales.num_rows == 2 and sum(sales.column("Q1 sales").to_pylist()) == 4.0
    facts = tables[0].stream.facts
    assert "1 row above the header was skipped: 'Sales 2024'" in facts.shape
    assert "a totals row was left out: 'Total | 4 | 5 | 7 | 9'" in facts.shape
    assert facts.reading["merged_header"] and facts.reading["header_row"] == 3
    assert _table(tables[2].stream).to_pylist() == [{"k": "a", "v": 1}]
    assert list(tmp_path.glob("*.batches.tmp")) == []


# ------------------------------------------------- the kept original and the quotas

def test_the_kept_original_counts_in_the_quota_and_goes_with_its_artifact(tmp_path: Path) -> None:
    import msgspec

    from datadesk.domain.artifacts import ArtifactOrigin
    from datadesk.llm.tokens import count_tokens
    from datadesk.offload.artifacts.quota import ArtifactQuota
    from datadesk.offload.artifacts.store import ArtifactStore, new_artifact_id
    from datadesk.offload.pipeline import OffloadPipeline
    from datadesk.offload.uploads import ingest_upload
    from datadesk.settings import OffloadSettings
    from datadesk.store.layout import Layout
    from datadesk.store.threads import Thread

    layout = Layout(tmp_path / "home")
    store = ArtifactStore(layout)
    settings = OffloadSettings(user_max_bytes=60_000)
    pipeline = OffloadPipeline(settings, store, count_tokens)
    d = layout.thread_dir("demo", "alice", "t1")
    d.mkdir(parents=True)
    thread = Thread(d)
    origin = ArtifactOrigin(source="upload", user="alice", thread="t1", workspace="demo", filename="a.csv")
    staged = d / "artifacts" / ".upload-x.tmp"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text("k;v\n" + "".join(f"k{i};{i},5\n" for i in range(5_000)))  # ~50 KB
    size = staged.stat().st_size
    (art, _, _), = ingest_upload(pipeline, thread, staged, "a.csv", origin).tables
    assert art.original == f"{art.id}.original-csv" and art.original_bytes == size
    assert art.stored_bytes == art.bytes + size and (thread.artifacts_dir / art.original).exists()
    assert not staged.exists()
    # a second upload passes the user's bytes quota only because the first one's original counts
    other = msgspec.structs.replace(art, id=new_artifact_id(), file="x.parquet", original=None, original_bytes=0,
                                    last_used=art.last_used + 10)
    (thread.artifacts_dir / "x.parquet").write_bytes(b"x" * 20_000)
    store.save(thread, msgspec.structs.replace(other, bytes=20_000))
    evicted = ArtifactQuota(settings, store).enforce(trigger_user="alice")
    assert [e.artifact for e in evicted] == [art.id]
    assert not (thread.artifacts_dir / art.original).exists() and store.load(thread, art.id).status == "expired"
