"""A pinned paragraph is named by its index among the answer's top-level blocks
(threads/report/pins.py `answer_blocks`); the chat counts the top-level elements of the
answer as api/render.py renders it. The two must agree, or a pin takes the wrong paragraph."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from datadesk.api.render import markdown_html
from datadesk.threads.report.pins import answer_blocks

VOID = {"hr", "br", "img"}


class TopLevel(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if self.depth == 0:
            self.tags.append(tag)
        if tag not in VOID:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag not in VOID:
            self.depth -= 1


ANSWERS = [
    "One paragraph.",
    "First.\n\nSecond with **bold** and `code`.",
    "## Heading\nText right under it.\n\n- a\n- b\n\n| x | y |\n|---|--:|\n| 1 | 2 |\n\n"
    "```python\nprint(1)\n```\n\n---\n\n> quoted",
    "Line one\nline two of the same paragraph.\n\n1. first\n2. second\n\nEnd.",
]


@pytest.mark.parametrize("text", ANSWERS)
def test_blocks_match_the_rendered_top_level_elements(text: str) -> None:
    parser = TopLevel()
    parser.feed(markdown_html(text))
    blocks = answer_blocks(text)
    assert len(blocks) == len(parser.tags), (blocks, parser.tags)
    assert all(b.strip() for b in blocks)


def test_blocks_keep_their_markdown() -> None:
    blocks = answer_blocks("Intro **bold**.\n\n| a | b |\n|---|---:|\n| 1 | 2 |\n\nOutro.")
    assert blocks == ["Intro **bold**.", "| a | b |\n|---|---:|\n| 1 | 2 |", "Outro."]
