"""The process's own credentials, kept out of what it writes (issue 28, the cluster set).

Values with no shape of their own for `domain/redaction.py` to recognise them by: the cluster
database's password, the object store's secret key and session token, the shared CSRF/session
secret. Read from the environment each time, plus those the cluster set was configured with
(`add_known_secrets`: a settings file's database URL). The log filter (`api.guards.auth.
RedactSecrets`) and every API error answer (`api/errors.py`) replace them.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

from datadesk.domain.redaction import REDACTED

_KNOWN: set[str] = set()
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "DATADESK_SECRET_KEY")
_URL_ENV = ("DATADESK_CLUSTER_DATABASE_URL",)
_URL_PASSWORD = re.compile(r"://[^:/@\s]+:([^@\s]+)@")


def url_password(url: str | None) -> str | None:
    """The password of `scheme://user:password@host/...`, else None."""
    m = _URL_PASSWORD.search(url or "")
    return m.group(1) if m else None


def add_known_secrets(*values: str | None) -> None:
    """Remember credential values of this process (4+ characters) for `known_secrets`."""
    _KNOWN.update(v for v in values if v and len(v) >= 4)


def known_secrets() -> list[str]:
    """The process's credentials now, longest first (a value inside another goes with it)."""
    found = set(_KNOWN)
    found.update(os.environ.get(name, "") for name in _SECRET_ENV)
    for name in _URL_ENV:
        password = url_password(os.environ.get(name))
        if password:
            found.update({password, unquote(password)})
    return sorted((v for v in found if v and len(v) >= 4), key=len, reverse=True)


def without_known_secrets(text: str, placeholder: str = REDACTED) -> str:
    """`text` with the process's credentials (`known_secrets`) replaced, nothing else changed."""
    for value in known_secrets():
        text = text.replace(value, placeholder)
    return text
