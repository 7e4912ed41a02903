"""The Data panel in the browser (issue 31, item 1): it lists every source, table and MCP server
of the demo workspace that `datadesk serve` creates, a table's Sample shows its rows, "Ask about
this table" puts a question naming it in the composer, and an empty chat shows "your data".
A source added to workspace.toml while the server runs shows when the panel is reopened, and a bad
edit shows the config error while the last good config stays in use."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import login, shot
from tests.e2e.test_web import api, until

pytestmark = pytest.mark.browser


def test_data_panel_lists_the_demo_workspace_samples_and_asks(server, page) -> None:
    token = server.token()
    with api(server, token) as c:
        cat = c.get("/api/workspace/catalog").json()
        tid = c.post("/api/threads", json={"title": "data"}).json()["id"]
    tables = [(s["name"], t["name"]) for s in cat["sources"] for t in s["tables"]]
    assert cat["sources"][0]["name"] == "warehouse" and len(tables) >= 3, cat

    login(page, server)
    page.goto(f"{server.base}/#t={tid}")
    page.wait_for_selector("#messages .your-data")  # the empty chat: a summary of the data
    assert f"{len(tables)} tables" in page.inner_text("#messages .your-data")
    page.click("#messages .your-data a.open-data")
    page.wait_for_selector("#panel[data-panel='data'] section.data-source")
    for src in cat["sources"]:
        assert page.locator(f"#panel-body section.data-source[data-source='{src['name']}']").count() == 1
    for source, table in tables:
        item = page.locator(f"#panel-body li[data-source='{source}'][data-table$='{table}']")
        assert item.count() == 1, (source, table)
    for m in cat["mcp"]:
        assert page.locator(f"#panel-body li[data-mcp='{m['name']}']").count() == 1

    source, table = tables[0]
    item = page.locator(f"#panel-body li[data-source='{source}'][data-table$='{table}']")
    item.locator("button.sample").click()
    item.locator(".data-sample table tbody tr").first.wait_for()
    assert item.locator(".data-sample table tbody tr").count() >= 1
    shot(page, "data-panel")
    item.locator("button.ask").click()
    until(page, f"document.querySelector('#input').value.includes('{table}')")
    assert "the warehouse" in page.input_value("#input")
    assert page.locator("#panel").is_hidden()


def reopen_data_panel_until(page, selector: str, present: bool = True, timeout_s: float = 30.0) -> None:
    """Close and open the Data panel until `selector` is in it (or, not `present`, is not): the
    server looks at its workspace.toml at most once a second."""
    deadline = time.time() + timeout_s
    while True:
        if page.locator("#panel").is_visible():
            page.click("#open-data")  # the button toggles: close first
        page.click("#open-data")
        page.wait_for_selector("#panel[data-panel='data'] #panel-body:not([aria-busy])")
        if bool(page.locator(f"#panel-body {selector}").count()) == present:
            return
        assert time.time() < deadline, f"the data panel never showed {selector}: {page.inner_text('#panel-body')}"
        page.wait_for_timeout(300)


def test_data_panel_lists_a_source_added_to_workspace_toml_while_serving(server, page) -> None:
    from datadesk.store.layout import Layout
    from tests.dbkit import make_sqlite

    layout = Layout(server.home)
    make_sqlite(layout.workspace_data_dir("demo") / "shop.sqlite", rows=40)
    cfg = layout.workspace_config("demo")
    original = cfg.read_text()
    with api(server, server.token()) as c:
        tid = c.post("/api/threads", json={"title": "reload"}).json()["id"]
    login(page, server)
    page.goto(f"{server.base}/#t={tid}")
    reopen_data_panel_until(page, "section.data-source[data-source='warehouse']")
    assert page.locator("#panel-body section.data-source[data-source='shop']").count() == 0
    try:
        cfg.write_text(original + '\n[sources.shop]\nurl = "sqlite:///data/shop.sqlite"\n'
                       'description = "The shop, added while serving"\n')
        reopen_data_panel_until(page, "section.data-source[data-source='shop']")
        assert "The shop, added while serving" in page.inner_text("#panel-body section.data-source[data-source='shop']")
        assert page.locator("#panel-body li[data-source='shop'][data-table$='orders']").count() == 1
        assert page.locator("#panel-body .config-error").count() == 0

        cfg.write_text(cfg.read_text().replace("[sources.shop]", 'disabled_tools = "sql_query"\n[sources.shop]'))
        reopen_data_panel_until(page, ".config-error")
        error = page.inner_text("#panel-body .config-error")
        assert str(cfg) in error and "key 'disabled_tools'" in error and "last good config" in error
        assert page.locator("#panel-body section.data-source[data-source='shop']").count() == 1  # still served
        shot(page, "data-panel-config-error")
    finally:
        cfg.write_text(original)
    reopen_data_panel_until(page, "section.data-source[data-source='shop']", present=False)  # removed
    assert page.locator("#panel-body section.data-source[data-source='warehouse']").count() == 1
