"""A Markdown pipe table whose cells are plain text, straight to the HTML Markdown makes of it.

An offloaded result's preview (offload/preview.py `table_rows`) is such a table: 20 rows of data
values. markdown-it spends about 6 ms on one (100 cells through its inline parser, in Python,
holding the interpreter), once per tool call, and every turn with a query has one. A cell of
plain text (letters, digits, spaces and punctuation that carries no Markdown meaning) renders as
itself, escaped, so `plain_table_html` builds the same HTML directly: the same tags and line
breaks as markdown-it, the same right alignment of a column of numbers (`_NUMBER_CELL`), and the
same sanitizer after. Anything else (an escape, emphasis or code characters, HTML, an entity,
alignment colons, rows of other widths) returns None and the caller renders it with markdown-it.
tests/unit/test_table_html.py checks that both give the same HTML.
"""

from __future__ import annotations

import html
import re

# a cell made only of these renders as its own text (no `\`, `*`, `` ` ``, `~`, `<`, `>`, `&`, `[`,
# `]`, `!`: escapes, emphasis, code, strike, HTML, entities, links, images). An `_` between two
# ASCII letters or digits (`building_id`) is plain too: CommonMark's `_` neither opens nor closes
# emphasis inside a word.
_PLAIN_CELL = re.compile(r"(?:[A-Za-z0-9 .,:;+\-/%#@?=()'\"$€£¥−^{}\u00c0-\u00ff\u0100-\u024f]"
                         r"|(?<=[A-Za-z0-9])_(?=[A-Za-z0-9]))*")
_RULE_CELL = re.compile(r"\s*-+\s*")


def _cells(line: str) -> list[str] | None:
    s = line.strip()
    if len(s) < 2 or s[0] != "|" or s[-1] != "|":
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def plain_table_html(lines: list[str], number_cell: re.Pattern[str]) -> str | None:
    """The unsanitized HTML markdown-it gives for the table `lines` (header, rule, body rows), or
    None when a cell or the rule is not plain (see the module doc)."""
    if len(lines) < 2:
        return None
    header, rule = _cells(lines[0]), _cells(lines[1])
    if header is None or rule is None or len(rule) != len(header):
        return None
    if not all(_RULE_CELL.fullmatch(c) for c in rule):
        return None  # alignment colons: markdown-it's style attributes
    body: list[list[str]] = []
    for line in lines[2:]:
        row = _cells(line)
        if row is None or len(row) != len(header):
            return None
        body.append(row)
    for row in (header, *body):
        for c in row:
            if not _PLAIN_CELL.fullmatch(c):
                return None
    width = len(header)
    numeric = [bool(body) and all(not r[c] or number_cell.fullmatch(r[c]) for r in body)
               and any(r[c] for r in body) for c in range(width)]
    attrs = [' class="dd-al-right"' if n else "" for n in numeric]

    def esc(text: str) -> str:
        return html.escape(text, quote=False).replace('"', "&quot;")

    out = ["<table>\n<thead>\n<tr>\n"]
    out += [f"<th{attrs[c]}>{esc(h)}</th>\n" for c, h in enumerate(header)]
    out.append("</tr>\n</thead>\n")
    if body:
        out.append("<tbody>\n")
        for row in body:
            out.append("<tr>\n")
            out += [f"<td{attrs[c]}>{esc(v)}</td>\n" for c, v in enumerate(row)]
            out.append("</tr>\n")
        out.append("</tbody>\n")
    out.append("</table>\n")
    return "".join(out)
