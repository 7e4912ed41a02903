"""Browser security for every response: Content-Security-Policy, CSRF, and friends.

- CSP: scripts, styles, fetches and frames only from the app; images only
  from the app and `data:` (a Markdown image pointing at another host is
  never fetched, so it cannot carry data out); no inline script, no plugins,
  no framing by other sites. Responses that set their own policy (artifact
  downloads and report pages use `sandbox`) keep it.
- CSRF: a state-changing request (POST, PUT, PATCH, DELETE) authenticated by
  the session cookie must carry `X-CSRF-Token`, an HMAC of the session id
  under the installation's key. The UI reads it from `GET /api/me`; another
  site can neither read it nor set the header on a cross-site form. Requests
  with `Authorization: Bearer` (API clients) carry no ambient credentials and
  need no token. The session cookie is also `SameSite=Strict`, a second wall.
  The key is derived from `server.secret_key` when set (one secret for every host), else
  the home's `csrf.key` (`load_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any, Awaitable, Callable

import msgspec

from datadesk.api.guards.auth import SESSION_COOKIE
from datadesk.store.interfaces.counters import MemoryCounter, RateCounter

CSRF_HEADER = b"x-csrf-token"
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
CSRF_EXEMPT = {"/api/login"}  # no session yet: nothing to ride on
APP_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
           "connect-src 'self'; font-src 'self'; frame-src 'self'; object-src 'none'; base-uri 'none'; "
           "form-action 'self'; frame-ancestors 'none'")
SANDBOX_CSP = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'"
EXTRA_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


MIN_SECRET_BYTES = 32


def load_key(home: Path, secret_key: str | None = None) -> bytes:
    """The key for CSRF tokens and everything the app signs.

    With `server.secret_key` set (`secret_key`; required with the cluster set), a key derived
    from it, the same on every host that shares the secret; the home is not touched. Otherwise
    the installation's own `csrf.key` (created once, 0600; shared by every worker of this data
    dir). The secret itself is never logged, stored or returned."""
    if secret_key is not None and secret_key != "":
        return derive_key(secret_key, "csrf")
    path = Path(home) / "csrf.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
        raise RuntimeError(f"{path} is damaged (shorter than 32 bytes): delete it to make a new one")
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def derive_key(secret_key: str, purpose: str) -> bytes:
    """A 32-byte key for `purpose` from the shared secret (HMAC-SHA256), so one secret serves
    several uses without any one key revealing another or the secret."""
    if not isinstance(secret_key, str):
        raise TypeError(f"server.secret_key must be a string, not {type(secret_key).__name__}")
    raw = secret_key.encode("utf-8", "surrogatepass")
    if len(raw) < MIN_SECRET_BYTES:  # the length only: the value never goes into a message
        raise ValueError(f"server.secret_key is too short ({len(raw)} bytes; at least {MIN_SECRET_BYTES}): "
                         "use a random value, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`")
    return hmac.new(raw, f"datadesk/{purpose}/v1".encode(), hashlib.sha256).digest()


def csrf_token(key: bytes, session_id: str) -> str:
    return hmac.new(key, session_id.encode(), hashlib.sha256).hexdigest()[:40]


def _cookie(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    for k, v in headers:
        if k == b"cookie":
            try:
                jar = SimpleCookie(v.decode("latin-1"))
            except CookieError:
                continue
            if name in jar:
                return jar[name].value
    return None


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k == name), None)


class SecurityMiddleware:
    """ASGI middleware: CSRF check on the way in, security headers on the way out."""

    def __init__(self, app: ASGIApp, key: bytes) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._csrf_problem(scope)
        if problem:
            await self._refuse(send, problem)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", APP_CSP.encode()))
                headers += [(k, v) for k, v in EXTRA_HEADERS if k not in names]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _csrf_problem(self, scope: Scope) -> str | None:
        if scope["method"] not in UNSAFE_METHODS or scope["path"] in CSRF_EXEMPT:
            return None
        headers = scope.get("headers", [])
        if _header(headers, b"authorization"):
            return None  # bearer clients: no ambient credential to forge with
        sid = _cookie(headers, SESSION_COOKIE)
        if not sid:
            return None  # unauthenticated: the route answers 401
        sent = _header(headers, CSRF_HEADER) or b""
        if not sent:
            return ("missing CSRF token: state-changing requests from the browser must send the "
                    "X-CSRF-Token header (from GET /api/me)")
        if not hmac.compare_digest(sent, csrf_token(self.key, sid).encode()):  # bytes: any header value
            return "invalid CSRF token: reload the page and try again"
        return None

    @staticmethod
    async def _refuse(send: Any, message: str) -> None:
        await _answer(send, 403, message)


def _networks(trusted: list[str]) -> list[Any]:
    return [ipaddress.ip_network(t, strict=False) for t in trusted]


def client_address(scope: Scope, trusted: list[Any]) -> str:
    """The client's address: the peer, or, when the peer is a trusted proxy, the rightmost
    X-Forwarded-For entry that is not itself a trusted proxy (never a header from anyone else)."""
    peer = (scope.get("client") or ("unknown", 0))[0]

    def is_trusted(addr: str) -> bool:
        try:
            ip = ipaddress.ip_address(addr.strip())
        except ValueError:
            return False
        return any(ip in net for net in trusted)

    if not trusted or not is_trusted(peer):
        return peer
    forwarded = b",".join(v for k, v in scope.get("headers", []) if k == b"x-forwarded-for")
    hops = [h.strip() for h in forwarded.decode("latin-1").split(",") if h.strip()]
    for hop in reversed(hops):
        if not is_trusted(hop):
            return hop
    return peer


class LoginFailures:
    """Failed login attempts in the last minute, per client address and per account.

    - per address (`per_minute`): one client guessing is refused once it failed that often;
      behind `server.trusted_proxies` the forwarded client counts, never a header from anyone else;
    - per account (`per_account`): an account named by the credential (`ddt_<user>.<secret>`,
      login codes `<user>.<secret>`) that failed that often, from any number of addresses, is
      refused to every address that itself failed in the last minute, so a spread-out guesser is
      slowed down while the account's owner, from a clean address, still gets in.

    Only failures count (401/403): a user's own valid logins never lock anyone out. The counts
    live in `counter` (store/interfaces/counters.py): by default this process's memory (bounded: ended
    windows are dropped); with the cluster set, rows every host counts into, so N hosts do not
    allow N times the attempts. A minute opens at an address's (account's) first failure."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int, per_account: int, trusted_proxies: list[str],
                 counter: RateCounter | None = None) -> None:
        self.per_minute = per_minute
        self.per_account = per_account
        self.trusted = _networks(trusted_proxies)
        self.counter: RateCounter = counter if counter is not None else MemoryCounter()

    @staticmethod
    def _address_key(addr: str) -> str:
        return f"login:addr:{addr}"

    @staticmethod
    def _account_key(account: str) -> str:
        return f"login:account:{account}"

    def _wait(self, key: str) -> int:
        return max(1, int(self.counter.resets_in(key, self.WINDOW_S)) + 1)

    def address(self, scope: Scope) -> str:
        return client_address(scope, self.trusted)

    def address_refusal(self, addr: str) -> tuple[str, int] | None:
        key = self._address_key(addr)
        if self.counter.count(key, self.WINDOW_S) >= self.per_minute:
            wait = self._wait(key)
            return f"too many failed login attempts from {addr}: try again in {wait} s", wait
        return None

    def account_refusal(self, account: str | None, addr: str) -> tuple[str, int] | None:
        """Refuse an attempt on a targeted account, unless it comes from a clean address."""
        if account is None:
            return None
        key = self._account_key(account)
        if (self.counter.count(key, self.WINDOW_S) < self.per_account
                or not self.counter.count(self._address_key(addr), self.WINDOW_S)):
            return None
        wait = self._wait(key)
        return (f"too many failed login attempts for this account: try again in {wait} s "
                "(from an address with no failed attempts, a valid login still works)"), wait

    def failed(self, addr: str) -> None:
        """A failed attempt from `addr` (the middleware counts every 401/403 of a login route)."""
        self.counter.hit(self._address_key(addr), self.WINDOW_S)

    def failed_account(self, account: str | None) -> None:
        """A failed attempt on `account` (the route counts it: only it reads the credential)."""
        if account is not None:
            self.counter.hit(self._account_key(account), self.WINDOW_S)


