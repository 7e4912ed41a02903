"""Bad inputs from one user get a 4xx that names the problem, never a 500 (issue 15)."""

from __future__ import annotations

import logging

import pytest

from datadesk.llm.scripted import ScriptedModel
from datadesk.store.layout import Layout
from datadesk.store.users import UserStore

pytestmark = pytest.mark.security


@pytest.fixture
def env(home, harness_factory):
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + "memory = true\n")
    h = harness_factory(ScriptedModel(then="fine"))
    _, h.tokens["dana"] = UserStore(h.rt.layout).add("dana", ["demo"], ["memory"])
    with h.client(signed_in=False, thread=False, raise_server_exceptions=False) as api:
        yield h, api.client


def test_a_non_ascii_csrf_header_is_a_403_not_a_500(env) -> None:
    h, client = env
    assert client.post("/api/login", json={"token": h.tokens["alice"]}).status_code == 200
    r = client.post("/api/threads", json={}, headers={"X-CSRF-Token": "é".encode("latin-1")})
    assert r.status_code == 403 and "CSRF" in r.json()["error"]


def test_memory_text_with_a_lone_surrogate_is_refused_by_name(env) -> None:
    h, client = env
    auth = {**h.auth("dana"), "content-type": "application/json"}
    for body in (b'{"text": "a \\ud800 b"}', b'{"text": "a \\udc00"}'):
        r = client.post("/api/memory?workspace=demo", content=body, headers=auth)
        assert r.status_code == 400 and "surrogate" in r.json()["error"], r.text


@pytest.mark.parametrize("value", ["yes", "false", 0, 1, None])
def test_booleans_are_strict(env, value) -> None:
    h, client = env
    r = client.put("/api/memory/settings?workspace=demo", json={"enabled": value}, headers=h.auth("dana"))
    assert r.status_code == 400 and "bool" in r.json()["error"], r.text
    r = client.put("/api/memory/settings?workspace=demo", json={"enabled": False}, headers=h.auth("dana"))
    assert r.status_code == 200 and r.json()["enabled"] is False


