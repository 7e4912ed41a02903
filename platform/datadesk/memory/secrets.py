"""Deterministic secret detection: memory never keeps a credential.

Memory reads what a person wrote, so it uses `datadesk.domain.redaction` in its
prose mode: the credential shapes always count, a value after a secret-naming
word only when it looks like a credential (Luhn for card numbers), so ordinary
analysis talk ("use the kwh column", dates, building ids like B07, "the token
budget is 32000") passes. `find_secrets(text)` returns the *kinds* found (e.g.
`["aws access key"]`), never the values, so the result is safe to log.
"""

from __future__ import annotations

from datadesk.domain.redaction import find_secrets, redact

PLACEHOLDER = "[secret]"  # what a redacted value reads as in the text the extractor sees

__all__ = ["PLACEHOLDER", "contains_secret", "find_secrets", "redact_secrets"]


def contains_secret(text: str) -> bool:
    """Whether `text` holds any secret `find_secrets` knows."""
    return bool(find_secrets(text))


def redact_secrets(text: str, placeholder: str = PLACEHOLDER) -> str:
    """`text` with every detected secret value replaced (used before text reaches the extractor)."""
    return redact(text, placeholder=placeholder, prose=True)
