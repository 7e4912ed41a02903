"""Deterministic secret detection: memory never keeps a credential.

`find_secrets(text)` returns the *kinds* found (e.g. `["aws access key"]`),
never the values, so the result is safe to log. Patterns are specific
(known key prefixes, key/value assignments with a secret-looking value, Luhn
for card numbers) so ordinary analysis talk ("use the kwh column", dates,
building ids like B07, "the token budget is 32000") passes.
"""

from __future__ import annotations

import re

_SECRET_WORDS = (
    r"password|passwd|passphrase|pwd|pass ?code|pin ?code|secret|secret[_ -]?key|client[_ -]?secret|"
    r"api[_ -]?key|apikey|access[_ -]?key|access[_ -]?token|auth[_ -]?token|refresh[_ -]?token|"
    r"bearer[_ -]?token|token|private[_ -]?key|credentials?"
)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    ("aws secret key", re.compile(
        r"(?i)aws[_ -]?secret[_ -]?(?:access[_ -]?)?key\W{0,5}(?:is\s+)?[A-Za-z0-9/+=]{40}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}")),
    ("api key", re.compile(
        r"\b(?:sk-(?:proj-|ant-|live-)?[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
        r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}"  # GitHub
        r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
        r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
        r"|[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
        r"|AIza[0-9A-Za-z_-]{35}"  # Google
        r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"  # SendGrid
        r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
        r"|ddt_[A-Za-z0-9_-]{20,})")),  # our own API tokens
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}=*")),
    ("connection string with password", re.compile(
        r"\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/@]+:[^\s@/]+@[^\s/]+")),
    ("connection string with password", re.compile(r"(?i)(?:^|[;\s])(?:password|pwd)=[^;\s]+")),
]

# `password: hunter2`, `api_key = abc123...`, "my password is Summer2024!"
_ASSIGNMENT = re.compile(
    rf"(?i)\b(?P<key>{_SECRET_WORDS})\b\s*(?:(?P<sep>=>|=|:)\s*|(?:is|was)\s+|\s+)"
    rf"[\"'`]?(?P<value>[^\s\"'`,;]+)")
_PASSWORD_KEY = re.compile(r"(?i)pass|pwd")
# plain 13-19 digits, or the printed groupings (4-4-4-1..7, Amex 4-6-5); a date range never fits
_CARD = re.compile(r"(?<![\d-])(?:\d{13,19}|\d{4}(?P<s>[ -])\d{4}(?P=s)\d{4}(?P=s)\d{1,7}"
                   r"|\d{4}(?P<t>[ -])\d{6}(?P=t)\d{4,5})(?![\d-])")


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


def _assigned_secret(m: re.Match[str]) -> bool:
    """`key = value` / `key: value` / "key is value" with a credential-looking value. After an
    explicit `=` or `:` a password of 8+ characters, or any value of 16+, counts even if all letters."""
    value = m.group("value").rstrip(".!?):")
    if m.group("sep"):
        if len(value) >= 16 or (len(value) >= 8 and _PASSWORD_KEY.search(m.group("key"))):
            return True
    return _looks_secret(value)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_numbers(text: str) -> bool:
    for m in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", m.group())
        # card networks start with 2-6; Luhn rules out almost all other long numbers
        if 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits):
            return True
    return False


def find_secrets(text: str) -> list[str]:
    """The kinds of secret in `text` (each once, in a fixed order); [] when there is none."""
    found: list[str] = []
    for kind, pattern in _PATTERNS:
        if kind not in found and pattern.search(text):
            found.append(kind)
    if any(_assigned_secret(m) for m in _ASSIGNMENT.finditer(text)):
        found.append("password or key")
    if _card_numbers(text):
        found.append("credit card number")
    return found


def contains_secret(text: str) -> bool:
    return bool(find_secrets(text))


def redact_secrets(text: str, placeholder: str = "[secret]") -> str:
    """`text` with every detected secret value replaced (used before text reaches the extractor)."""
    for _, pattern in _PATTERNS:
        text = pattern.sub(placeholder, text)

    def assignment(m: re.Match[str]) -> str:
        return m.group()[: m.start("value") - m.start()] + placeholder if _assigned_secret(m) else m.group()

    text = _ASSIGNMENT.sub(assignment, text)

    def card(m: re.Match[str]) -> str:
        digits = re.sub(r"[ -]", "", m.group())
        ok = 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_ok(digits)
        return placeholder if ok else m.group()

    return _CARD.sub(card, text)
