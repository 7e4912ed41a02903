"""Every user's share of the server is bounded (issue 24): a request budget and in-flight caps.

`RateLimiter` is an ASGI middleware in front of every route (api/app.py wires it outermost, so a
refused request costs the least). Per principal (a signed-in user by id; anyone else by client
address, behind `server.trusted_proxies` the forwarded one, as for the login limit):

- a token bucket: `server.request_burst_per_user` requests at once, refilled at
  `server.requests_per_minute_per_user`; an empty bucket gets 429 with `Retry-After` (seconds until
  a token is back);
- `server.requests_in_flight_per_user` requests being answered at once (429, `Retry-After: 1`);
- event streams (the `stream` handler opt: a turn's POST stream, `GET .../events`) live as long as
  a turn, so they do not count in flight: they spend a token when they start and have their own
  cap, `server.streams_per_user`;
- all users together: `server.requests_in_flight` per worker (503, `Retry-After: 1`).

`/api/health` is never limited. Every refusal names the setting that refused it (in the message
and in `extra.setting`). Each worker of `serve --workers N` keeps its own tables, but for the
request budget given a shared `RateCounter` (store/interfaces/counters.py; the cluster set's rows): then
every host counts a user's requests into one window (`SharedBudget`), so N hosts allow what one
would. In-flight and stream counts stay per worker: they protect that process.

Memory is bounded: a bucket left alone until it is full again is the same as a new one and is
dropped; past `MAX_PRINCIPALS` the least recently seen bucket goes, so a flood of distinct
addresses cannot grow the table. In-flight counters exist only while requests run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from datadesk.api.guards.auth import SESSION_COOKIE
from datadesk.api.guards.security import ASGIApp, Scope, _answer, _cookie, _header, _networks, client_address
from datadesk.settings import ServerSettings
from datadesk.store.interfaces.counters import RateCounter

log = logging.getLogger(__name__)
# liveness, readiness and metrics probes must see the truth, even under a flood
EXEMPT_PATHS = frozenset({"/api/health", "/api/ready", "/metrics"})
MAX_PRINCIPALS = 10_000  # buckets kept at most (least recently seen dropped first)
WHO_TTL_S = 10.0  # how long a credential's owner is remembered for budgeting (auth itself runs per request)
WHO_MAX = 4_096  # credentials remembered at most

# A credential -> its user id, or None (not valid). Called on the event loop: must be cheap.
Lookup = Callable[[str, str], "str | None"]


@dataclass
class Refusal:
    """Why a request is refused: status, message, the setting that refused it, seconds to wait."""

    status: int
    message: str
    setting: str
    retry_after: int


class TokenBuckets:
    """One token bucket per principal: `burst` tokens, refilled at `per_minute / 60` per second.
    Bounded: full (idle) buckets are dropped, and at most `max_keys` are kept."""

    def __init__(self, per_minute: int, burst: int, max_keys: int = MAX_PRINCIPALS) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(max(1, burst))
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now: float | None = None) -> int:
        """Spend one token of `key`: 0 when there was one, else the seconds until there is."""
        if self.rate <= 0:
            return 0
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) / self.rate))
        self._buckets[key] = (tokens - 1 if not wait else tokens, now)  # now the most recent
        self._expire(now)
        return wait

    def _expire(self, now: float) -> None:
        # the oldest first: drop those refilled to full (nothing to remember), then any past the bound
        while self._buckets:
            tokens, at = next(iter(self._buckets.values()))
            if len(self._buckets) <= self.max_keys and tokens + (now - at) * self.rate < self.burst:
                break
            self._buckets.popitem(last=False)


class SharedBudget:
    """The request budget counted in a shared `RateCounter`: `burst` requests per window of
    `burst / per_minute` minutes (the time the token bucket takes to refill), counted by every
    host together. Coarser than the per-worker token bucket (after a burst the wait is until
    the window ends, not until one token is back) but one statement a request, and the same
    long-run rate and burst for the whole cluster."""

    def __init__(self, counter: RateCounter, per_minute: int, burst: int) -> None:
        self.counter = counter
        self.burst = max(1, burst)
        self.window_s = self.burst * 60.0 / per_minute if per_minute > 0 else 0.0

    def take(self, key: str) -> int:
        """Spend one request of `key`: 0 when within the budget, else the seconds to wait."""
        if self.window_s <= 0:
            return 0
        bkey = f"budget:{key}"
        if self.counter.hit(bkey, self.window_s) <= self.burst:
            return 0
        return max(1, math.ceil(self.counter.resets_in(bkey, self.window_s)))


class Counters:
    """Requests running now, per key; a key is kept only while its count is above zero."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}

    def get(self, key: str) -> int:
        return self._n.get(key, 0)

    def add(self, key: str) -> None:
        self._n[key] = self._n.get(key, 0) + 1

    def done(self, key: str) -> None:
        left = self._n.get(key, 0) - 1
        if left > 0:
            self._n[key] = left
        else:
            self._n.pop(key, None)

    def __len__(self) -> int:
        return len(self._n)


