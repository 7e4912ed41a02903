"""Lines a source writes beside its rows: the row count it states and its own words that it cut
the result. Read by the locates (where a table ends) and judged by `offload.source_cut`.

    stated_rows(lines)  -> the rows a count line says there are, or None
        (32 rows)   32 rows in set (0.01 sec)   Result: 32 rows   Total: 1,000 rows
        1 row returned   showing 32 of 1,000 rows   ... 968 more rows (shown + more)
    is_note(line)       -> a count or a cut line ("... 968 more rows", "(truncated)"), never a row
    CUT_WORDS           -> the words of a cut, anywhere in a line ("truncated", "has_more", ...)

A count is a whole line (a sentence that happens to hold "32 rows" is prose, not a count), so
"the source says N rows" is only said where it said exactly that.
"""

from __future__ import annotations

import re

_COUNT = re.compile(
    r"\(?\s*(?:(?:result|results|total|rows|returned|count|fetched)\s*:?\s*)?([\d][\d,_ ]*)\s+rows?"
    r"(?:\s+(?:in set|returned|selected|fetched|affected|total|in total|in result))?"
    r"(?:\s*\([^)]*\))?\s*\)?\s*[.;]?", re.I)
_SHOWN_OF = re.compile(r"\(?\s*(?:showing|shown|displaying|returned|returning)\s+(?:the\s+)?(?:first\s+)?"
                       r"([\d][\d,]*)\s+(?:of|out of)\s+([\d][\d,]*)\s+(?:rows|records|results)\b.*", re.I)
_MORE = re.compile(r"\s*[.…]*\s*(?:and\s+)?\(?\+?\s*([\d][\d,]*)\s+more\s+(?:rows|records|results)\b.*", re.I)
_CUT = re.compile(r"\s*[(\[]?\s*(?:output\s+|results?\s+)?truncated\b.*|\s*(?:\.{3,}|…+)\s*\Z|.*\blimit reached\b.*"
                  r"|\s*\(?\s*(?:results?|rows|output)\s+(?:limited|truncated|capped|cut)\s+(?:to|at)\s+[\d,]+\b.*"
                  r"|\s*\(?\s*show(?:ing|ed|n)\s+(?:only\s+)?(?:the\s+)?first\s+[\d,]+\b.*", re.I)
# A source's own words that it cut the result (judged by `offload.source_cut` in its prose and
# metadata): "showing first 32 rows (output truncated)", "... 968 more rows", "has_more: true".
CUT_WORDS = re.compile(r"truncat|limited to|limit(ed)? of|limit reached|only (the )?first"
                       r"|show(ing|ed|n)? (only )?(the )?first"
                       r"|first \d[\d,]* (rows|results)|more (rows|results|data|available)|has[ _]?more|next page"
                       r"|were omitted|omitted|capped|cut off|partial", re.I)


def _int(text: str) -> int:
    return int(re.sub(r"[,_ ]", "", text))


def stated_rows(lines: list[str], shown: int | None = None) -> int | None:
    """The row count a line of `lines` states (the first one found), or None.

    "... 968 more rows" states the rows shown plus those: `shown` (the rows read) is added when
    known, else the line is only a cut (None)."""
    for line in lines:
        s = line.strip()
        if not s or len(s) > 120:
            continue
        m = _SHOWN_OF.fullmatch(s)
        if m:
            return _int(m.group(2))
        m = _COUNT.fullmatch(s)
        if m:
            return _int(m.group(1))
    return None


_HINT = re.compile(r"row|record|result|output|trunc|limit|cut|capped|more|show|\.\.\.|…", re.I)  # in every note


def is_note(line: str, loose: bool = False) -> bool:
    """A line that states a count or a cut: it ends a table, it is never one of its rows.
    `loose`: any short line with the words of a cut (where no row could be that line)."""
    s = line.strip()
    if not s or len(s) > 120 or not (loose or _HINT.search(s)):  # one search for a row, not five
        return False
    return bool(_COUNT.fullmatch(s) or _SHOWN_OF.fullmatch(s) or _MORE.fullmatch(s) or _CUT.fullmatch(s)
                or (loose and CUT_WORDS.search(s)))
