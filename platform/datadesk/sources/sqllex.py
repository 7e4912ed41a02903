"""Read a statement the way its server splits it into code, strings and comments, before sqlglot does.

The statement check parses with sqlglot, but the server runs the text as *it* reads it, and
the two differ in places an attacker can use: MySQL/MariaDB run what is inside `/*! ... */`
and `/*M! ... */` (sqlglot keeps a comment), PostgreSQL nests block comments (MySQL does
not), a backslash before a quote ends a string or not depending on the server's settings
(`NO_BACKSLASH_ESCAPES`, `standard_conforming_strings`), and PostgreSQL's `U&"\\0070g_sleep"`
names a function sqlglot cannot read. So, for PostgreSQL, MySQL/MariaDB, SQLite and DuckDB:

1. `scan` splits the text with the server's own rules (quotes '...', "...", `...`, [...],
   E'...', $tag$...$tag$; comments --, #, /* */) and refuses what it cannot read the same
   way everywhere: executable comments, optimizer hints, a /* inside a comment, a backslash
   that moves a string's end, unterminated strings and comments, NUL characters.
2. `U&'...'` strings and `U&"..."` names (with `UESCAPE`) are decoded into plain ones.
3. `tokenize` has sqlglot tokenize the result and compares: every piece of code the server
   sees must be inside a sqlglot token, no token may lie in a comment, and every string the
   server sees must be one sqlglot string. Any difference is refused; it is exactly the gap a
   comment or quoting trick would need.

Other sqlglot dialects have no model of their server here; their comments (the gaps between
sqlglot's tokens) get the same comment refusals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from datadesk.sources.errors import SQLError, SQLRefused

_SPACE = " \t\n\r\f\v"  # ASCII only: no server reads U+00A0 and friends as a space
_WORD = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]+")
_DOLLAR = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_UESCAPE = re.compile(r"[ \t\n\r\f\v]*uescape[ \t\n\r\f\v]*'([^'])'", re.I)
_QUOTED_TOKENS = {TokenType.STRING, TokenType.NATIONAL_STRING, TokenType.BYTE_STRING, TokenType.BIT_STRING,
                  TokenType.HEX_STRING, TokenType.UNICODE_STRING, TokenType.HEREDOC_STRING,
                  TokenType.RAW_STRING, TokenType.IDENTIFIER}


@dataclass(frozen=True)
class LexModel:
    """How one server splits text: which quotes, escapes and comment forms it has."""

    server: str
    identifiers: dict[str, str]  # opening quote -> closing quote of a quoted name
    strings: str  # quote characters of strings
    backslash_setting: str = ""  # server setting under which '\' escapes a quote in a plain string
    e_strings: bool = False  # E'...' reads backslash escapes
    u_strings: bool = False  # U&'...' and U&"..." with UESCAPE
    dollar: bool = False  # $tag$ ... $tag$
    hash_comments: bool = False  # '#' starts a comment
    dash_needs_space: bool = False  # '--' starts a comment only before a space or control character
    cr_ends_comment: bool = True  # a line comment also ends at a lone '\r'


MODELS = {
    "postgres": LexModel("PostgreSQL", {'"': '"'}, "'", "standard_conforming_strings = off", True, True, True),
    "duckdb": LexModel("DuckDB", {'"': '"'}, "'", "", True, True, True),
    "mysql": LexModel("MySQL/MariaDB", {"`": "`"}, "'\"", "the sql_mode NO_BACKSLASH_ESCAPES or ANSI_QUOTES",
                      hash_comments=True, dash_needs_space=True, cr_ends_comment=False),
    "sqlite": LexModel("SQLite", {'"': '"', "`": "`", "[": "]"}, "'", cr_ends_comment=False),
}


@dataclass
class Lexed:
    """Where the server sees quoted text and comments (inclusive index ranges)."""

    quoted: list[tuple[int, int]] = field(default_factory=list)  # opening quote .. closing quote
    comments: list[tuple[int, int]] = field(default_factory=list)
    unicode: list[tuple[int, int, int]] = field(default_factory=list)  # U& literal: U, opening, closing


def where(text: str, pos: int) -> str:
    """'line L, column C' of index `pos` (both from 1), for messages."""
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _string_end(text: str, start: int, close: str, backslash: bool) -> int:
    """Index of the quote closing the literal opened at `start`, or -1 when none does."""
    i = start + 1
    while True:
        j = text.find(close, i)
        k = text.find("\\", i, j if j >= 0 else len(text)) if backslash else -1
        if k >= 0:
            i = k + 2
            continue
        if j < 0 or close == "]" or not text.startswith(close, j + 1):
            return j
        i = j + 2  # a doubled quote stands for itself


def _quoted(text: str, i: int, model: LexModel, backslash: bool) -> int:
    close = model.identifiers.get(text[i], text[i])
    end = _string_end(text, i, close, backslash)
    if text[i] in model.strings and model.backslash_setting and not backslash:
        if _string_end(text, i, close, True) != end:
            raise SQLRefused(
                f"the string at {where(text, i)} has a backslash before a quote: whether that quote ends the string "
                f"depends on {model.backslash_setting} on the {model.server} server, so the check cannot tell "
                "where the string ends. Write a quote inside a string as two quotes ('')"
                + (", or use E'...' for backslash escapes" if model.e_strings else ""))
    if end < 0:
        raise SQLError(f"syntax error: the {'string' if text[i] in model.strings else 'quoted name'} opened at "
                       f"{where(text, i)} is never closed")
    return end


def _block_comment(text: str, i: int) -> int:
    head = text[i + 2:i + 4].upper()
    if head.startswith("!") or head == "M!":
        raise SQLRefused(f"an executable comment (/*! ... */ or /*M! ... */) at {where(text, i)} is not allowed: "
                         "MySQL and MariaDB run what is inside it, while the check would read a comment. Write the "
                         "SQL plainly, outside a comment")
    if head.startswith("+"):
        raise SQLRefused(f"an optimizer hint (/*+ ... */) at {where(text, i)} is not allowed: hints can change "
                         "settings for the statement (SET_VAR, MAX_EXECUTION_TIME, pg_hint_plan's Set)")
    end = text.find("*/", i + 2)
    inner = text.find("/*", i + 2, end if end >= 0 else len(text))
    if inner >= 0:
        raise SQLRefused(f"a '/*' inside the comment opened at {where(text, i)} is not allowed: PostgreSQL nests "
                         "comments and MySQL does not, so servers disagree where the comment ends. Remove the "
                         "inner '/*'")
    if end < 0:
        raise SQLError(f"syntax error: the comment opened at {where(text, i)} is never closed")
    return end + 1


def _line_end(text: str, i: int, model: LexModel) -> int:
    end = text.find("\n", i)
    if model.cr_ends_comment:
        cr = text.find("\r", i, end if end >= 0 else len(text))
        end = cr if cr >= 0 else end
    return (end if end >= 0 else len(text)) - 1


def _dash_comment(text: str, i: int, model: LexModel) -> bool:
    if not text.startswith("--", i):
        return False
    if not model.dash_needs_space or i + 2 >= len(text):
        return True
    after = text[i + 2]
    return after in _SPACE or ord(after) < 32 or ord(after) == 127


def scan(text: str, model: LexModel) -> Lexed:
    """Split `text` as the server does; raise SQLRefused/SQLError on a form that reads differently."""
    out, i, n = Lexed(), 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
        elif _dash_comment(text, i, model) or (c == "#" and model.hash_comments):
            end = _line_end(text, i, model)
            out.comments.append((i, end))
            i = end + 1
        elif text.startswith("/*", i):
            end = _block_comment(text, i)
            out.comments.append((i, end))
            i = end + 1
        elif c in model.strings or c in model.identifiers:
            end = _quoted(text, i, model, backslash=False)
            out.quoted.append((i, end))
            i = end + 1
        elif c == "$" and model.dollar and (m := _DOLLAR.match(text, i)):
            end = text.find(m.group(0), m.end())
            if end < 0:
                raise SQLError(f"syntax error: the dollar-quoted string opened at {where(text, i)} is never closed")
            end += len(m.group(0)) - 1
            out.quoted.append((i, end))
            i = end + 1
        elif m := _WORD.match(text, i):
            i = m.end()
            word = m.group(0).upper()
            if word == "E" and model.e_strings and text.startswith("'", i):
                end = _quoted(text, i, model, backslash=True)
                out.quoted.append((i, end))
                i = end + 1
            elif word == "U" and model.u_strings and text[i:i + 1] == "&" and text[i + 1:i + 2] in ("'", '"'):
                end = _quoted(text, i + 1, model, backslash=False)
                out.quoted.append((i + 1, end))
                out.unicode.append((i - 1, i + 1, end))
                i = end + 1
        else:
            i += 1
    return out


def _unicode_text(body: str, esc: str, text: str, at: int) -> str:
    """Decode the escapes of a U& literal's body (doubled quotes already undone)."""
    out, i = [], 0
    while i < len(body):
        if body[i] != esc:
            out.append(body[i])
            i += 1
            continue
        if body.startswith(esc, i + 1):
            out.append(esc)
            i += 2
            continue
        width = 6 if body.startswith("+", i + 1) else 4
        digits = body[i + 1 + (width == 6):i + 1 + (width == 6) + width]
        i += 1 + (width == 6) + width
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise SQLError(f"syntax error: invalid Unicode escape in the U& literal at {where(text, at)}")
        code = int(digits, 16)
        if out and 0xDC00 <= code <= 0xDFFF and "\ud800" <= out[-1] <= "\udbff":
            code = 0x10000 + ((ord(out.pop()) - 0xD800) << 10) + (code - 0xDC00)
        elif code == 0 or code > 0x10FFFF or 0xDC00 <= code <= 0xDFFF:
            raise SQLError(f"syntax error: invalid Unicode escape value in the U& literal at {where(text, at)}")
        out.append(chr(code))
    if any("\ud800" <= ch <= "\udfff" for ch in out):
        raise SQLError(f"syntax error: an unpaired surrogate in the U& literal at {where(text, at)}")
    return "".join(out)


