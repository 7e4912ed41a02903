"""The audit trail through the real app (issue 30, item 5): every query of the real `sql_query` tool
(driven by the real OpenAI client against the fake OpenAI server) on the warehouse and on a
configured source, with each outcome (ok inline, ok streamed, refused, error, cancelled); every
artifact download and thread export; sign-in by token, code and login link, sign-out and failed
sign-in -- each exactly once with its fields, and no token, code, password or result row in the
log. Then the admin view: who may read it, filters, cursor paging, the CSV and its escaping;
retention at start; two worker processes appending to one day's file."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from datadesk.audit import AuditFilter
from datadesk.llm.client import OpenAIChatModel
from datadesk.settings import LLMSettings
from tests.conftest import free_port, parse_sse, wait_until
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.sandbox import FakeSandbox
from tests.integration.test_turn_control import SSEReader

ROOT = Path(__file__).resolve().parents[2]
READINGS = 190_560  # rows of the demo warehouse's `readings` (store/demo.py)


def llm(server: FakeOpenAIServer) -> OpenAIChatModel:
    return OpenAIChatModel(LLMSettings(base_url=server.base_url, api_key="k", model="fake-model",
                                       retry_backoff_s=0.01))


def sql_turn(harness_factory, calls: list[dict], user: str = "alice", sandbox: bool = False, **settings):
    """One turn of `user` in which the model calls sql_query with each of `calls` in turn; returns
    (harness, thread id, events, the tool messages the model was sent)."""
    with FakeOpenAIServer() as fake:
        for i, args in enumerate(calls):
            fake.add_tool_calls([{"id": f"call_{i}", "name": "sql_query", "arguments": args}])
        fake.add_text("done")
        h = harness_factory(llm(fake), **settings)
        if sandbox:
            FakeSandbox(h.rt, healthy=True)
        with h.client(user) as api:
            events = api.turn("go")
            tid = api.tid
        tools = [m for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert events[-1][1]["status"] == "ok", events[-3:]
    return h, tid, events, tools


def entries(h, **flt) -> list:
    return h.rt.audit.page(AuditFilter(**flt), None, 500).entries


def log_text(h) -> str:
    """Everything the set's audit log holds (day files or table), as text; with the day files' raw
    lines too on the embedded set."""
    text = json.dumps([e.public() for e in h.rt.audit.entries(AuditFilter())])
    folder = h.rt.layout.home / "audit"
    return text + "".join(p.read_text() for p in sorted(folder.glob("*.jsonl")))


def one(found: list, what: str):
    assert len(found) == 1, f"{what}: expected exactly one audit entry, got {len(found)}: {found}"
    return found[0]


def test_each_query_outcome_is_one_entry_with_its_fields(harness_factory, home) -> None:
    calls = [{"sql": "SELECT building_id, city FROM buildings ORDER BY building_id LIMIT 3"},
             {"sql": "DELETE FROM buildings"},
             {"sql": "SELECT no_such_column FROM buildings"},
             {"sql": "SELECT * FROM readings"}]
    h, tid, _, tools = sql_turn(harness_factory, calls)
    got = entries(h, action="query")
    assert len(got) == 4, got
    by_sql = {e.sql: e for e in got}
    small = by_sql[calls[0]["sql"]]
    assert (small.user, small.workspace, small.thread, small.source, small.outcome, small.rows) == \
        ("alice", "demo", tid, "warehouse", "ok", 3), small
    assert small.bytes > 0 and small.duration_ms > 0 and small.host
    refused = by_sql["DELETE FROM buildings"]
    assert (refused.outcome, refused.rows, refused.detail) == ("refused", 0, "not one read-only statement"), refused
    failed = by_sql["SELECT no_such_column FROM buildings"]
    assert failed.outcome == "error" and failed.detail == "the statement failed", failed
    streamed = by_sql["SELECT * FROM readings"]
    assert (streamed.outcome, streamed.rows) == ("ok", READINGS), streamed
    assert streamed.bytes > READINGS  # Arrow bytes of every row the source sent
    # never a result row: the cities the first query returned are nowhere in the log
    cities = {row[1] for row in json.loads(tools[0]["content"])["rows"]}
    text = log_text(h)
    assert cities and not [c for c in cities if c in text], cities


def test_a_configured_source_is_named_and_its_password_never_logged(harness_factory, home, monkeypatch) -> None:
    import sqlite3

    ws = home / "workspaces" / "demo"
    con = sqlite3.connect(ws / "data" / "crm.sqlite")
    con.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    con.executemany("INSERT INTO customers VALUES (?, ?)", [(1, "Ada"), (2, "Grace")])
    con.commit()
    con.close()
    password = "Pg-Audit-Pa55word-7781"
    monkeypatch.setenv("AUDIT_PG_PASSWORD", password)
    with open(ws / "workspace.toml", "a") as fh:  # a PostgreSQL source on a port nothing listens on
        fh.write(f'\n[sources.crm]\nurl = "sqlite:///data/crm.sqlite"\n\n[sources.ledger]\n'
                 f'url = "postgresql://analyst@127.0.0.1:{free_port()}/ledger"\n'
                 'password = "${env:AUDIT_PG_PASSWORD}"\n')
    h, tid, _, _ = sql_turn(harness_factory, [{"sql": "SELECT count(*) AS n FROM customers", "source": "crm"},
                                              {"sql": "SELECT 1", "source": "ledger"},
                                              {"sql": "SELECT 1", "source": "nowhere"}])
    crm = one(entries(h, source="crm"), "crm query")
    assert (crm.outcome, crm.rows, crm.user, crm.thread) == ("ok", 1, "alice", tid), crm
    ledger = one(entries(h, source="ledger"), "ledger query")
    assert ledger.outcome == "error" and ledger.detail == "the source cannot be reached", ledger
    assert one(entries(h, source="nowhere"), "unknown source").outcome == "refused"
    assert password not in log_text(h)


def test_a_cancelled_query_is_written_once_as_cancelled(harness_factory, home) -> None:
    slow = "SELECT sum(hash(a.range * b.range)) AS s FROM range(200000) a, range(200000) b"
    with FakeOpenAIServer() as fake:
        fake.add_tool_calls([{"id": "call_0", "name": "sql_query", "arguments": {"sql": slow}}])
        fake.add_text("after")
        h = harness_factory(llm(fake), sql={"timeout_s": 120})
        with h.client("bob", served=True, timeout=60) as api:
            c, tid = api.client, api.tid
            with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "go"}) as resp:
                sse = SSEReader(resp)
                sse.until("tool.started")
                time.sleep(0.3)  # the statement is running in DuckDB now
                assert c.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
                sse.rest()
    wait_until(lambda: entries(h, action="query"), timeout=20)
    got = one(entries(h, action="query"), "cancelled query")
    assert (got.outcome, got.user, got.thread, got.sql) == ("cancelled", "bob", tid, slow), got
    time.sleep(0.5)
    assert len(entries(h, action="query")) == 1  # and never a second one for the same call


def test_downloads_and_exports_are_one_entry_each(harness_factory, home) -> None:
    h, tid, events, _ = sql_turn(harness_factory, [{"sql": "SELECT * FROM readings"}], sandbox=True)
    aid = next(d["artifact"]["id"] for e, d in events if e == "artifact.created")
    with h.client("alice", thread=False) as api:
        c = api.client
        for url in (f"/api/artifacts/{aid}/download", f"/api/artifacts/{aid}/download?format=csv",
                    f"/api/artifacts/{aid}/rows.csv", f"/api/threads/{tid}/export?format=md",
                    f"/api/threads/{tid}/export?format=zip"):
            r = c.get(url)
            assert r.status_code == 200, (url, r.text[:300])
        assert c.get("/api/artifacts/nope123/download").status_code == 404  # nothing to audit: not found
    downloads = entries(h, action="download")
    assert sorted(e.detail for e in downloads) == ["csv", "csv of the table view", "parquet"], downloads
    for e in downloads:
        assert (e.user, e.workspace, e.thread, e.target, e.rows) == ("alice", "demo", tid, aid, READINGS), e
    assert one([e for e in downloads if e.detail == "parquet"], "parquet").bytes > 0
    exports = entries(h, action="export")
    assert sorted(e.detail for e in exports) == ["md", "zip"], exports
    assert all(e.thread == tid and e.target == tid and e.bytes > 0 and e.user == "alice" for e in exports)


def test_sign_in_sign_out_and_failures_are_entries_without_secrets(harness_factory, home) -> None:
    from datadesk.llm.scripted import ScriptedModel

    h = harness_factory(ScriptedModel(then="ok"))
    code = h.rt.users.new_login_code("alice", 60)
    link_code = h.rt.users.new_login_code("bob", 60)
    with h.client("alice", signed_in=False, thread=False) as api:
        c = api.client
        assert c.post("/api/login", json={"code": code}).status_code == 200
        csrf = c.get("/api/me").json()["csrf"]
        assert c.post("/api/logout", headers={"X-CSRF-Token": csrf}).status_code == 200
        c.cookies.clear()
        assert c.post("/api/login", json={"token": h.tokens["bob"]}).status_code == 200
        c.cookies.clear()
        assert c.post("/api/login", json={"code": code}).status_code == 401  # used already
        assert c.post("/api/login", json={"token": "ddt_bob.not-the-secret-xyz"}).status_code == 401
        page = c.get(f"/login?code={link_code}")
        confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', page.text).group(1)
        r = c.post("/login", data={"code": link_code, "confirm": confirm}, follow_redirects=False)
        assert r.status_code == 303
    sign_ins = entries(h, action="sign_in")
    assert [(e.user, e.detail, e.outcome) for e in sign_ins] == [
        ("bob", "login link", "ok"), ("bob", "token", "ok"), ("alice", "code", "ok")], sign_ins
    assert all(e.client for e in sign_ins)
    out = one(entries(h, action="sign_out"), "sign-out")
    assert out.user == "alice"
    failed = entries(h, action="sign_in_failed")
    assert [(e.user, e.outcome, e.detail) for e in failed] == [
        ("bob", "refused", "invalid, used or expired token"),
        ("alice", "refused", "invalid, used or expired code")], failed
    text = log_text(h)
    for secret in (code, link_code, h.tokens["bob"], code.split(".", 1)[1], "not-the-secret-xyz"):
        assert secret not in text, secret


def _admin(h) -> dict[str, str]:
    _, token = h.rt.users.add("dana", ["demo", "sales"], ["admin"])
    return {"Authorization": f"Bearer {token}"}


def _fill(h, n: int, t0: float) -> None:
    clock = iter(t0 + i for i in range(n))
    real = h.rt.audit.clock
    h.rt.audit.clock = lambda: next(clock)
    try:
        for i in range(n):
            h.rt.audit.record("query" if i % 2 else "download", user=f"u{i % 4}", source="crm" if i % 3 == 0 else None,
                              outcome="error" if i % 7 == 0 else "ok", workspace="demo", sql=f"SELECT {i}", rows=i)
    finally:
        h.rt.audit.clock = real


def test_the_admin_view_filters_and_pages_and_is_for_admins_only(harness_factory) -> None:
    from datadesk.llm.scripted import ScriptedModel

    h = harness_factory(ScriptedModel(then="ok"))
    admin = _admin(h)
    t0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    _fill(h, 1200, t0)
    with h.client("bob", thread=False) as api:
        c = api.client
        r = c.get("/api/admin/audit")
        assert r.status_code == 403 and "for admins" in r.json()["error"]
        assert c.get("/api/admin/audit.csv").status_code == 403
        seen, cursor, pages = [], None, 0
        while True:
            r = c.get("/api/admin/audit", params={"limit": 500, **({"cursor": cursor} if cursor else {})},
                      headers=admin)
            assert r.status_code == 200, r.text
            body = r.json()
            seen += [e["rows"] for e in body["entries"] if e["action"] in ("query", "download")]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and seen == list(range(1199, -1, -1))
        q = c.get("/api/admin/audit", params={"user": "u1", "action": "query", "outcome": "ok", "limit": 500},
                  headers=admin).json()["entries"]
        assert [e["rows"] for e in q] == [i for i in range(1199, -1, -1) if i % 4 == 1 and i % 7], q[:3]
        crm = c.get("/api/admin/audit", params={"source": "crm", "limit": 500}, headers=admin).json()
        assert len(crm["entries"]) == 400 and all(e["source"] == "crm" for e in crm["entries"])
        window = c.get("/api/admin/audit", params={"from": "2026-05-28T20:30:00Z", "to": "2026-05-28T20:31:00Z"},
                       headers=admin).json()["entries"]
        assert [e["rows"] for e in window] == list(range(259, 199, -1)), [e["rows"] for e in window][:3]
        day = c.get("/api/admin/audit", params={"from": "2026-05-28", "to": "2026-05-28", "limit": 500},
                    headers=admin).json()
        assert len(day["entries"]) == 500 and day["entries"][0]["time"].startswith("2026-05-28T20:")
        for params, word in (({"limit": 501}, "limit"), ({"cursor": "nope"}, "cursor"),
                             ({"action": "drop"}, "action"), ({"from": "yesterday"}, "from"),
                             ({"lmit": 5}, "unknown query parameter 'lmit'"),
                             ({"user": ["u1", "u2"]}, "more than once")):
            r = c.get("/api/admin/audit", params=params, headers=admin)
            assert r.status_code == 400 and word in r.json()["error"], (params, r.text)


def test_the_csv_has_every_entry_and_no_formula_cell(harness_factory) -> None:
    from datadesk.llm.scripted import ScriptedModel

    h = harness_factory(ScriptedModel(then="ok"))
    admin = _admin(h)
    _fill(h, 700, 1_780_000_000.0)
    for detail in ("=HYPERLINK(\"http://evil\")", "+1+1", "-2", "@SUM(A1)", "\tx", "plain"):
        h.rt.audit.record("admin", user="dana", target="=cmd|' /C calc'!A0", detail=detail)
    with h.client("dana", signed_in=False, thread=False) as api:
        r = api.client.get("/api/admin/audit.csv", headers=admin)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text[:200]
        assert "attachment" in r.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(r.text)))
        admin_rows = api.client.get("/api/admin/audit.csv", params={"action": "admin"}, headers=admin).text
    assert len(rows) == 706
    details = [row["detail"] for row in rows[:6]]
    assert details == ["plain", "'\tx", "'@SUM(A1)", "'-2", "'+1+1", "'=HYPERLINK(\"http://evil\")"], details
    assert all(row["target"] == "'=cmd|' /C calc'!A0" for row in rows[:6])
    assert [row["rows"] for row in rows[6:9]] == ["699", "698", "697"]
    assert len(list(csv.DictReader(io.StringIO(admin_rows)))) == 6
    for row in rows:
        for cell in row.values():
            assert not cell or cell[0] not in "=+-@\t\r", row


def test_retention_removes_old_days_at_start(harness_factory) -> None:
    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel

    h = harness_factory(ScriptedModel(then="ok"), audit={"retention_days": 30})
    now = time.time()
    for user, age_days in (("old", 45), ("edge", 29), ("recent", 0)):
        h.rt.audit.clock = lambda age=age_days: now - age * 86400
        h.rt.audit.record("sign_in", user=user)
    assert [e.user for e in entries(h)] == ["recent", "edge", "old"]
    rt = Runtime(h.rt.settings, model=ScriptedModel(then="ok"))  # another start on this home / database
    try:
        wait_until(lambda: [e.user for e in entries(h)] == ["recent", "edge"], timeout=10)
        old_day = time.strftime("%Y-%m-%d", time.gmtime(now - 45 * 86400))
        assert not list((h.rt.layout.home / "audit").glob(old_day + "*"))  # the whole day's file (embedded)
    finally:
        if rt.cluster is not None:
            rt.cluster.close()


WORKER = r"""
import sys
sys.path[:0] = sys.argv[-2:]
from datadesk.audit import embedded_trail
trail = embedded_trail(sys.argv[1], 0)
who = sys.argv[2]
for i in range(400):
    trail.record("query", user=who, sql=("SELECT '" + "x" * 200_000 + "'") if i % 50 == 0 else f"SELECT {i}", rows=i)