class Principals:
    """Who a request is for budgeting: `user:<id>` for a valid bearer token or session cookie,
    else `addr:<client address>`. A credential's owner is remembered for `WHO_TTL_S` (by a hash
    of it, never the value), so the full lookup runs once per credential in that time; the route
    still authenticates every request as before."""

    def __init__(self, lookup: Lookup, trusted_proxies: list[str]) -> None:
        self.lookup = lookup
        self.trusted = _networks(trusted_proxies)
        self._seen: OrderedDict[bytes, tuple[str | None, float]] = OrderedDict()

    def of(self, scope: Scope) -> str:
        headers = scope.get("headers", [])
        auth = _header(headers, b"authorization")
        kind, credential = "", ""
        if auth is not None:
            scheme, _, token = auth.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                kind, credential = "token", token.strip()
        else:
            sid = _cookie(headers, SESSION_COOKIE)
            if sid:
                kind, credential = "session", sid
        uid = self._owner(kind, credential) if kind else None
        return f"user:{uid}" if uid else f"addr:{client_address(scope, self.trusted)}"

    def _owner(self, kind: str, credential: str) -> str | None:
        digest = hashlib.sha256(f"{kind}:{credential}".encode("utf-8", "surrogatepass")).digest()
        now = time.monotonic()
        hit = self._seen.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        uid = self.lookup(kind, credential)
        self._seen.pop(digest, None)
        self._seen[digest] = (uid, now + WHO_TTL_S)
        while len(self._seen) > WHO_MAX:
            self._seen.popitem(last=False)
        return uid


class Limits:
    """The decisions of the middleware: admit a request or say why not. No I/O but for a shared
    budget's counter (`take_shared`)."""

    def __init__(self, server: ServerSettings, counter: RateCounter | None = None) -> None:
        self.s = server
        self.buckets = TokenBuckets(server.requests_per_minute_per_user, server.request_burst_per_user)
        # a counter other hosts count into replaces the bucket: the budget is the cluster's
        self.shared = (SharedBudget(counter, server.requests_per_minute_per_user, server.request_burst_per_user)
                       if counter is not None and counter.shared else None)
        self.in_flight = Counters()  # per principal, streams apart
        self.streams = Counters()  # per principal
        self.total = 0  # requests in flight in this worker (streams apart)
        self._warn_after = 0.0

    def admit(self, key: str, stream: bool) -> Refusal | None:
        """None and the request is counted (call `release`), or why it is refused."""
        who, have = ("you", "have") if key.startswith("user:") else (f"your address ({key[5:]})", "has")
        s = self.s
        if stream and 0 < s.streams_per_user <= self.streams.get(key):
            return Refusal(429, f"{who} already {have} {self.streams.get(key)} event streams open (limit "
                           f"{s.streams_per_user}, server.streams_per_user): close one (another tab?) and "
                           "try again", "server.streams_per_user", 1)
        if not stream and 0 < s.requests_in_flight <= self.total:
            return Refusal(503, f"the server is answering {self.total} requests (limit {s.requests_in_flight}, "
                           "server.requests_in_flight): try again in a second", "server.requests_in_flight", 1)
        if not stream and 0 < s.requests_in_flight_per_user <= self.in_flight.get(key):
            return Refusal(429, f"{who} already {have} {self.in_flight.get(key)} requests running (limit "
                           f"{s.requests_in_flight_per_user}, server.requests_in_flight_per_user): wait for "
                           "them to finish", "server.requests_in_flight_per_user", 1)
        wait = self.buckets.take(key) if self.shared is None else 0  # shared: `take_shared`, off the loop
        if wait:
            return self.over_budget(key, wait)
        (self.streams if stream else self.in_flight).add(key)
        self.total += 0 if stream else 1
        return None

    def over_budget(self, key: str, wait: int) -> Refusal:
        s = self.s
        who = "you" if key.startswith("user:") else f"your address ({key[5:]})"
        return Refusal(429, f"too many requests from {who}: the limit is {s.requests_per_minute_per_user} "
                       f"per minute (server.requests_per_minute_per_user; bursts of "
                       f"{s.request_burst_per_user}, server.request_burst_per_user): try again in {wait} s",
                       "server.requests_per_minute_per_user", wait)

    async def take_shared(self, key: str, stream: bool) -> Refusal | None:
        """After `admit`: spend the request from the shared budget (a database statement, so in a
        thread). Over budget: the request is released again and refused. A counter that fails
        admits the request: the budget must not take the whole service down with the database."""
        if self.shared is None:
            return None
        try:
            wait = await asyncio.to_thread(self.shared.take, key)
        except Exception:
            now = time.monotonic()
            if now >= self._warn_after:  # once a minute, not once a request, while the database is away
                self._warn_after = now + 60.0
                log.warning("could not count requests in the shared budget; admitting them", exc_info=True)
            return None
        if not wait:
            return None
        self.release(key, stream)
        return self.over_budget(key, wait)

    def release(self, key: str, stream: bool) -> None:
        (self.streams if stream else self.in_flight).done(key)
        self.total -= 0 if stream else 1


class RateLimiter:
    """ASGI middleware: `Limits` applied to every HTTP request but `/api/health`."""

    def __init__(self, app: ASGIApp, limits: Limits, principals: Principals) -> None:
        self.app = app
        self.limits = limits
        self.principals = principals

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        handler = scope.get("route_handler")
        stream = bool(handler is not None and handler.opt.get("stream"))
        key = self.principals.of(scope)
        refused = self.limits.admit(key, stream)
        if refused is None and self.limits.shared is not None:
            refused = await self.limits.take_shared(key, stream)
        if refused is not None:
            await _answer(send, refused.status, refused.message,
                          ((b"retry-after", str(refused.retry_after).encode()),),
                          extra={"setting": refused.setting, "retry_after_s": refused.retry_after})
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.limits.release(key, stream)


def user_lookup(users: Any) -> Lookup:
    """The owner of a bearer token or session id, from the user store (None: not valid)."""
    def lookup(kind: str, credential: str) -> str | None:
        try:
            user = users.by_token(credential) if kind == "token" else users.by_session(credential)
        except Exception:  # e.g. a damaged sessions file: budget by address; the route says what is wrong
            log.warning("could not look up a %s for the request limits", kind, exc_info=True)
            return None
        return user.id if user is not None else None
    return lookup
