"""The text shapes real servers answer with (issue 26): HTML tables, vertical records, count
lines beside a drawn table, a source's own words that it cut the result; and every one of them
read by the file door too (an upload, a paste), by the same readers as a tool's text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pytest

from datadesk.offload.readers import TEXT_TABLES, detect_text, file_batches, parse_text, sniff_file
from datadesk.offload.readers.errors import LimitExceeded, TabularParseError
from datadesk.offload.readers.json import stdlib_engine
from datadesk.offload.readers.limits import UploadLimits
from datadesk.offload.readers.text.notes import is_note, stated_rows
from datadesk.offload.source_cut import cap_metadata, judge, marked
from datadesk.domain.tools import ToolResult
from tests.fixtures.shapes import SHAPES, TRUNCATED, expected


def table(text: str, batch_rows: int = 1_000) -> tuple[pa.Table, object]:
    stream = parse_text(text, batch_rows=batch_rows)
    assert stream is not None, "not read as a table"
    batches = list(stream)
    return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive"), stream


def refused(text: str) -> str:
    """The error the readers give for `text` read to its end (parse_text, then every batch)."""
    stream = parse_text(text, batch_rows=1)  # (an error in the first batch: "not a table")
    assert stream is not None, "not even taken for a table"
    with pytest.raises(TabularParseError) as err:
        list(stream)
    return str(err.value)


# ------------------------------------------------------------------------------ HTML

def test_html_header_rows_spans_and_footer() -> None:
    html = """<p>Sales by region</p>
<table><thead><tr><th rowspan="2">region</th><th colspan="2">Sales</th></tr>
<tr><th>Q1</th><th>Q2</th></tr></thead>
<tbody><tr><td rowspan="2">north</td><td>1</td><td>2.5</td></tr><tr><td>3</td><td>4</td></tr>
<tr><td>south &amp; co</td><td colspan="2">7</td></tr></tbody>
<tfoot><tr><td>Total</td><td>11</td><td>6.5</td></tr></tfoot></table>"""
    t, stream = table(html, batch_rows=2)
    assert t.column_names == ["region", "Sales Q1", "Sales Q2"]
    assert t.to_pylist() == [{"region": "north", "Sales Q1": 1, "Sales Q2": 2.5},
                             {"region": "north", "Sales Q1": 3, "Sales Q2": 4.0},  # rowspan: the group label
                             {"region": "south & co", "Sales Q1": 7, "Sales Q2": None}]  # colspan: not repeated
    assert stream.facts.shape == "HTML table"
    assert "Total | 11 | 6.5" in stream.facts.prose and "Sales by region" in stream.facts.prose


def test_html_first_table_and_those_with_its_columns() -> None:
    page = ("<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>x</td></tr></table>"
            "<p>page 2</p><table><tr><th>a</th><th>b</th></tr><tr><td>2</td><td>y</td></tr></table>"
            "<table><tr><th>legend</th></tr><tr><td>a: the id</td></tr></table>")
    t, stream = table(page)
    assert t.to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert "tables 1, 2" in stream.facts.shape
    assert "table 3" in stream.facts.envelope["other HTML tables (not read)"]


def test_html_without_header_cells_uses_the_rows_to_decide() -> None:
    named = ("<table><tr><td>id</td><td>city</td></tr><tr><td>1</td><td>Oslo</td></tr>"
             "<tr><td>2</td><td>Rome</td></tr></table>")
    assert table(named)[0].column_names == ["id", "city"]
    data = "<table><tr><td>1</td><td>Oslo</td></tr><tr><td>2</td><td>Rome</td></tr></table>"
    assert table(data)[0].to_pylist() == [{"column_1": 1, "column_2": "Oslo"}, {"column_1": 2, "column_2": "Rome"}]


def test_html_scripts_are_never_run_nor_read_and_nested_tables_flatten() -> None:
    html = ("<html><head><title>x</title><script>alert('no')</script></head><body>"
            "<table><tr><th>k</th><th>v</th></tr>"
            "<tr><td>a<script>document.write('<td>evil</td>')</script></td>"
            "<td><table><tr><td>in</td></tr></table></td></tr>"
            "<tr><td>b<br>c</td><td>&lt;tag&gt;</td></tr></table></body></html>")
    t, stream = table(html)
    assert t.to_pylist() == [{"k": "a", "v": "in"}, {"k": "b c", "v": "<tag>"}]
    assert not any("alert" in p or "evil" in p for p in stream.facts.prose)


def test_bad_html_tables_name_the_row() -> None:
    long_row = ("<table><tr><th>a</th><th>b</th></tr>" + "<tr><td>1</td><td>2</td></tr>" * 3
                + "<tr><td>1</td><td>2</td><td>3</td></tr></table>")
    assert "HTML table 1: row 4 (line 1) has 3 cells but the header has 2 columns" in refused(long_row)
    short = "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td></tr></table>"  # short rows: padded
    assert table(short)[0].to_pylist() == [{"a": 1, "b": None}]
    assert table("<table><tr><th>a</th></tr></table>")[0].num_rows == 0  # a header, no rows
    assert parse_text("<p>no table here</p>") is None


# ---------------------------------------------------------------- vertical records

MYSQL = """*************************** 1. row ***************************
     id: 1
   name: ann
   note: first line