"""


def test_two_worker_processes_append_to_one_day_without_tearing(tmp_path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), who, str(ROOT / "platform"), str(ROOT)])
             for who in ("w1", "w2")]
    for p in procs:
        assert p.wait(120) == 0
    lines = b"".join(f.read_bytes() for f in (tmp_path / "audit").glob("*.jsonl")).splitlines()
    got = sorted((json.loads(line)["user"], json.loads(line)["rows"]) for line in lines)  # each line whole JSON
    assert got == sorted((w, i) for w in ("w1", "w2") for i in range(400)), len(got)


@pytest.mark.serial
def test_the_view_pages_through_100000_entries(harness_factory) -> None:
    """100,000 entries over a week (bench/audit_view.py's mix), every page of 500 read over HTTP,
    newest first, and one user's, one day's and a rare outcome's pages. The time per page is
    printed for the note; the p95 <= 200 ms goal is judged by bench/audit_view.py, not here."""
    from bench.audit_view import fill_cluster, fill_embedded, pages, stats
    from datadesk.llm.scripted import ScriptedModel

    h = harness_factory(ScriptedModel(then="ok"), server={"requests_per_minute_per_user": 100_000})
    admin = _admin(h)
    (fill_cluster if h.rt.cluster is not None else fill_embedded)(h.rt, 100_000)
    with h.client("dana", signed_in=False, thread=False, served=True) as api:
        pages(api.client, admin, {"limit": 10}, 1)
        times, seen = pages(api.client, admin, {"limit": 500})
        for params in ({"user": "u7"}, {"outcome": "refused"}, {"from": "2026-09-17", "to": "2026-09-17"}):
            more, _ = pages(api.client, admin, {**params, "limit": 500})
            times += more
    figure = stats(times)
    print(f"audit view, 100,000 entries ({'cluster' if h.rt.cluster else 'embedded'}): {figure}")
    assert seen == 100_000
