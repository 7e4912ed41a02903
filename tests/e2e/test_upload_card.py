"""The upload card in a real browser: how a CSV was read, the form that re-imports it with the
analyst's options, and a workbook's sheets each listed as its own table."""

from __future__ import annotations

import io
import time

import openpyxl
import pytest

from tests.e2e.conftest import login, shot

pytestmark = pytest.mark.browser

WRONG_GUESS = "Sales;2024\nregion;amount\nnörth;1,234\nsöuth;2,000\neast;3,500\n".encode("cp1252")


def until(page, expression: str, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.time() < deadline, f"timed out waiting for: {expression}"
        page.wait_for_timeout(100)


def _new_chat(page) -> None:
    old = page.evaluate("() => location.hash")
    page.click("#new-thread")
    until(page, f"location.hash.startsWith('#t=') && location.hash !== {old!r} && "
                "document.querySelector('#messages .empty')")


def _upload(page, name: str, data: bytes) -> None:
    page.set_input_files("#file-input", {"name": name, "mimeType": "application/octet-stream", "buffer": data})
    until(page, "document.querySelector('#upload-text').textContent.includes('uploaded')")


def test_the_card_shows_the_guess_and_re_imports_with_the_analysts_options(server, page) -> None:
    login(page, server)
    _new_chat(page)
    _upload(page, "sales.csv", WRONG_GUESS)
    assert page.inner_text("#upload-text") == "sales.csv uploaded: 4 rows."
    card = page.locator(".msg.user.upload", has_text="sales.csv")
    summary = card.locator("details.reading summary")
    assert "semicolon ; · decimal point . · header on line 1 · Windows-1252" in summary.inner_text()
    summary.click()
    form = card.locator("form.reimport")
    form.locator("select[name=decimal]").select_option(",")
    form.locator("input[name=header_row]").fill("2")
    shot(page, "upload-card-form")
    form.locator("button[type=submit]").click()
    page.locator(".notice", has_text="Re-imported sales.csv").wait_for()
    until(page, "document.querySelector('#toast').textContent.includes('3 rows × 2 columns')")
    card = page.locator(".msg.user.upload", has_text="sales.csv")
    assert "decimal comma , · header on line 2" in card.locator("details.reading summary").inner_text()
    assert "Read with your options" in card.locator("details.reading summary").inner_text()
    # a value the server refuses comes back with the field's name, shown in the form
    card.locator("details.reading summary").click()
    card.locator("select[name=thousands]").select_option(",")  # the decimal separator is "," too
    card.locator("form.reimport button[type=submit]").click()
    until(page, "(document.querySelector('.reimport-error') || {}).textContent")
    assert card.locator(".reimport-error").inner_text().startswith("thousands: ")


def test_a_workbook_lists_its_sheets(server, page) -> None:
    wb = openpyxl.Workbook()
    wb.active.title = "Q1"
    wb.active.append(["region", "amount"])
    wb.active.append(["north", 10])
    wb.create_sheet("Notes")
    q2 = wb.create_sheet("Q2")
    q2.append(["region", "amount"])
    q2.append(["south", 20])
    q2.append(["east", 30])
    buf = io.BytesIO()
    wb.save(buf)
    login(page, server)
    _new_chat(page)
    _upload(page, "sales.xlsx", buf.getvalue())
    assert "2 sheets, each its own table; skipped: Notes (empty)" in page.inner_text("#upload-text")
    card = page.locator(".msg.user.upload", has_text="sales.xlsx")
    items = card.locator(".upload-sheets li")
    assert items.count() == 2
    assert "Q1" in items.nth(0).inner_text() and "1 row × 2 columns" in items.nth(0).inner_text()
    assert "Q2" in items.nth(1).inner_text() and items.nth(1).locator(".open-grid").count() == 1
    assert "Sheets skipped: Notes (empty)" in card.inner_text()
    assert card.locator("details.reading").count() == 0  # nothing was skipped in either sheet
    page.reload()  # drawn again from the thread's log
    page.locator(".msg.user.upload .upload-sheets li", has_text="Q2").wait_for()
    shot(page, "upload-card-sheets")