second line
*************************** 2. row ***************************
     id: 2
   name: NULL
   note: x: y
2 rows in set (0.00 sec)
"""


def test_mysql_vertical_records() -> None:
    t, stream = table(MYSQL, batch_rows=1)
    assert t.to_pylist() == [{"id": 1, "name": "ann", "note": "first line\nsecond line"},
                             {"id": 2, "name": None, "note": "x: y"}]
    assert stream.facts.shape == "MySQL vertical records (\\G)" and stream.facts.prose == ["2 rows in set (0.00 sec)"]
    assert not judge(stream.facts, 2).partial


@pytest.mark.parametrize("text,shape", [
    ("-[ RECORD 1 ]-+----\nid   | 1\nnote | hello +\n     | world\n-[ RECORD 2 ]-+----\nid   | 2\nnote | \n",
     "psql expanded records (\\x)"),
    ("Row 1:\n──────\nid:   1\nnote: hello\nworld\n\nRow 2:\n──────\nid:   2\nnote: \n", "vertical records (Row N:)"),
    ("Here you go:\n\n1. row\nid: 1\nnote: hello\nworld\n\n2. row\nid: 2\nnote:\n\nResult: 2 rows\n",
     "vertical records (N. row) in prose"),
])
def test_other_vertical_styles(text: str, shape: str) -> None:
    t, stream = table(text)
    assert t.to_pylist() == [{"id": 1, "note": "hello\nworld"}, {"id": 2, "note": None}]
    assert stream.facts.shape == shape


def test_vertical_records_in_another_order_are_placed_by_name() -> None:
    t, _ = table("1. row\nid: 1\nname: a\n\n2. row\nname: b\nid: 2\n")
    assert t.to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


@pytest.mark.parametrize("text,message", [
    ("1. row\nid: 1\nname: a\n\n2. row\nid: 2\n\n3. row\nid: 3\nname: c\n",
     "record 2 (line 5) lacks the column 'name' that record 1 has"),
    ("1. row\nid: 1\n\n2. row\nid: 2\n\n3. row\nid: 3\ncity: Oslo\n",
     "record 3 (line 7) has a column 'city' that record 1 does not have"),
    ("1. row\nid: 1\n\n2. row\nid: 2\nid: 3\n", "record 2 (line 4) has the column 'id' twice"),
    ("-[ RECORD 1 ]-\nid | 1\n-[ RECORD 2 ]-\n  | orphan\n",
     "record 2 (line 3) does not start with a `column| value` line"),
])
def test_ragged_vertical_records_name_the_record(text: str, message: str) -> None:
    assert message in refused(text)


# ------------------------------------------------------------ counts and cut words

@pytest.mark.parametrize("line,rows", [
    ("(32 rows)", 32), ("32 rows in set (0.01 sec)", 32), ("Result: 1,000 rows", 1000), ("1 row", 1),
    ("Total: 32 rows.", 32), ("showing 32 of 1,000 rows", 1000), ("Here are 32 rows for you", None),
    ("showing first 32 rows (output truncated)", None),
])
def test_stated_rows(line: str, rows: int | None) -> None:
    assert stated_rows([line]) == rows


def test_note_lines() -> None:
    for line in ("(truncated)", "... 968 more rows", "…", "LIMIT reached", "results limited to 32 rows",
                 "Showed first 9.",
                 "showing first 32 rows (output truncated)", "(32 rows)"):
        assert is_note(line), line
    for line in ("| 1 | 2 |", "north  12.5", "name: ann", "a partial refund"):
        assert not is_note(line), line
    assert is_note("a partial refund", loose=True)


def test_a_count_beside_the_table_is_checked_against_the_rows_read() -> None:
    t, stream = table(SHAPES["markdown_with_count"](40))
    assert t.num_rows == 40 and not judge(stream.facts, 40).partial
    assert cap_metadata(stream.facts, 40)["rows stated by the source"] == 40
    t, stream = table(TRUNCATED["markdown_with_count"](40, truncated=True))
    verdict = judge(stream.facts, t.num_rows)
    assert verdict.partial and "120 rows, its count says (this result has 40)" in verdict.words
    t, stream = table(SHAPES["markdown"](5) + "\n(3 rows)\n")  # more rows than it says: kept, and said
    assert t.num_rows == 5 and not judge(stream.facts, 5).partial
    assert cap_metadata(stream.facts, 5)["rows stated by the source"] == "3 (but 5 rows were read)"


@pytest.mark.parametrize("words", ["showing first 32 rows (output truncated)", "... 968 more rows", "(truncated)",
                                   "results limited to 32 rows", "has_more: true", "LIMIT reached",
                                   "Showed first 32."])  # (ClickHouse's)
@pytest.mark.parametrize("shape", ["markdown", "ascii_box", "psql", "html_table", "vertical_records"])
def test_a_sources_own_cut_words_mark_it_partial(shape: str, words: str) -> None:
    text = SHAPES[shape](32)
    text = text.replace("</table>", f"</table>\n<p>{words}</p>") if shape == "html_table" else text + words + "\n"
    t, stream = table(text)
    assert t.num_rows == 32, t.num_rows
    assert t.schema.field("paid").type == pa.bool_()  # the words were not read as a row
    verdict = judge(stream.facts, 32)
    assert verdict.partial and any(words in w for w in verdict.words), verdict.words


def test_a_small_result_with_the_sources_cut_words_is_marked_inline() -> None:
    text = SHAPES["markdown"](32) + "showing first 32 rows (output truncated)\n"
    out = marked(ToolResult(text), "{}", "crm__export")
    assert out.content.startswith(text) and "PARTIAL (by the source)" in out.content
    assert "32 rows are NOT all the data" in out.content and out.meta.rows == 32
    plain = ToolResult(SHAPES["markdown"](32))
    assert marked(plain) is plain
    prose = ToolResult("The export was truncated because the disk was full.")
    assert marked(prose) is prose  # no table: nothing to mark


def test_the_pipeline_marks_a_small_cut_result(tmp_path: Path) -> None:
    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.offload.pipeline import OffloadCapability
    from datadesk.settings import SandboxSettings, Settings
    from datadesk.store.threads import Thread
    from datadesk.tools.registry import ToolContext, ToolSpec

    rt = Runtime(settings=Settings(home=tmp_path, sandbox=SandboxSettings(backend="none")), model=ScriptedModel())
    tdir = rt.layout.thread_dir("demo", "alice", "t1")
    tdir.mkdir(parents=True)
    c = ToolContext(thread=Thread.at(tdir), workspace="demo", user="alice", permissions=frozenset(), call_id="c1")
    spec = ToolSpec(name="db__query", description="", parameters={}, read_only=True)
    text = SHAPES["vertical_records"](3).replace("3 rows in set", "Result: 300 rows; LIMIT reached")
    out = asyncio.run(rt.offload.process(spec, ToolResult(text), c.thread, c.origin("tool", spec.name, "{}"),
                                         OffloadCapability(True), c.epoch))
    assert out.artifact is None and "PARTIAL (by the source)" in out.result.content
    assert "these 3 rows are NOT all the data" in out.result.content


# ------------------------------------------------------------------- the file door

@pytest.mark.parametrize("shape,fmt", [
    ("markdown", "drawn table"), ("ascii_box", "drawn table"), ("psql", "drawn table"),
    ("html_table", "html table"), ("vertical_records", "vertical records"), ("vertical_psql", "vertical records"),
    ("repr_tuples", "python repr"), ("repr_dicts", "python repr"), ("repr_dict_lists", "python repr"),
    ("json_envelope", "json"), ("json_columnar", "json"), ("prose_json", "value in prose"), ("csv_header", "csv"),
])
def test_a_paste_and_a_file_are_classed_as_what_they_are(shape: str, fmt: str, tmp_path: Path) -> None:
    text = SHAPES[shape](30)
    assert detect_text(text) == fmt and fmt in TEXT_TABLES
    path = tmp_path / "f"
    path.write_text(text)
    assert sniff_file(path) == fmt
    _, batches = file_batches(path, fmt)
    assert sum(b.num_rows for b in batches) == expected(30)["rows"]


def test_a_markdown_table_with_commas_is_not_taken_for_csv() -> None:
    text = "| name | city, country |\n|---|---|\n" + "".join(f"| n{i} | Oslo, Norway |\n" for i in range(30))
    assert detect_text(text) == "drawn table"


def test_prose_is_still_text() -> None:
    assert detect_text("Dear team\nplease find the numbers below as discussed.\nThanks\n") == "text"
    assert detect_text("# A page\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                       + "\n".join(f"Paragraph {i} of the article." for i in range(40))) == "text"


def test_a_text_read_whole_is_bounded_and_the_error_names_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "big.md"
    path.write_text(SHAPES["markdown"](2_000))
    limits = UploadLimits(text_bytes=10_000).started()
    with pytest.raises(LimitExceeded, match=r"offload\.upload_max_text_bytes"):
        file_batches(path, sniff_file(path), limits=limits)
    with pytest.raises(LimitExceeded, match=r"offload\.upload_max_rows"):
        list(file_batches(path, "drawn table", batch_rows=500, limits=UploadLimits(rows=1_000).started())[1])


def test_the_file_door_says_why_a_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[1, 2, oops')
    with pytest.raises(TabularParseError, match="invalid JSON"):
        file_batches(path, sniff_file(path))
    path.write_text('{"a": 1, "b": "x"}\n')
    with pytest.raises(TabularParseError, match="found keys: a, b"):
        file_batches(path, sniff_file(path))
    path.write_text(MYSQL.replace("   note: x: y\n", ""))
    with pytest.raises(TabularParseError, match="record 2 .* lacks the column 'note'"):
        list(file_batches(path, sniff_file(path))[1])


def test_a_json_array_upload_still_streams_element_by_element(tmp_path: Path, monkeypatch) -> None:
    """The first batch of a big array comes after one bounded run is decoded (the stdlib
    reader), not after the readers of a tool's text took the whole text."""
    decoded = {"chars": 0}
    real = stdlib_engine.msgspec.json.decode

    def counting(buf, *a, **kw):
        decoded["chars"] += len(buf)
        return real(buf, *a, **kw)

    monkeypatch.setattr(stdlib_engine.msgspec.json, "decode", counting)
    path = tmp_path / "big.json"
    path.write_text("[" + ",".join('{"i": %d, "s": "v%d"}' % (i, i) for i in range(200_000)) + "]")
    _, batches = file_batches(path, sniff_file(path), batch_rows=1_000)
    assert not hasattr(batches, "facts")  # the stdlib reader, not the text readers
    first = next(iter(batches))
    assert first.num_rows == 1_000 and decoded["chars"] <= stdlib_engine.FAST_CHUNK_CHARS + 2
    ndjson = tmp_path / "rows.ndjson"
    ndjson.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(10)))
    _, batches = file_batches(ndjson, sniff_file(ndjson))
    assert not hasattr(batches, "facts") and sum(b.num_rows for b in batches) == 10


