"""Exporting a thread (threads/export.py, threads/notebook.py, api/controllers/export.py): a real analysis thread
(the demo's offloaded SQL + python with charts and reports, run by the local sandbox), exported
as Markdown, HTML, a notebook (valid nbformat 4) and a zip whose notebook reruns with nbclient on
the local ipykernel against the exported artifacts, giving the same numbers."""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
import zipfile

import httpx
import nbformat
import pytest
from nbclient import NotebookClient

from datadesk.llm.demo import demo_model
from datadesk.llm.demo_plans import PLANS
from tests.conftest import parse_sse, serve_app

QUESTIONS = [PLANS[0].question, "which city uses most", PLANS[3].question]


def _numbers(text: str) -> dict | None:
    m = re.search(r"DEMO_RESULT (\{.*\})", text)
    return json.loads(m.group(1)) if m else None


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One analysis thread of three turns, and its exports in every format."""
    from tests.conftest import make_harness
    from datadesk.store.demo import create_demo_warehouse
    from datadesk.store.layout import Layout
    from datadesk.store.workspaces import ensure_demo_workspace

    home = tmp_path_factory.mktemp("export") / "var"
    create_demo_warehouse(Layout(home).workspace_data_dir("demo"))
    ensure_demo_workspace(Layout(home))
    h = make_harness(home, demo_model(), sandbox={"backend": "local", "pool_size": 0, "exec_timeout_s": 90,
                                                  "memory_mb": 2048, "run_dir": tempfile.mkdtemp(prefix="ddr-")})
    out: dict = {"home": home}
    with serve_app(h.app()) as base, httpx.Client(base_url=base, headers=h.auth("alice"), timeout=300) as c:
        tid = c.post("/api/threads", json={"title": "Energy review 2024"}).json()["id"]
        for q in QUESTIONS:
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": q}).text)
            assert events[-1][1]["status"] == "ok", events[-3:]
        for fmt in ("md", "html", "ipynb", "zip"):
            r = c.get(f"/api/threads/{tid}/export", params={"format": fmt})
            assert r.status_code == 200, r.text
            out[fmt] = r
        for fmt in ("md", "html"):
            r = c.get(f"/api/threads/{tid}/export", params={"format": fmt, "audience": "readers"})
            assert r.status_code == 200, r.text
            out[f"readers-{fmt}"] = r
        out["bad-audience"] = c.get(f"/api/threads/{tid}/export", params={"format": "md", "audience": "boss"})
        out["readers-ipynb"] = c.get(f"/api/threads/{tid}/export", params={"format": "ipynb", "audience": "readers"})
        out["audit"] = h.rt.audit
        out["bad"] = c.get(f"/api/threads/{tid}/export", params={"format": "pdf"})
        out["other"] = c.get(f"/api/threads/{tid}/export", params={"format": "md"}, headers=h.auth("bob"))
        out["records"] = c.get(f"/api/threads/{tid}").json()["records"]
    return out


def test_notebook_is_valid_nbformat_with_sql_and_python_cells(exported) -> None:
    r = exported["ipynb"]
    assert 'filename="Energy_review_2024.ipynb"' in r.headers["content-disposition"]
    nb = nbformat.reads(r.text, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "def sql_result" in code[0].source and "DATADESK_WAREHOUSE" in code[0].source
    sql_cells = [c for c in code if "sql_result(" in c.source and "def sql_result" not in c.source]
    assert len(sql_cells) == 3
    assert "artifact=" in sql_cells[0].source and "inline=" in sql_cells[1].source  # offloaded / inline result
    py_cells = [c for c in code if "read_parquet(\"data/" in c.source]
    assert len(py_cells) == 2 and "/data/" not in py_cells[0].source and '"outputs/' in py_cells[0].source
    # the python cells carry their outputs as they ran: text and the chart
    assert _numbers(_stdout(py_cells[0])) and any("image/png" in o.get("data", {}) for o in py_cells[0].outputs)
    assert [c.source for c in nb.cells if c.cell_type == "markdown"][1].startswith("**You:** ")


def test_the_zip_reruns_with_nbclient_and_gives_the_same_numbers(exported, tmp_path, monkeypatch) -> None:
    zf = zipfile.ZipFile(io.BytesIO(exported["zip"].content))
    names = zf.namelist()
    assert "Energy_review_2024/notebook.ipynb" in names and "Energy_review_2024/README.txt" in names
    assert sum(1 for n in names if n.startswith("Energy_review_2024/data/") and n.endswith(".parquet")) == 2
    zf.extractall(tmp_path)
    folder = tmp_path / "Energy_review_2024"
    original = nbformat.read(folder / "notebook.ipynb", as_version=4)
    before = [_numbers(_stdout(c)) for c in original.cells if c.cell_type == "code" and _numbers(_stdout(c))]
    assert len(before) == 2

    def run(nb):
        client = NotebookClient(nb, timeout=180, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}})
        client.execute()
        return nb

    ran = run(nbformat.read(folder / "notebook.ipynb", as_version=4))
    after = [_numbers(_stdout(c)) for c in ran.cells if c.cell_type == "code" and _numbers(_stdout(c))]
    assert after == before  # the same numbers, computed again from the exported artifacts
    assert "2 of 2 artifacts" in _stdout(ran.cells[1]) or "artifacts in" in _stdout(ran.cells[1])
    assert (folder / "outputs" / "energy_through_the_year.md").is_file()  # the code's /outputs, here
    shown = [o["data"]["text/plain"] for c in ran.cells if c.cell_type == "code" for o in c.outputs
             if o.get("output_type") == "execute_result"]
    assert any("7940 rows" in s for s in shown)
    # against the warehouse instead of the saved results: the SQL cells re-run, same numbers again
    warehouse = tmp_path / "warehouse.duckdb"
    shutil.copy(exported["home"] / "workspaces" / "demo" / "data" / "warehouse.duckdb", warehouse)
    monkeypatch.setenv("DATADESK_WAREHOUSE", str(warehouse))
    again = run(nbformat.read(folder / "notebook.ipynb", as_version=4))
    assert [_numbers(_stdout(c)) for c in again.cells if c.cell_type == "code" and _numbers(_stdout(c))] == before


def test_markdown_and_html_hold_every_turn(exported) -> None:
    md = exported["md"].text
    assert md.startswith("# Energy review 2024")
    for q in QUESTIONS:
        assert f"\n{q}\n" in md
    assert "```sql\nSELECT" in md and "```python\nimport json" in md and "](data:image/png;base64," in md
    r = exported["html"]
    page = r.text
    assert r.headers["content-disposition"].startswith("inline;")
    csp = r.headers["content-security-policy"]
    assert csp.startswith("sandbox;") and "script-src" not in csp and "img-src data:" in csp
    assert "<script" not in page and page.count('class="turn user"') == 3
    assert page.count('<img src="data:image/png;base64,') == 2 and "@media print" in page
    assert exported["bad"].status_code == 400 and "pdf" in exported["bad"].json()["error"]
    assert exported["other"].status_code == 404  # bob cannot export alice's thread


MODEL_FACING = ("NOTICE", "NOT the full data", "/data/", "/outputs/", "sandbox path", "[Result saved as artifact",
                "```sql", "SELECT ", "import ")


def test_the_export_for_readers_has_answers_and_charts_and_no_plumbing(exported) -> None:
    full, md, page = exported["md"].text, exported["readers-md"].text, exported["readers-html"].text
    assert "NOTICE: this is a preview" in full and "/data/" in full  # the transcript has them...
    for text in MODEL_FACING:  # ...the readers' copies do not
        assert text not in md, text
        assert text not in page, text
    assert md.startswith("# Energy review 2024")
    for q in QUESTIONS:
        assert f"\n## {q}\n" in md and f"<h2>{q}</h2>" in page
    assert md.count("](data:image/png;base64,") == 2 and page.count('<img src="data:image/png;base64,') == 2
    assert "<script" not in page and exported["readers-html"].headers["content-security-policy"].startswith("sandbox;")
    assert 'filename="Energy_review_2024-for-readers.md"' in exported["readers-md"].headers["content-disposition"]


def test_an_export_for_readers_is_refused_where_it_means_nothing(exported) -> None:
    bad = exported["bad-audience"]
    assert bad.status_code == 400 and "'boss'" in bad.json()["error"]
    nb = exported["readers-ipynb"]
    assert nb.status_code == 400 and "md and html" in nb.json()["error"]


def test_tables_keep_their_alignment_in_both_html_exports(exported) -> None:
    for key in ("html", "readers-html"):
        page = exported[key].text
        assert '<td class="dd-al-right">' in page and "style=" not in page.split("</style>", 1)[1], key
