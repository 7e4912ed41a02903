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
    with TestClient(h.app()) as client:
        yield h, client


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