def test_a_count_right_under_a_fixed_width_table_is_no_row() -> None:
    text = ("name   amount\n-----  ------\nann    1.5\nbob    2\nResult: 2 rows\n")
    t, stream = table(text)
    assert t.to_pylist() == [{"name": "ann", "amount": 1.5}, {"name": "bob", "amount": 2.0}]
    assert stream.facts.prose == ["Result: 2 rows"] and not judge(stream.facts, 2).partial


def test_a_table_tag_inside_a_cell_or_a_sentence_is_no_html_table() -> None:
    csv = 'id,snippet\n1,"see <table><tr><td>x</td></tr></table>"\n2,plain\n'
    t, stream = table(csv)
    assert stream.facts.shape.startswith("CSV") and t.num_rows == 2
    assert parse_text("The page uses <table><tr><td>layout</td></tr></table> markup.") is None


@pytest.mark.parametrize("text", [
    SHAPES["html_table"](2_500), TRUNCATED["html_table"](40, truncated=True),
    "<table><thead><tr><th>a &amp; b</th><th>c</th></tr></thead><tbody><tr><td> x\n  y </td><td>&lt;1&gt;</td></tr>"
    "<tr><td></td><td>2</td></tr></tbody><tfoot><tr><td>t</td><td>9</td></tr></tfoot></table><p>after</p>",
])
def test_a_plain_html_table_reads_as_the_tokenizer_reads_it(text: str) -> None:
    from datadesk.offload.readers.base import SourceFacts
    from datadesk.offload.readers.html.pyarrow_engine import plain_batches
    from datadesk.offload.readers.html.stdlib_engine import HtmlText, table_batches

    fast, slow = SourceFacts("HTML table"), SourceFacts("HTML table")
    batches = plain_batches(HtmlText(text, fast), 1_000)
    assert batches is not None
    one = pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    other = pa.concat_tables([pa.Table.from_batches([b]) for b in table_batches(HtmlText(text, slow), 1_000)],
                             promote_options="permissive")
    assert one.equals(other) and fast.prose == slow.prose


