"""Secrets in text: one set of credential shapes, and the one rule that removes them.

Every layer that must keep a secret out of what it writes uses this module: access
logs (`api.guards.auth.RedactSecrets`), MCP stderr and status (`tools.mcp.config`), LLM
error messages (`llm.client`) and long-term memory (`memory.secrets`).

Two kinds of pattern:

- shapes: a credential by its form alone (known key prefixes such as `sk-`, `ghp_`,
  `AKIA`, our `ddt_` tokens; JWTs; private key blocks; `user:password@` in a URL;
  an ODBC `Password=`; card numbers that pass Luhn);
- labelled values: a value after a secret-naming word (`token=...`, `password: ...`,
  `Bearer ...`, "my password is ...").

`redact(text, secrets)` is for a line meant for a log, a status page or an error
message: every shape, every labelled value, and `secrets` (known values such as a
resolved MCP header or the LLM API key) wherever they appear. With `prose=True` (what
a user said, for memory) a labelled value counts only when it looks like a credential,
so "Token = per-building", "the token budget is 32000" or "the bearer of the report"
stay as they are; `find_secrets` names the kinds found under that same rule, never the
values, so its result is safe to log.
"""

from __future__ import annotations

import base64
import re
from typing import Callable, Iterable

REDACTED = "[REDACTED]"

# words that name a secret in prose ("my password is ...", "token ghp_...")
_SECRET_WORDS = (
    r"password|passwd|passphrase|pwd|pass ?code|pin ?code|secret|secret[_ -]?key|client[_ -]?secret|"
    r"api[_ -]?key|apikey|access[_ -]?key|access[_ -]?token|auth[_ -]?token|refresh[_ -]?token|"
    r"bearer[_ -]?token|token|private[_ -]?key|credentials?"
)
# an assigned value: stops at whitespace, quotes, `,` `;`, and at an `&` that starts the next
# query parameter (`?code=X&next=/` keeps `&next=/`; `Tr0ub4dor&3` stays one value)
_VALUE = r"[^\s\"'`,;&]+(?:&(?![A-Za-z_][\w.-]*=)[^\s\"'`,;&]*)*"
_Check = Callable[[re.Match[str]], bool]
_PASSWORD_KEY = re.compile(r"(?i)pass|pwd")
_PRIVATE_KEY_LINE = r"-----(?:BEGIN|END) (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _looks_secret(value: str) -> bool:
    """A value that reads like a credential, not a word ("required", "expired", "column")."""
    value = value.rstrip(".!?):")
    if len(value) < 6 or re.fullmatch(r"[A-Za-z]+(?:[-_.'][A-Za-z]+)*", value):  # a word, per-building
        return False
    if len(value) >= 16 and not value.isalpha():
        return True
    classes = sum((any(c.islower() for c in value), any(c.isupper() for c in value),
                   any(c.isdigit() for c in value), any(not c.isalnum() for c in value)))
    return classes >= 2 and not value.isdigit() and not re.fullmatch(r"[A-Z]?[a-z]+", value)


def _assigned(m: re.Match[str]) -> bool:
    """`key = value` / `key: value` / "key is value" with a credential-looking value. After an
    explicit `=` or `:` a password of 8+ characters, or any value of 16+, counts even if all letters."""
    value = m.group("value").rstrip(".!?):")
    if m.groupdict().get("sep"):
        if len(value) >= 16 or (len(value) >= 8 and _PASSWORD_KEY.search(m.group("key"))):
            return True
    return _looks_secret(value)


def _bearer(m: re.Match[str]) -> bool:
    """`Bearer <value>` in prose: 16+ token characters ("the bearer of the report" is no secret)."""
    return len(m.group("value")) >= 16


def _basic(m: re.Match[str]) -> bool:
    """`Basic <value>` in prose: only a value that decodes to `user:password`."""
    try:
        return b":" in base64.b64decode(m.group("value"), validate=True)
    except ValueError:
        return False


def _card(m: re.Match[str]) -> bool:
    digits = re.sub(r"[ -]", "", m.group())
    # card networks start with 2-6; Luhn rules out almost all other long numbers
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits)


def _always(m: re.Match[str]) -> bool:
    return True


def _never(m: re.Match[str]) -> bool:
    return False


def _api_key(prefix: str, value: str) -> tuple[str, re.Pattern[str], _Check, _Check]:
    return "api key", re.compile(rf"\b{prefix}(?P<value>{value})"), _always, _always