class LoginLimiter:
    """ASGI middleware on the login routes (handler opt `login`): an address past its failed
    attempts gets 429 before the route runs; each 401/403 the route answers counts against the
    address. The route itself checks and counts the account (`LoginFailures.account_refusal`,
    `failed_account`), as only it knows which account a credential names."""

    def __init__(self, app: ASGIApp, failures: LoginFailures) -> None:
        self.app = app
        self.failures = failures

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        handler = scope.get("route_handler")
        if scope["type"] != "http" or not (handler is not None and handler.opt.get("login")):
            await self.app(scope, receive, send)
            return
        addr = self.failures.address(scope)
        refused = self.failures.address_refusal(addr)
        if refused is not None:
            message, wait = refused
            await _answer(send, 429, message, ((b"retry-after", str(wait).encode()),))
            return

        async def watch(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                self.failures.failed(addr)
            await send(message)

        await self.app(scope, receive, watch)


async def _answer(send: Any, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = (),
                  extra: dict[str, Any] | None = None) -> None:
    """An error answer from a middleware, in the API's one error shape (api/errors.py)."""
    doc: dict[str, Any] = {"status_code": status, "error": message, "detail": message}
    if extra:
        doc["extra"] = extra
    body = msgspec.json.encode(doc)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"content-security-policy", APP_CSP.encode()), *EXTRA_HEADERS, *headers]})
    await send({"type": "http.response.body", "body": body})