@pytest.mark.parametrize("text", [
    "<table><tr><th>a</th></tr><tr><td>1 < 2</td></tr></table>",  # a `<` in a cell
    "<table><tr><th>a</th></tr><!-- a comment --><tr><td>1</td></tr></table>",
    "<TABLE><TR><TH>a</TH></TR><TR><TD>1</TD></TR></TABLE>",
    "<table><tr><th colspan=2>a</th></tr><tr><td>1</td><td>2</td></tr></table>",
    "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td></tr></table>",  # a short row: padded by the tokenizer
    "<table><tr><td>1</td></tr></table>",  # no header row: the tokenizer decides
    "<table><tr><th>a</th></tr><tr><td><b>1</b></td></tr></table>",
])
def test_what_is_not_plain_goes_to_the_tokenizer(text: str) -> None:
    from datadesk.offload.readers.base import SourceFacts
    from datadesk.offload.readers.html.pyarrow_engine import plain_batches
    from datadesk.offload.readers.html.stdlib_engine import HtmlText

    assert plain_batches(HtmlText(text, SourceFacts("HTML table")), 10) is None
    assert parse_text(text) is not None


@pytest.mark.parametrize("shape", ["vertical_records", "vertical_psql"])
def test_vertical_records_laid_out_alike_and_not_read_the_same(shape: str) -> None:
    """Records laid out as record 1 are cut a batch at a time; from one that is not (a value over
    two lines, fields in another order), line by line: the same table either way."""
    text = SHAPES[shape](2_500)
    fast, _ = table(text, batch_rows=1_000)
    lines = text.splitlines()
    at = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith("name") and ln.rstrip().endswith("name_1700"))
    lines[at] += "\nsecond line" if shape == "vertical_records" else " +\n       | second line"
    swapped = next(k for k, ln in enumerate(lines) if ln.rstrip().endswith("name_2200"))
    lines[swapped - 1], lines[swapped] = lines[swapped], lines[swapped - 1]  # price and name swapped
    mixed, stream = table("\n".join(lines) + "\n", batch_rows=1_000)
    assert mixed.num_rows == fast.num_rows == 2_500 and mixed.schema == fast.schema
    assert mixed["name"][1700].as_py() == "name_1700\nsecond line"
    assert mixed.slice(2000).equals(fast.slice(2000)) and mixed.slice(0, 1700).equals(fast.slice(0, 1700))
    if shape == "vertical_records":
        assert stream.facts.prose == ["2500 rows in set (0.02 sec)"]


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "cp1252"])
def test_a_text_read_whole_is_read_in_the_encoding_its_bytes_say(encoding: str, tmp_path: Path) -> None:
    text = "| name | city |\n|---|---|\n| José | Zürich |\n| Anaïs | Genève |\n"
    path = tmp_path / "t.md"
    path.write_bytes(text.encode(encoding))
    fmt = sniff_file(path)
    assert fmt == "drawn table"
    _, batches = file_batches(path, fmt)
    assert pa.Table.from_batches(list(batches)).to_pylist() == [{"name": "José", "city": "Zürich"},
                                                                {"name": "Anaïs", "city": "Genève"}]
