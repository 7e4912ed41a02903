"""Login cannot be forced (issue 15): a login link only shows a confirm page, the confirm form
works only from the page's own browser and site, a signed-in session is never replaced, codes
expire in minutes and a new code voids the old, model-written images cannot call the app."""

from __future__ import annotations

import re
import time

import pytest
from litestar.testing import TestClient

from datadesk.api.render import markdown_html
from datadesk.llm.scripted import ScriptedModel
from tests.conftest import parse_sse

pytestmark = pytest.mark.security


@pytest.fixture
def env(harness_factory):
    h = harness_factory(ScriptedModel(then="![x](/login?code=SECRET) ![y](http://127.0.0.1:8000/api/me)"))
    with h.client(signed_in=False, thread=False) as api:
        yield h, api.client


def confirm_field(page: str) -> str:
    return re.search(r'name="confirm" value="([0-9a-f]+)"', page).group(1)


def login_by_link(client, code: str):
    page = client.get(f"/login?code={code}", follow_redirects=False)
    assert page.status_code == 200, page.text
    return client.post("/login", data={"code": code, "confirm": confirm_field(page.text)}, follow_redirects=False)


def test_opening_a_login_link_redeems_nothing(env) -> None:
    h, client = env
    code = h.rt.users.new_login_code("alice", 600)
    page = client.get(f"/login?code={code}", follow_redirects=False)
    assert page.status_code == 200 and "Sign in as <strong>alice</strong>" in page.text
    assert '<form method="post" action="/login">' in page.text
    assert "datadesk_session=" not in page.headers.get("set-cookie", "")
    assert client.get("/api/me").status_code == 401
    assert h.rt.users.peek_login_code(code).id == "alice"  # still valid
    r = client.post("/login", data={"code": code, "confirm": confirm_field(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and client.get("/api/me").json()["id"] == "alice"
    assert h.rt.users.peek_login_code(code) is None  # redeemed once


def test_a_forged_confirm_is_refused(env) -> None:
    h, client = env
    code = h.rt.users.new_login_code("bob", 600)
    # another site posts the form: no nonce cookie of this browser (SameSite=Strict), or says cross-site
    assert client.post("/login", data={"code": code, "confirm": "0" * 64}).status_code == 403
    page = client.get(f"/login?code={code}")
    token = confirm_field(page.text)
    r = client.post("/login", data={"code": code, "confirm": token}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = client.post("/login", data={"code": code, "confirm": token}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    with TestClient(h.app()) as other:  # the attacker's own page token, replayed from another browser
        assert other.post("/login", data={"code": code, "confirm": token}).status_code == 403
    assert client.get("/api/me").status_code == 401 and h.rt.users.peek_login_code(code) is not None


def test_a_signed_in_session_is_never_replaced(env) -> None:
    h, client = env
    assert login_by_link(client, h.rt.users.new_login_code("alice", 600)).status_code == 303
    attacker = h.rt.users.new_login_code("bob", 600)
    page = client.get(f"/login?code={attacker}", follow_redirects=False)
    assert page.status_code == 409 and "signed in as <strong>alice</strong>" in page.text and "as bob" in page.text
    r = client.post("/api/login", json={"code": attacker})
    assert r.status_code == 409 and "log out first" in r.json()["error"]
    assert client.post("/api/login", json={"token": h.tokens["bob"]}).status_code == 409
    assert client.get("/api/me").json()["id"] == "alice"
    assert h.rt.users.peek_login_code(attacker) is not None  # refused, not consumed


def test_codes_expire_and_a_new_code_voids_the_old(env) -> None:
    h, client = env
    assert h.rt.settings.auth.login_code_ttl_s == 600  # minutes, not a day
    first = h.rt.users.new_login_code("alice", 600)
    second = h.rt.users.new_login_code("alice", 600)
    bobs = h.rt.users.new_login_code("bob", 600)
    assert h.rt.users.peek_login_code(first) is None and h.rt.users.redeem_login_code(first) is None
    assert h.rt.users.peek_login_code(second).id == "alice"
    assert h.rt.users.peek_login_code(bobs).id == "bob"  # other users' codes stay
    short = h.rt.users.new_login_code("bob", 0.05)
    time.sleep(0.1)
    assert client.get(f"/login?code={short}").status_code == 401


def test_model_images_cannot_call_app_endpoints(env) -> None:
    h, client = env
    for src in ["/login?code=X", "login?code=X", "//127.0.0.1:8000/login?code=X", "http://127.0.0.1:8000/login?code=X",
                "/api/me", "/%6cogin?code=X", "/api/artifacts/a_1/view", "./x.png"]:
        assert "src=" not in markdown_html(f"![x]({src})"), src
    assert 'src="http://other.example/x.png"' in markdown_html("![x](http://other.example/x.png)")  # CSP blocks it
    auth = h.auth("alice")
    tid = client.post("/api/threads", json={}, headers=auth).json()["id"]
    body = client.post(f"/api/threads/{tid}/messages", json={"content": "hi"}, headers=auth).text
    assert "/login?code=" not in "".join(re.findall(r'src=\\"[^"]*', body))
    records = client.get(f"/api/threads/{tid}", headers=auth).json()["records"]
    html = next(r["html"] for r in records if r["role"] == "assistant")
    assert "<img" in html and "src=" not in html


def test_images_may_show_this_threads_artifacts_only(harness_factory) -> None:
    from datadesk.domain.artifacts import ArtifactOrigin

    text: dict[str, str] = {}
    h = harness_factory(ScriptedModel(then=lambda messages, tools: text["answer"]))
    auth = h.auth("alice")
    with TestClient(h.app()) as client:
        mine, other = (client.post("/api/threads", json={}, headers=auth).json()["id"] for _ in range(2))
        ids = {}
        for tid in (mine, other):
            handle = h.rt.threads.get(tid, "alice", ["demo"])
            origin = ArtifactOrigin(source="python", user="alice", thread=tid, workspace="demo", filename="c.png")
            ids[tid] = h.rt.artifacts.save_bytes(handle, b"\x89PNG\r\n\x1a\n", "png", "deliverable", "image/png",
                                                 origin).id
        text["answer"] = f"![mine](/api/artifacts/{ids[mine]}/view) ![theirs](/api/artifacts/{ids[other]}/view)"
        body = client.post(f"/api/threads/{mine}/messages", json={"content": "chart"}, headers=auth).text
        events = [d for e, d in parse_sse(body) if e == "message.completed"]
        records = client.get(f"/api/threads/{mine}", headers=auth).json()["records"]
    for html in (events[-1]["html"], next(r["html"] for r in records if r["role"] == "assistant")):
        assert f'src="/api/artifacts/{ids[mine]}/view"' in html
        assert ids[other] not in html


def test_tokens_and_codes_name_their_account_and_only_the_secret_counts(harness_factory) -> None:
    from datadesk.store.users import credential_account

    h = harness_factory(ScriptedModel(then="ok"))
    token = h.tokens["bob"]
    assert token.startswith("ddt_bob.") and credential_account(token) == "bob"
    code = h.rt.users.new_login_code("bob", 60)
    assert code.startswith("bob.") and credential_account(code) == "bob"
    assert credential_account("ddt_oldstyletokenwithoutuser") is None and credential_account("x.") is None
    assert h.rt.users.by_token("ddt_bob." + token.split(".", 1)[1][:-2] + "xx") is None
    assert h.rt.users.by_token("ddt_alice." + token.split(".", 1)[1]) is None  # the user part is not trusted


def test_failed_logins_count_per_account(harness_factory) -> None:
    """Failures on one account lock that account for addresses that failed, not other accounts."""
    h = harness_factory(ScriptedModel(then="ok"), auth={"login_attempts_per_minute": 100,
                                                        "login_attempts_per_account": 3})
    with TestClient(h.app()) as client:
        for _ in range(3):
            assert client.post("/api/login", json={"token": "ddt_bob.guess"}).status_code == 401
        r = client.post("/api/login", json={"token": h.tokens["bob"]})
        assert r.status_code == 429 and "for this account" in r.json()["error"] and r.headers["retry-after"]
        code = h.rt.users.new_login_code("bob", 60)
        assert client.get(f"/login?code={code}").status_code == 429  # the link page too
        # another account from the same address is not affected
        assert client.post("/api/login", json={"token": h.tokens["alice"]}).status_code == 200


def test_an_accounts_owner_from_a_clean_address_still_logs_in() -> None:
    from datadesk.api.guards.security import LoginFailures

    f = LoginFailures(per_minute=10, per_account=3, trusted_proxies=[])
    for addr in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):  # a guesser spread over addresses
        assert f.account_refusal("bob", addr) is None
        f.failed(addr)
        f.failed_account("bob")
    assert f.account_refusal("bob", "10.0.0.2") is not None  # a failing address is refused for bob
    assert f.account_refusal("bob", "192.168.1.7") is None  # the owner's clean address is not
    assert f.account_refusal("alice", "10.0.0.2") is None  # nor another account
    assert f.address_refusal("10.0.0.1") is None  # one failure each: under the per-address limit
