"""A giant streamed answer (a 300 KB Markdown table) does not freeze the server: rendering is
bounded per delta and runs off the event loop (issue 15)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from datadesk.api.render import LIVE_BLOCK_CHARS, LiveMarkdown, markdown_html
from datadesk.llm.scripted import ScriptedModel, ScriptStep
from tests.conftest import parse_sse, serve_app

pytestmark = pytest.mark.security


def big_table(min_chars: int) -> str:
    rows = ["| id | name | value | note |", "|---:|---|---:|---|"]
    i, total = 0, sum(len(r) + 1 for r in rows)  # kept as it grows (summing each time was quadratic)
    while total < min_chars:
        rows.append(f"| {i} | sensor-{i % 97} | {i * 3.25:.2f} | reading number {i} of the day |")
        total += len(rows[-1]) + 1
        i += 1
    return "Here are all rows:\n\n" + "\n".join(rows) + "\n\nThat is all.\n"


@pytest.mark.serial  # measures /api/health's latency (< 1 s) while the answer streams
def test_a_300kb_streamed_table_keeps_health_answering(harness_factory) -> None:
    answer = big_table(300_000)
    assert answer.count("\n") > 4000
    h = harness_factory(ScriptedModel([ScriptStep(text=answer, delay_s=0.0005)], chunk_size=256))
    health: list[float] = []
    done = threading.Event()
    with serve_app(h.app()) as base:
        def poll() -> None:
            with httpx.Client(base_url=base, timeout=30) as c:
                while not done.is_set():
                    t = time.monotonic()
                    assert c.get("/api/health").status_code == 200
                    health.append(time.monotonic() - t)
                    time.sleep(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            with httpx.Client(base_url=base, timeout=120, headers=h.auth("alice")) as c:
                tid = c.post("/api/threads", json={"title": "big"}).json()["id"]
                events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": "show all rows"}).text)
                detail = c.get(f"/api/threads/{tid}").json()
        finally:
            done.set()
            poller.join(30)
    assert events[-1][0] == "done"
    completed = [d for e, d in events if e == "message.completed"]
    assert completed and completed[-1]["content"] == answer
    live = [d["html"] for e, d in events if e == "message.delta" and "html" in d]
    assert live, "the live view was refreshed while streaming"
    # the record in the log is the whole answer
    assert [r["content"] for r in detail["records"] if r["role"] == "assistant"] == [answer]
    assert len(health) > 5
    assert max(health) < 1.0, f"health waited {max(health):.2f}s while the answer streamed"


def test_live_rendering_caches_finished_blocks_and_degrades_a_giant_block() -> None:
    md = ("# Title\n\nSome *text*.\n\n```python\nx = 1\n\ny = 2\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
          "- one\n- two\n")
    live = LiveMarkdown()
    for i in range(0, len(md), 7):
        live.feed(md[i:i + 7])
        live.render()
    assert live.render() == markdown_html(md)  # block by block gives the same HTML here

    table = big_table(LIVE_BLOCK_CHARS + 10_000)
    live = LiveMarkdown()
    live.feed("Intro **bold**.\n\n")
    live.feed(table[:LIVE_BLOCK_CHARS // 2])
    assert "<table>" in live.render()
    live.feed(table[LIVE_BLOCK_CHARS // 2:])
    out = live.render()
    assert "<strong>bold</strong>" in out  # the finished block stays rendered
    assert '<pre class="dd-plain">' in out and "<table>" not in out  # the giant open block is plain text


def test_a_text_past_the_hard_cap_is_plain_escaped_text() -> None:
    out = markdown_html("<script>x</script>\n" * 10, limit=50)
    assert out.startswith('<pre class="dd-plain">') and "<script>" not in out


def test_a_long_text_renders_block_by_block() -> None:
    """Past LIVE_BLOCK_CHARS a text is rendered per block (bounded work per call): tables stay
    tables while each block is small; a single giant block is shown as plain text."""
    from datadesk.api.render import LIVE_BLOCK_CHARS, markdown_html

    table = "| a | b |\n|---|---|\n" + "".join(f"| {i} | x{i} |\n" for i in range(300))
    many = "\n\n".join(f"## Part {k}\n\n{table}" for k in range(20))
    assert len(many) > LIVE_BLOCK_CHARS
    out = markdown_html(many)
    assert out.count("<table>") == 20 and out.count("<h2>") == 20 and "dd-plain" not in out
    giant = "| a | b |\n|---|---|\n" + "".join(f"| {i} | {'y' * 40} |\n" for i in range(2000))
    assert len(giant) > LIVE_BLOCK_CHARS
    assert markdown_html(giant).startswith('<pre class="dd-plain">')