def decode_unicode(text: str, lexed: Lexed) -> str:
    """`text` with each U&'...' / U&"..." (and its UESCAPE) rewritten as the plain literal it stands for."""
    for u_at, open_at, close_at in reversed(lexed.unicode):
        quote, esc, stop = text[open_at], "\\", close_at + 1
        if m := _UESCAPE.match(text, stop):
            esc, stop = m.group(1), m.end()
            if esc in "0123456789abcdefABCDEF+'\"" or esc in _SPACE:
                raise SQLError(f"syntax error: invalid UESCAPE character {esc!r} at {where(text, u_at)}")
        value = _unicode_text(text[open_at + 1:close_at].replace(quote * 2, quote), esc, text, u_at)
        if quote == '"':
            plain = '"' + value.replace('"', '""') + '"'
        else:  # an E-string, so a backslash in the value cannot move the string's end
            plain = "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
        text = text[:u_at] + plain + text[stop:]
    return text


def _mismatch(text: str, pos: int, model: LexModel) -> SQLRefused:
    odd = [c for c in text[max(0, pos - 1):pos + 4] if c.isspace() and c not in _SPACE]
    if odd:
        char = odd[0]
        return SQLRefused(f"an unusual space character (U+{ord(char):04X}) at {where(text, pos)}: the {model.server} "
                          "server does not read it as a space, the check would. Use a plain space")
    return SQLRefused(f"the check and the {model.server} server would read this SQL differently at "
                      f"{where(text, pos)} (near {text[max(0, pos - 10):pos + 10]!r}): a string, quoted name or "
                      "comment they split differently. Rewrite that part plainly")


