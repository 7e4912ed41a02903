"""Every user's share of the server is bounded (issue 24): a per-user request budget (token bucket
with a burst), per-user caps on requests in flight and on open event streams, a global in-flight
cap, anonymous clients budgeted per address (behind a trusted proxy the forwarded one), and
`/api/health` never limited. A refusal is a 429 (503 for the global cap) with `Retry-After` and
the setting that refused it. No timed assertions: the speed goals are in bench/bombs.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from datadesk.api.guards.ratelimit import Counters, Principals, TokenBuckets
from datadesk.llm.scripted import ScriptedModel
from tests.conftest import serve_app, wait_until

pytestmark = pytest.mark.security

RATE = "server.requests_per_minute_per_user"


def limited(harness_factory, model: Any = None, **server: Any):
    """A harness whose request budget is small enough to reach in a test."""
    server = {"requests_per_minute_per_user": 6, "request_burst_per_user": 5, **server}
    return harness_factory(model or ScriptedModel(then="fine"), server=server)


def assert_refused(r: httpx.Response, setting: str, status: int = 429) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status_code"] == status and setting in body["error"] and body["detail"] == body["error"]
    assert body["extra"]["setting"] == setting
    assert int(r.headers["retry-after"]) >= 1 and body["extra"]["retry_after_s"] == int(r.headers["retry-after"])


def raw_call(client: TestClient, path: str, peer: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, dict]:
    """A GET through the real app from a given peer address (TestClient cannot set it)."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "server": ("testserver", 80), "client": (peer, 5000), "headers": list(headers)}
    with client.portal() as portal:
        portal.call(client.app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


def test_a_burst_is_allowed_then_refused_with_retry_after_naming_the_setting(harness_factory) -> None:
    h = limited(harness_factory)
    with TestClient(h.app()) as client:
        assert [client.get("/api/threads", headers=h.auth("alice")).status_code for _ in range(5)] == [200] * 5
        r = client.get("/api/threads", headers=h.auth("alice"))
        assert_refused(r, RATE)
        assert int(r.headers["retry-after"]) <= 10  # 6 per minute: a token is back within 10 s
        assert "server.request_burst_per_user" in r.json()["error"]
        # the security headers come with a refusal too
        assert r.headers["x-content-type-options"] == "nosniff" and "content-security-policy" in r.headers


def test_one_user_throttled_leaves_another_unaffected(harness_factory) -> None:
    h = limited(harness_factory)
    with TestClient(h.app()) as client:
        statuses = [client.get("/api/threads", headers=h.auth("alice")).status_code for _ in range(20)]
        assert statuses[:5] == [200] * 5 and set(statuses[5:]) == {429}
        assert [client.get("/api/me", headers=h.auth("bob")).status_code for _ in range(5)] == [200] * 5


def test_a_users_sessions_and_tokens_share_one_budget(harness_factory) -> None:
    h = limited(harness_factory, request_burst_per_user=8)
    second = h.rt.users.new_token("alice")
    with TestClient(h.app()) as client:
        assert client.post("/api/login", json={"token": h.tokens["alice"]}).status_code == 200  # anonymous: an address
        for _ in range(4):
            assert client.get("/api/threads", headers=h.auth("alice")).status_code == 200
        for _ in range(4):
            assert client.get("/api/threads", headers={"Authorization": f"Bearer {second}"}).status_code == 200
        assert_refused(client.get("/api/threads"), RATE)  # the session cookie: the same user, the same bucket


def test_health_is_never_throttled(harness_factory) -> None:
    h = limited(harness_factory, requests_in_flight=1)
    with TestClient(h.app()) as client:
        while client.get("/api/me", headers=h.auth("alice")).status_code != 429:
            pass
        while client.get("/api/me").status_code != 429:  # the anonymous budget of this address too
            pass
        assert [client.get("/api/health").status_code for _ in range(30)] == [200] * 30
        assert [client.get("/api/health", headers=h.auth("alice")).status_code for _ in range(30)] == [200] * 30


def test_unauthenticated_requests_are_budgeted_per_address(harness_factory) -> None:
    h = limited(harness_factory)
    with TestClient(h.app()) as client:
        assert [raw_call(client, "/api/me", "192.0.2.1")[0] for _ in range(5)] == [401] * 5
        status, headers = raw_call(client, "/api/me", "192.0.2.1")
        assert status == 429 and int(headers["retry-after"]) >= 1
        # an invalid token is no way around it: it is budgeted by its address as well
        bad = [(b"authorization", b"Bearer ddt_alice.guess")]
        assert raw_call(client, "/api/me", "192.0.2.1", bad)[0] == 429
        assert raw_call(client, "/api/me", "192.0.2.2")[0] == 401  # another address has its own budget
        # a signed-in user on the throttled address is not throttled with it
        assert client.get("/api/me", headers=h.auth("alice")).status_code == 200


def test_behind_a_trusted_proxy_the_forwarded_client_is_budgeted(harness_factory) -> None:
    h = limited(harness_factory, trusted_proxies=["10.0.0.0/8"])

    def via(peer: str, forwarded: str) -> int:
        return raw_call(client, "/api/me", peer, [(b"x-forwarded-for", forwarded.encode())])[0]

    with TestClient(h.app()) as client:
        assert [via("10.0.0.1", "203.0.113.7") for _ in range(5)] == [401] * 5
        assert via("10.0.0.1", "203.0.113.7") == 429
        assert via("10.0.0.1", "203.0.113.8") == 401  # another client behind the same proxy
        # X-Forwarded-For from an untrusted peer is ignored: the peer itself is budgeted
        spoofed = [via("192.0.2.5", f"198.51.100.{i}") for i in range(6)]
        assert spoofed == [401] * 5 + [429]


def slow_body_request(base: str, token: str) -> socket.socket:
    """A POST whose body never completes: the request stays in flight until the socket closes."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall((f"POST /api/threads HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode())
    return sock


def test_requests_in_flight_are_capped_per_user_and_in_all(harness_factory) -> None:
    h = limited(harness_factory, request_burst_per_user=50, requests_in_flight_per_user=1, requests_in_flight=2)
    app = h.app()
    limits = app.state.rate_limits
    with serve_app(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        first = slow_body_request(base, h.tokens["alice"])
        try:
            wait_until(lambda: limits.total == 1)
            assert_refused(http.get("/api/threads", headers=h.auth("alice")), "server.requests_in_flight_per_user")
            assert http.get("/api/threads", headers=h.auth("bob")).status_code == 200  # bob has his own
            wait_until(lambda: limits.total == 1)  # bob's request is counted until just after its answer
            second = slow_body_request(base, h.tokens["bob"])
            try:
                wait_until(lambda: limits.total == 2)
                assert_refused(http.get("/api/me", headers=h.auth("alice")), "server.requests_in_flight", 503)
                assert http.get("/api/health").status_code == 200
            finally:
                second.close()
        finally:
            first.close()
        wait_until(lambda: limits.total == 0)
        assert http.get("/api/threads", headers=h.auth("alice")).status_code == 200  # the slot is back


def test_event_streams_have_their_own_cap_and_do_not_count_in_flight(harness_factory) -> None:
    release = threading.Event()

    async def held(messages: list, tools: list) -> str:
        while not release.is_set():  # the turn streams until the test lets it finish
            await asyncio.sleep(0.01)
        return "done"

    h = limited(harness_factory, ScriptedModel(then=held), request_burst_per_user=50,
                requests_in_flight_per_user=1, streams_per_user=1)
    app = h.app()
    with serve_app(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        tid = http.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        with http.stream("POST", f"/api/threads/{tid}/messages", json={"content": "hi"},
                         headers=h.auth("alice")) as turn:
            assert turn.status_code == 200
            wait_until(lambda: h.rt.turns.running(tid))
            # a long-lived stream is not a request in flight: the user's other requests go on
            assert http.get("/api/threads", headers=h.auth("alice")).status_code == 200
            assert_refused(http.get(f"/api/threads/{tid}/events", headers=h.auth("alice")),
                           "server.streams_per_user")
            assert http.get(f"/api/threads/{tid}/events", headers=h.auth("bob")).status_code == 404  # not his
            release.set()
            events = [line for line in turn.iter_lines() if line.startswith("event:")]
            assert events[-1] == "event: done"
        wait_until(lambda: app.state.rate_limits.streams.get("user:alice") == 0)
        assert http.get(f"/api/threads/{tid}/events", headers=h.auth("alice")).status_code == 204


def test_a_query_parameter_given_twice_is_refused(harness_factory) -> None:
    h = harness_factory(ScriptedModel(then="fine"))
    with TestClient(h.app()) as client:
        tid = client.post("/api/threads", json={}, headers=h.auth("alice")).json()["id"]
        r = client.get(f"/api/threads/{tid}/events?after=1&after=2", headers=h.auth("alice"))
        assert r.status_code == 400 and "'after' is given more than once" in r.json()["error"]
        r = client.get(f"/api/threads/{tid}/events?aftr=1", headers=h.auth("alice"))
        assert r.status_code == 400 and "unknown query parameter 'aftr'" in r.json()["error"]
        r = client.post(f"/api/threads/{tid}/messages?background=false", json={"content": "hi"},
                        headers=h.auth("alice"))
        assert r.status_code == 400 and "unknown query parameter 'background'" in r.json()["error"]
        assert client.get(f"/api/threads/{tid}/events?after=1", headers=h.auth("alice")).status_code == 204


def test_the_tables_stay_bounded() -> None:
    buckets = TokenBuckets(per_minute=60, burst=5, max_keys=100)
    for i in range(5_000):  # a flood of distinct addresses
        buckets.take(f"addr:10.0.{i // 256}.{i % 256}", now=1000.0)
    assert len(buckets) == 100
    # a bucket left alone until it is full again is forgotten (it equals a new one)
    idle = TokenBuckets(per_minute=60, burst=5)
    idle.take("user:a", now=0.0)
    idle.take("user:b", now=10.0)
    assert len(idle) == 1
    assert [idle.take("user:b", now=10.0) for _ in range(5)] == [0, 0, 0, 0, 1]
    counters = Counters()
    counters.add("user:a")
    counters.done("user:a")
    assert len(counters) == 0
    lookups: list[str] = []
    who = Principals(lambda kind, cred: lookups.append(cred) or None, [])
    for i in range(6_000):
        who.of({"client": ("192.0.2.1", 1), "headers": [(b"authorization", f"Bearer guess{i}".encode())]})
    assert len(who._seen) <= 4_096 and len(lookups) == 6_000
    scope = {"client": ("192.0.2.1", 1), "headers": [(b"authorization", b"Bearer same")]}
    assert who.of(scope) == who.of(scope) == "addr:192.0.2.1" and lookups.count("same") == 1  # remembered
