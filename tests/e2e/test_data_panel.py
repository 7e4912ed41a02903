"""The Data panel in the browser (issue 31, item 1): it lists every source, table and MCP server
of the demo workspace that `datadesk serve` creates, a table's Sample shows its rows, "Ask about
this table" puts a question naming it in the composer, and an empty chat shows "your data"."""

from __future__ import annotations

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