def compare(text: str, lexed: Lexed, tokens: list[Token], model: LexModel) -> None:
    """Refuse when sqlglot's tokens and the server's split of `text` disagree anywhere."""
    covered = bytearray(len(text))
    for t in tokens:
        covered[t.start:t.end + 1] = b"\x01" * (t.end + 1 - t.start)
    pos = 0
    for start, end in [*lexed.comments, (len(text), len(text))]:
        for m in re.finditer(r"[^ \t\n\r\f\v]+", text[pos:start]):  # code the server runs
            gap = covered.find(0, pos + m.start(), pos + m.end())
            if gap >= 0:
                raise _mismatch(text, gap, model)
        inside = covered.find(1, start, end + 1)
        if inside >= 0:
            raise _mismatch(text, inside, model)
        pos = end + 1
    by_end = {end: start for start, end in lexed.quoted}
    token_at = {t.end: t for t in tokens}
    for start, end in lexed.quoted:
        t = token_at.get(end)
        if t is None or t.start > start or t.token_type not in _QUOTED_TOKENS:
            raise _mismatch(text, start, model)
    for t in tokens:
        if t.token_type in _QUOTED_TOKENS and text[t.end] in "'\"`]$" and by_end.get(t.end, -1) < t.start:
            raise _mismatch(text, t.start, model)


def _check_gaps(text: str, tokens: list[Token]) -> None:
    """For dialects without a model: the comment refusals, applied to what sqlglot skipped."""
    pos = 0
    for t in [*tokens, None]:
        gap_end = t.start if t is not None else len(text)
        at = text.find("/*", pos, gap_end)
        while at >= 0 and text.find("*/", at + 2, gap_end) >= 0:
            at = text.find("/*", _block_comment(text, at), gap_end)
        if t is not None:
            pos = t.end + 1


def tokenize(sql: str, dialect: str, shown: str) -> tuple[str, list[Token]]:
    """Check the lexical layer of `sql`; return the text to parse (U& literals decoded) and its tokens."""
    if "\x00" in sql:
        raise SQLRefused(f"a NUL character at {where(sql, sql.index(chr(0)))} is not allowed in SQL")
    model = MODELS.get(dialect)
    text = sql
    if model is not None:
        lexed = scan(text, model)
        if lexed.unicode:
            text = decode_unicode(text, lexed)
            lexed = scan(text, model)
    try:
        tokens = Dialect.get_or_raise(dialect or None).tokenize(text)
    except TokenError as exc:
        raise SQLError(f"syntax error ({shown}): {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # the tokenizer failing otherwise: the text is still unreadable to the check
        raise SQLError(f"syntax error ({shown}): the statement could not be read ({type(exc).__name__})") from None
    tokenizer = Dialect.get_or_raise(dialect or None).tokenizer_class
    if tokens and tokens[0].token_type in tokenizer.COMMANDS:
        pass  # CALL, VACUUM, SHOW...: sqlglot keeps the rest as one raw token, and the statement is refused
    elif model is not None:
        compare(text, lexed, tokens, model)
    else:
        _check_gaps(text, tokens)
    return text, tokens
