"""One sign-in attempt, from `GET /auth/oidc/login` to the provider's return.

Its `state` (binds the return to this browser: no login CSRF), `nonce` (binds the ID token to
this attempt) and PKCE verifier (binds the code to this client) are kept in a cookie of the
browser that started it, sealed with AES-GCM under a key derived from the app's secret
(`api/guards/security.py` load_key): http-only, `SameSite=Lax` (it must come back on the
provider's top-level redirect, which `Strict` would drop), scoped to `/auth/oidc/`, and dead
after `FLOW_TTL_S` (the expiry is inside the sealed value too, so a kept cookie is no good).

Why a cookie, not a server-side table: the login route is unauthenticated, and a table would
let anyone fill it; the cookie costs the server nothing, works on every host of a cluster
without a shared write, and can only be used by the browser holding it. Its one weakness, a
cookie copied and played back, is closed by the ID token's nonce being spent once
(`oidc.py` NonceLedger) and by the provider's authorization code being single-use.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from datadesk.api.sso.errors import FlowRejected

FLOW_COOKIE = "datadesk_oidc_flow"
FLOW_PATH = "/auth/oidc/"
FLOW_TTL_S = 600  # the person has ten minutes at the provider's login page
MAX_NEXT_CHARS = 2000


class Flow(msgspec.Struct, frozen=True):
    """One attempt's secrets and where the browser goes when it succeeds."""

    state: str
    nonce: str
    verifier: str  # PKCE (RFC 7636): the challenge sent is its S256 hash
    next: str = "/"
    expires: float = 0.0

    @classmethod
    def new(cls, next_path: str = "/", now: float | None = None) -> "Flow":
        return cls(state=secrets.token_urlsafe(32), nonce=secrets.token_urlsafe(32),
                   verifier=secrets.token_urlsafe(64), next=next_path,
                   expires=(time.time() if now is None else now) + FLOW_TTL_S)


def flow_key(app_key: bytes) -> bytes:
    """The sealing key: derived from the app's key, so it differs from the CSRF key's use."""
    return hmac.new(app_key, b"datadesk/oidc-flow/v1", hashlib.sha256).digest()


def seal(flow: Flow, app_key: bytes) -> str:
    """The cookie value: a random 96-bit IV, then the AES-GCM box of the flow; base64url."""
    iv = secrets.token_bytes(12)
    box = AESGCM(flow_key(app_key)).encrypt(iv, msgspec.json.encode(flow), FLOW_COOKIE.encode())
    return base64.urlsafe_b64encode(iv + box).decode().rstrip("=")


def open_flow(value: str | None, app_key: bytes, now: float | None = None) -> Flow:
    """The flow a cookie holds; `FlowRejected` when there is none, it was altered or it expired."""
    if not value:
        raise FlowRejected("This browser has no sign-in in progress: it was not started here, it was "
                           "already completed, or cookies are blocked. Start again from the login page.",
                           "sso: no sign-in in progress in this browser")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        plain = AESGCM(flow_key(app_key)).decrypt(raw[:12], raw[12:], FLOW_COOKIE.encode())
        flow = msgspec.json.decode(plain, type=Flow)
    except (InvalidTag, ValueError, msgspec.DecodeError):
        raise FlowRejected("The sign-in cookie of this browser is not one this server made. "
                           "Start again from the login page.", "sso: altered sign-in cookie") from None
    if flow.expires < (time.time() if now is None else now):
        raise FlowRejected(f"This sign-in took longer than {FLOW_TTL_S // 60} minutes. Start again "
                           "from the login page.", "sso: sign-in expired")
    return flow


def check_state(flow: Flow, state: str | None) -> None:
    """The provider's `state` must be the one this browser's flow sent (RFC 6749 10.12)."""
    if not state or not hmac.compare_digest(state.encode(), flow.state.encode()):
        raise FlowRejected("The sign-in response does not match the sign-in this browser started "
                           "(wrong state). It may come from another browser or an old tab: start again "
                           "from the login page.", "sso: wrong state")


def safe_next(value: str | None) -> str:
    """`value` if it is a path of this app ("/..."), "/" when absent; `FlowRejected` for anything
    that could leave it: a scheme, `//host`, a backslash (browsers read it as a slash), or any
    whitespace or control character (browsers drop tabs and newlines, so `/\\t/host` is `//host`)."""
    if value is None or value == "":
        return "/"
    bad = (not value.startswith("/") or value.startswith("//") or "\\" in value
           or len(value) > MAX_NEXT_CHARS or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value))
    if bad or value.startswith(FLOW_PATH):
        raise FlowRejected(f"The return address {value[:80]!r} is not a page of this app: only a path "
                           "such as /?t=... is accepted after signing in (no other site).",
                           "sso: external return address")
    return value