# (kind, pattern, is a match a secret in prose, is it one in a log line). The group `value` is
# what is replaced; what the match holds before it (a key prefix, `code=`) is kept, so a log
# line still says what was there.
_PATTERNS: list[tuple[str, re.Pattern[str], _Check, _Check]] = [
    ("private key", re.compile(
        rf"(?P<value>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        rf"(?:[\s\S]*?{_PRIVATE_KEY_LINE}|(?:\s*[A-Za-z0-9+/=]{{16,}})*))"), _always, _always),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)(?P<value>[A-Z0-9]{16})\b"),
     _always, _always),
    ("aws secret key", re.compile(
        r"(?i)aws[_ -]?secret[_ -]?(?:access[_ -]?)?key\W{0,5}(?:is\s+)?(?P<value>[A-Za-z0-9/+=]{40})\b"),
     _always, _always),
    ("jwt", re.compile(r"(?P<value>\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]+)"), _always, _always),
    _api_key("(?:sk|pk|rk)-", r"[A-Za-z0-9_-]{8,}"),  # OpenAI (sk-proj-), Anthropic (sk-ant-), ...
    _api_key("gh[pousr]_", r"[A-Za-z0-9]{16,}"),  # GitHub
    _api_key("github_pat_", r"[A-Za-z0-9_]{22,}"),
    _api_key("glpat-", r"[A-Za-z0-9_-]{20,}"),  # GitLab
    _api_key("xox[abposr]-", r"[A-Za-z0-9-]{8,}"),  # Slack
    _api_key("[rsp]k_(?:live|test)_", r"[A-Za-z0-9]{16,}"),  # Stripe
    _api_key("AIza", r"[0-9A-Za-z_-]{35}"),  # Google
    _api_key(r"SG\.", r"[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),  # SendGrid
    _api_key("hf_", r"[A-Za-z0-9]{30,}"),  # Hugging Face
    ("api key", re.compile(r"ddt_(?P<value>[A-Za-z0-9_.-]+)"), _always, _always),  # our own API tokens
    ("bearer token", re.compile(r"(?i)\bbearer\s+(?P<value>[A-Za-z0-9._~+/=-]+)"), _bearer, _always),
    ("basic auth credentials", re.compile(r"(?i)\bbasic\s+(?P<value>[A-Za-z0-9+/=]{8,})"), _basic, _always),
    ("connection string with password", re.compile(r"://[^\s:/@]+:(?P<value>[^\s@/]+)(?=@)"), _always, _always),
    ("connection string with password", re.compile(r"(?i)(?:^|[;\s])(?:password|pwd)=(?P<value>[^;\s]+)"),
     _always, _always),
    # `password: hunter2`, `api_key = abc123...`, "my password is Summer2024!"
    ("password or key", re.compile(
        rf"(?i)\b(?P<key>{_SECRET_WORDS})\b\s*(?:(?P<sep>=>|=|:)\s*|(?:is|was)\s+|\s+)[\"'`]?(?P<value>{_VALUE})"),
     _assigned, _assigned),
    # in a log line, a config or a URL, any value assigned to such a key goes: `?code=...`, `"key": "..."`
    ("password or key", re.compile(
        rf"(?i)(?P<key>{_SECRET_WORDS}|code|key)[\"']?\s*(?P<sep>=>|=|:)\s*[\"']?(?P<value>{_VALUE})"),
     _never, _always),
    # plain 13-19 digits, or the printed groupings (4-4-4-1..7, Amex 4-6-5); a date range never fits
    ("credit card number", re.compile(r"(?<![\d-])(?P<value>\d{13,19}|\d{4}(?P<s>[ -])\d{4}(?P=s)\d{4}(?P=s)\d{1,7}"
                                      r"|\d{4}(?P<t>[ -])\d{6}(?P=t)\d{4,5})(?![\d-])"), _card, _card),
]


def _replace(m: re.Match[str], placeholder: str) -> str:
    """The match with its `value` replaced, what leads up to it kept."""
    start, end = m.start("value") - m.start(), m.end("value") - m.start()
    return m.group()[:start] + placeholder + m.group()[end:]


def redact(text: str, secrets: Iterable[str] = (), placeholder: str = REDACTED, *, prose: bool = False) -> str:
    """`text` with every secret replaced by `placeholder` (see the module docstring).

    `secrets`: known secret values (4+ characters) removed wherever they appear; `prose`:
    what a person wrote, where a labelled value must look like a credential to go."""
    for value in secrets:
        if value and len(value) >= 4:
            text = text.replace(value, placeholder)
    for _, pattern, in_prose, in_log in _PATTERNS:
        check = in_prose if prose else in_log
        text = pattern.sub(lambda m: _replace(m, placeholder) if check(m) else m.group(), text)
    return text


def find_secrets(text: str) -> list[str]:
    """The kinds of secret in what a person wrote (each once, in a fixed order); [] when none."""
    found: list[str] = []
    for kind, pattern, in_prose, _ in _PATTERNS:
        if kind not in found and any(in_prose(m) for m in pattern.finditer(text)):
            found.append(kind)
    return found