def test_json_endpoints_refuse_other_content_types(env) -> None:
    h, client = env
    r = client.post("/api/threads", content=b'{"title": "x"}',
                    headers={**h.auth("alice"), "content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = client.post("/api/threads", content=b'{"title": "x"', headers={**h.auth("alice"), "content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_unknown_routes_and_bad_ids_say_what_is_wrong_with_security_headers(env) -> None:
    h, client = env
    r = client.get("/api/nope", headers=h.auth("alice"))
    assert r.status_code == 404 and "/api/nope" in r.json()["error"]
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    r = client.get("/api/threads/a%2Fb", headers=h.auth("alice"))
    assert r.status_code == 400 and "[A-Za-z0-9_-]{1,64}" in r.json()["error"]
    r = client.get("/api/threads/bad.id", headers=h.auth("alice"))
    assert r.status_code == 400 and "[A-Za-z0-9_-]{1,64}" in r.json()["error"]
    r = client.delete("/api/threads", headers=h.auth("alice"))
    assert r.status_code == 405 and "DELETE" in r.json()["error"]
    assert "content-security-policy" in r.headers


def test_unauthenticated_requests_are_refused_before_the_body_is_read(env) -> None:
    h, client = env
    seen = []

    async def app_receive_wrapper(scope, receive, send):  # noqa: ANN001
        async def counting_receive():
            msg = await receive()
            seen.append(msg["type"])
            return msg
        await inner(scope, counting_receive, send)

    inner = client.app
    client.app = app_receive_wrapper
    try:
        r = client.post("/api/threads", json={"title": "x" * 1000})
        assert r.status_code == 401 and seen == []
        r = client.post("/api/threads", json={"title": "x"}, headers=h.auth("alice"))
        assert r.status_code == 201 and "http.request" in seen  # the wrapper does see reads
    finally:
        client.app = inner


def test_a_client_that_aborts_its_body_is_no_error(env, caplog) -> None:
    h, client = env
    app = client.app
    sent = []
    messages = [{"type": "http.request", "body": b"{\"", "more_body": True}, {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    for auth in ([], [(b"authorization", f"Bearer {h.tokens['alice']}".encode())]):
        sent.clear()
        messages[:] = [{"type": "http.request", "body": b"{\"", "more_body": True}, {"type": "http.disconnect"}]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/api/threads", "raw_path": b"/api/threads", "query_string": b"",
                 "root_path": "", "server": ("testserver", 80), "client": ("127.0.0.1", 5),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", b"100"), *auth]}
        with caplog.at_level(logging.INFO):
            with client.portal() as portal:
                portal.call(app, scope, receive, send)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        assert status in (400, 401)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def raw_call(client, method: str, path: str, body: bytes, headers: list, peer: str) -> tuple[int, bytes]:
    """One request through the real app from a given peer address (TestClient cannot set it)."""
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "server": ("testserver", 80), "client": (peer, 5000),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         *headers]}
    with client.portal() as portal:
        portal.call(client.app, scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def proxied(home, harness_factory):
    h = harness_factory(ScriptedModel(then="fine"), auth={"login_attempts_per_minute": 3},
                        server={"trusted_proxies": ["10.0.0.0/8"]})
    with h.client(signed_in=False, thread=False, raise_server_exceptions=False) as api:
        yield h, api.client


def login(client, body: bytes, peer: str, forwarded: str | None = None) -> int:
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
    return raw_call(client, "POST", "/api/login", body, headers, peer)[0]


def test_login_failures_lock_out_only_the_guessing_client_behind_a_trusted_proxy(proxied) -> None:
    h, client = proxied
    token = b'{"token": "%s"}' % h.tokens["alice"].encode()
    # successes do not count: a user logging in often is never locked out
    assert [login(client, token, "10.0.0.1", "203.0.113.7") for _ in range(5)] == [200] * 5
    wrong = [login(client, b'{"code": "wrong"}', "10.0.0.1", "198.51.100.9") for _ in range(5)]
    assert wrong[:3] == [401] * 3 and wrong[3:] == [429, 429]
    # the guesser is locked out, the other client behind the same proxy is not
    assert login(client, token, "10.0.0.1", "198.51.100.9") == 429
    assert login(client, token, "10.0.0.1", "203.0.113.7") == 200
    # X-Forwarded-For from an untrusted peer is ignored: it is counted as itself
    spoof = [login(client, b'{"code": "wrong"}', "192.0.2.5", f"203.0.113.{i}") for i in range(4)]
    assert spoof[-1] == 429
    assert login(client, token, "192.0.2.6") == 200


def test_client_address_takes_the_rightmost_untrusted_hop() -> None:
    from datadesk.api.guards.security import _networks, client_address

    trusted = _networks(["10.0.0.0/8", "::1"])
    scope = {"client": ("10.1.2.3", 1), "headers": [(b"x-forwarded-for", b"1.1.1.1, 2.2.2.2, 10.9.9.9")]}
    assert client_address(scope, trusted) == "2.2.2.2"
    assert client_address({**scope, "client": ("8.8.8.8", 1)}, trusted) == "8.8.8.8"
    assert client_address(scope, []) == "10.1.2.3"
    assert client_address({"client": ("10.1.2.3", 1), "headers": []}, trusted) == "10.1.2.3"


def test_credentials_in_the_llm_base_url_never_reach_the_log(caplog) -> None:
    import asyncio

    from datadesk.llm.client import OpenAIChatModel
    from datadesk.settings import LLMSettings
    from tests.fakes.openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as fake:
        fake.add_text("hello", chunks=2)
        url = fake.base_url.replace("http://", "http://dduser:pa55-w0rd-xyz@")
        model = OpenAIChatModel(LLMSettings(base_url=url, api_key="sk-test-secret-123", model="fake-model",
                                            retry_backoff_s=0.01))

        async def turn() -> list:
            try:
                return [ev async for ev in model.stream([{"role": "user", "content": "hi"}], [])]
            finally:
                await model.aclose()

        with caplog.at_level(logging.DEBUG):
            events = asyncio.run(turn())
    assert events
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP Request" in text  # httpx did log the request
    assert "pa55-w0rd-xyz" not in text and "sk-test-secret-123" not in text


def test_the_local_backend_refuses_every_kernel_start_once_two_users_can_execute_code(home) -> None:
    from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox

    users = UserStore(Layout(home))
    users.add("alice", ["demo"], ["code_execution"])
    rt = runtime_with_sandbox(home, {"backend": "local", "pool_size": 0})
    c = ctx(rt)

    async def body():
        first = await py(rt, c, "import os\nsorted(k for k in os.environ if 'KEY' in k or 'DATADESK' in k)")
        users.add("mallory", ["demo"], ["code_execution"])  # a second coder, added while it runs
        second = await py(rt, ctx(rt, tid="t2"), "1 + 1")
        return first, second

    first, second = run_with(rt, body)
    assert not first.is_error and "[]" in first.content, first.content  # the app's environment is not there
    assert second.is_error and "2 users can execute code" in second.content and "docker" in second.content
    # with the explicit opt-out the same start goes ahead
    from datadesk.sandbox.backends.local.process import LocalSandbox
    from datadesk.settings import SandboxSettings

    assert LocalSandbox(SandboxSettings(backend="local"), home).sharing_problem()
    assert LocalSandbox(SandboxSettings(backend="local", allow_unsafe_local=True), home).sharing_problem() is None


def test_the_schema_is_json_and_no_page_loads_third_party_scripts(env) -> None:
    h, client = env
    for path in ("/schema", "/schema/openapi.json"):
        r = client.get(path)
        assert r.status_code == 200 and r.json()["info"]["title"] == "DataDesk", path
        assert "cdn." not in r.text
    assert client.get("/schema/swagger").status_code == 404


def test_the_apps_secrets_on_disk_are_owner_only(env) -> None:
    h, client = env
    assert client.post("/api/login", json={"token": h.tokens["alice"]}).status_code == 200
    for name in ("users.json", "sessions.json", "csrf.key"):
        assert (h.rt.layout.home / name).stat().st_mode & 0o077 == 0, name
