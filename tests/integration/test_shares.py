"""Sharing a thread inside its workspace (issue 32, part 3), over the real app: a member opens it
read-only, an outsider and anyone after a revoke get 404, a fork copies records and artifacts and
is independent, nothing writes through a share, and each step is in the audit trail."""

from __future__ import annotations

import io
import struct
import zlib

import pyarrow.parquet as pq
import pytest

from datadesk.audit import AuditFilter
from datadesk.llm.scripted import tool_step
from tests.fakes.sandbox import FakeSandbox

BIG = "SELECT * FROM readings WHERE building_id IN ('B01', 'B02')"


def png(width: int = 2, height: int = 2) -> bytes:
    """A tiny valid PNG (a chart stand-in)."""
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.fixture
def shared(api):
    """alice's demo thread with an offloaded query result and an uploaded chart, and a share of it."""
    FakeSandbox(api.h.rt)
    h, client = api.h, api.client
    api.model.steps.extend([tool_step("sql_query", {"sql": BIG}), "B01 and B02 **readings**."])
    events = api.turn("readings of B01 and B02")
    table = next(d for e, d in events if e == "artifact.created")["artifact"]["id"]
    r = client.post(f"/api/threads/{api.tid}/uploads", files={"file": ("chart.png", png(), "image/png")},
                    headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    chart = r.json()["artifacts"][0]["id"] if "artifacts" in r.json() else r.json()["artifact"]["id"]
    r = client.post(f"/api/threads/{api.tid}/shares", headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    api.share, api.table, api.chart = r.json(), table, chart
    return api


def share_audit(api) -> list:
    return api.h.rt.audit.page(AuditFilter(action="share")).entries[::-1]


def test_member_opens_the_thread_read_only(shared) -> None:
    h, client, sid = shared.h, shared.client, shared.share["id"]
    assert len(sid) >= 32 and shared.share["link"] == f"/#s={sid}" and shared.share["active"]
    r = client.get(f"/api/shares/{sid}", headers=h.auth("bob"))
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["thread"]["id"] == shared.tid and view["share"]["owner"] == "alice" and not view["share"]["mine"]
    roles = [rec["role"] for rec in view["records"]]
    assert roles[0] == "user" and "assistant" in roles and "tool" in roles
    assert any("<strong>readings</strong>" in (rec.get("html") or "") for rec in view["records"])
    assert all("provider_fields" not in rec for rec in view["records"])
    listed = {a["id"]: a for a in view["artifacts"]}
    assert set(listed) == {shared.table, shared.chart} and not listed[shared.table]["can_requery"]
    # the grid, the chart and the file, read through the share
    page = client.get(f"/api/shares/{sid}/artifacts/{shared.table}/rows?limit=5&sort=ts:desc", headers=h.auth("bob"))
    assert page.status_code == 200, page.text
    assert len(page.json()["data"] if "data" in page.json() else page.json()["rows"]) == 5
    img = client.get(f"/api/shares/{sid}/artifacts/{shared.chart}/view", headers=h.auth("bob"))
    assert img.status_code == 200 and img.content.startswith(b"\x89PNG")
    dl = client.get(f"/api/shares/{sid}/artifacts/{shared.table}/download", headers=h.auth("bob"))
    assert dl.status_code == 200 and pq.read_table(io.BytesIO(dl.content)).num_rows == 2 * 24 * 397
    # but not the owner's own endpoints
    assert client.get(f"/api/threads/{shared.tid}", headers=h.auth("bob")).status_code == 404
    assert client.get(f"/api/artifacts/{shared.table}/rows", headers=h.auth("bob")).status_code == 404
    assert client.get(f"/api/threads/{shared.tid}/context", headers=h.auth("bob")).status_code == 404
    assert client.get(f"/api/threads/{shared.tid}/task-state", headers=h.auth("bob")).status_code in (404, 405)


def test_outsider_and_unknown_ids_get_404(shared) -> None:
    h, client = shared.h, shared.client
    # a thread of alice's "sales" workspace, shared: bob is not a member of sales
    tid = shared.new_thread(workspace="sales")
    sid = client.post(f"/api/threads/{tid}/shares", headers=h.auth("alice")).json()["id"]
    for path in (f"/api/shares/{sid}", f"/api/shares/{sid}/report", f"/api/shares/{sid}/artifacts/{shared.table}/rows"):
        r = client.get(path, headers=h.auth("bob"))
        assert r.status_code == 404, (path, r.text)
    assert client.post(f"/api/shares/{sid}/fork", headers=h.auth("bob")).status_code == 404
    assert client.get(f"/api/shares/{'x' * 43}", headers=h.auth("bob")).status_code == 404
    bad = client.get("/api/shares/not%20an%20id", headers=h.auth("bob"))
    assert bad.status_code == 400 and "share" in bad.text
    # signed out: no share at all
    assert client.get(f"/api/shares/{shared.share['id']}", headers={"Authorization": ""}).status_code == 401
    # an artifact of another thread through this share: not found
    other = shared.new_thread()
    up = client.post(f"/api/threads/{other}/uploads", files={"file": ("c.png", png(), "image/png")},
                     headers=h.auth("alice")).json()
    aid = up["artifacts"][0]["id"] if "artifacts" in up else up["artifact"]["id"]
    r = client.get(f"/api/shares/{shared.share['id']}/artifacts/{aid}/view", headers=h.auth("bob"))
    assert r.status_code == 404


def test_revoked_share_is_404_for_everyone(shared) -> None:
    h, client, sid = shared.h, shared.client, shared.share["id"]
    assert client.get(f"/api/shares/{sid}", headers=h.auth("bob")).status_code == 200
    assert client.delete(f"/api/shares/{sid}", headers=h.auth("bob")).status_code == 404  # not bob's
    r = client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    assert r.status_code == 200 and not r.json()["active"] and r.json()["revoked"]
    for user in ("bob", "alice"):
        assert client.get(f"/api/shares/{sid}", headers=h.auth(user)).status_code == 404
        assert client.post(f"/api/shares/{sid}/fork", headers=h.auth(user)).status_code == 404
    assert client.get(f"/api/shares/{sid}/artifacts/{shared.chart}/view", headers=h.auth("bob")).status_code == 404
    listed = client.get(f"/api/shares?thread={shared.tid}", headers=h.auth("alice")).json()
    assert [(s["id"], s["active"]) for s in listed] == [(sid, False)]
    assert client.get("/api/shares", headers=h.auth("bob")).json() == []


def test_fork_copies_records_and_artifacts_independently(shared) -> None:
    h, client, sid, rt = shared.h, shared.client, shared.share["id"], shared.h.rt
    r = client.post(f"/api/shares/{sid}/fork", headers=h.auth("bob"))
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["id"] != shared.tid and fork["title"].endswith("(copy)")
    mine = client.get(f"/api/threads/{fork['id']}?limit=1000", headers=h.auth("bob")).json()["records"]
    theirs = client.get(f"/api/threads/{shared.tid}?limit=1000", headers=h.auth("alice")).json()["records"]
    assert [(m["role"], m.get("name")) for m in mine] == [(t["role"], t.get("name")) for t in theirs]
    arts = client.get(f"/api/threads/{fork['id']}/artifacts", headers=h.auth("bob")).json()
    assert len(arts) == 2 and not {a["id"] for a in arts} & {shared.table, shared.chart}
    new_table = next(a for a in arts if a["format"] == "parquet")
    assert new_table["rows"] == 2 * 24 * 397 and new_table["origin"]["user"] == "bob"
    # the copy's records name the copy's artifacts, and its files are its own
    tool = next(m for m in mine if m["role"] == "tool")
    assert new_table["id"] in tool["content"] and shared.table not in tool["content"]
    page = client.get(f"/api/artifacts/{new_table['id']}/rows?limit=3", headers=h.auth("bob"))
    assert page.status_code == 200
    owner_thread = rt.threads.get(shared.tid, "alice", ["demo"])
    copy_thread = rt.threads.get(fork["id"], "bob", ["demo"])
    src = rt.artifacts.data_path(owner_thread, rt.artifacts.load(owner_thread, shared.table))
    dst = rt.artifacts.data_path(copy_thread, rt.artifacts.load(copy_thread, new_table["id"]))
    assert src != dst and src.read_bytes() == dst.read_bytes() and not dst.is_symlink()
    # independent: a new turn in the copy does not touch the original; clearing the original keeps the copy
    shared.model.steps.append("a reply in bob's copy")
    shared.turn("more", tid=fork["id"], user="bob")
    after = client.get(f"/api/threads/{shared.tid}?limit=1000", headers=h.auth("alice")).json()["records"]
    assert len(after) == len(theirs)
    assert client.post(f"/api/threads/{shared.tid}/clear", headers=h.auth("alice")).status_code == 200
    again = client.get(f"/api/threads/{fork['id']}?limit=1000", headers=h.auth("bob")).json()["records"]
    assert len(again) == len(mine) + 2
    assert client.get(f"/api/artifacts/{new_table['id']}/download", headers=h.auth("bob")).status_code == 200


def test_no_write_goes_through_a_share(shared) -> None:
    h, client, sid, tid = shared.h, shared.client, shared.share["id"], shared.tid
    bob = h.auth("bob")
    before = len(client.get(f"/api/threads/{tid}?limit=1000", headers=h.auth("alice")).json()["records"])
    writes = [
        ("POST", f"/api/threads/{tid}/messages", {"content": "hi"}),
        ("PATCH", f"/api/threads/{tid}", {"title": "mine"}),
        ("POST", f"/api/threads/{tid}/clear", None),
        ("DELETE", f"/api/threads/{tid}", None),
        ("POST", f"/api/threads/{tid}/shares", None),
        ("POST", f"/api/artifacts/{shared.table}/requery", None),
        ("POST", f"/api/shares/{sid}/messages", {"content": "hi"}),
        ("PATCH", f"/api/shares/{sid}", {"title": "mine"}),
        ("POST", f"/api/shares/{sid}/artifacts/{shared.table}/requery", None),
        ("POST", f"/api/threads/{sid}/messages", {"content": "hi"}),
    ]
    for method, path, body in writes:
        r = client.request(method, path, json=body, headers=bob)
        assert r.status_code in (404, 405), (method, path, r.status_code, r.text)
    after = client.get(f"/api/threads/{tid}?limit=1000", headers=h.auth("alice")).json()
    assert len(after["records"]) == before and after["thread"]["title"] != "mine"


def test_every_step_is_in_the_audit_trail(shared) -> None:
    h, client, sid = shared.h, shared.client, shared.share["id"]
    client.get(f"/api/shares/{sid}", headers=h.auth("bob"))
    fork = client.post(f"/api/shares/{sid}/fork", headers=h.auth("bob")).json()
    client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    client.get(f"/api/shares/{sid}", headers=h.auth("bob"))
    got = [(e.user, e.outcome, (e.detail or "").split(" ")[0], e.target) for e in share_audit(shared)]
    assert got == [("alice", "ok", "create", sid), ("bob", "ok", "open", sid), ("bob", "ok", "fork", sid),
                   ("alice", "ok", "revoke", sid), ("bob", "refused", "open:", sid)]
    entries = share_audit(shared)
    assert entries[2].detail == f"fork into {fork['id']}" and entries[1].workspace == "demo"
    assert entries[1].thread == shared.tid


def test_the_report_page_is_shared_with_the_thread(shared) -> None:
    h, client, sid = shared.h, shared.client, shared.share["id"]
    r = client.post(f"/api/threads/{shared.tid}/report/items", json={"kind": "chart", "artifact": shared.chart},
                    headers=h.auth("alice"))
    assert r.status_code in (200, 201), r.text
    report = client.get(f"/api/shares/{sid}/report", headers=h.auth("bob"))
    assert report.status_code == 200, report.text
    items = report.json()["items"]
    assert [(i["kind"], i["artifact"]) for i in items] == [("chart", shared.chart)]
    assert client.get(f"/api/threads/{shared.tid}/report", headers=h.auth("bob")).status_code == 404
    assert client.post(f"/api/shares/{sid}/report/items", json={"kind": "chart", "artifact": shared.chart},
                       headers=h.auth("bob")).status_code in (404, 405)
    # the copy has the report page too, pointing at its own chart
    fork = client.post(f"/api/shares/{sid}/fork", headers=h.auth("bob")).json()
    copied = client.get(f"/api/threads/{fork['id']}/report", headers=h.auth("bob")).json()["items"]
    assert len(copied) == 1 and copied[0]["kind"] == "chart" and copied[0]["artifact"] != shared.chart
    arts = {a["id"] for a in client.get(f"/api/threads/{fork['id']}/artifacts", headers=h.auth("bob")).json()}
    assert copied[0]["artifact"] in arts
    client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    assert client.get(f"/api/shares/{sid}/report", headers=h.auth("bob")).status_code == 404


def test_an_owner_revoked_or_out_of_the_workspace_shares_nothing(shared) -> None:
    h, client, sid = shared.h, shared.client, shared.share["id"]
    assert client.get(f"/api/shares/{sid}", headers=h.auth("bob")).status_code == 200
    h.rt.users.revoke("alice")
    assert client.get(f"/api/shares/{sid}", headers=h.auth("bob")).status_code == 404
    assert client.post(f"/api/shares/{sid}/fork", headers=h.auth("bob")).status_code == 404


def save_output(api, tid: str, data: bytes, ext: str, media: str, filename: str):
    """A file alice's code wrote to /outputs in thread `tid` (a python deliverable)."""
    from datadesk.domain.artifacts import ArtifactOrigin

    handle = api.h.rt.threads.get(tid, "alice", ["demo"])
    origin = ArtifactOrigin(source="python", user="alice", thread=tid, workspace="demo", filename=filename)
    return api.h.rt.artifacts.save_bytes(handle, data, ext, "deliverable", media, origin)


def test_the_grid_explorer_reads_through_the_share(shared) -> None:
    h, client, sid, table = shared.h, shared.client, shared.share["id"], shared.table
    base = f"/api/shares/{sid}/artifacts/{table}"
    prof = client.get(f"{base}/profile?column=kwh&bins=5", headers=h.auth("bob"))
    assert prof.status_code == 200, prof.text
    own = client.get(f"/api/artifacts/{table}/profile?column=kwh&bins=5", headers=h.auth("alice"))
    # the same answer as the owner's; a mean summed by DuckDB's threads may differ in its last digits
    got, owners = prof.json(), own.json()
    assert got.pop("mean") == pytest.approx(owners.pop("mean"), rel=1e-9)
    assert got == owners and got["rows"] == 2 * 24 * 397
    groups = client.get(f"{base}/groups?by=building_id&agg=count", headers=h.auth("bob"))
    assert groups.status_code == 200, groups.text
    assert [row[:2] for row in groups.json()["data"]] == [["B01", 24 * 397], ["B02", 24 * 397]]
    # the same bounds and errors as the owner's endpoints
    bad = client.get(f"{base}/profile?column=nope", headers=h.auth("bob"))
    assert bad.status_code == 400 and "nope" in bad.text and bad.json()["extra"]["param"] == "column"
    assert client.get(f"{base}/groups?limit=5000&by=building_id", headers=h.auth("bob")).status_code == 400
    assert client.get(f"/api/shares/{sid}/artifacts/{shared.chart}/profile?column=x",
                      headers=h.auth("bob")).status_code == 400  # a chart has no columns
    # no way into the owner's endpoints, nor to an artifact of another thread through this share
    assert client.get(f"/api/artifacts/{table}/profile?column=kwh", headers=h.auth("bob")).status_code == 404
    other = shared.new_thread()
    csv = client.post(f"/api/threads/{other}/uploads", files={"file": ("t.csv", b"a,b,n\n1,2,x\n3,4,y\n", "text/csv")},
                      headers=h.auth("alice")).json()
    oid = csv["artifacts"][0]["id"] if "artifacts" in csv else csv["artifact"]["id"]
    for col in ("a", "n"):  # columns named as the profile's own aliases (b, n) do not stand in for them
        r = client.get(f"/api/artifacts/{oid}/profile?column={col}", headers=h.auth("alice"))
        assert r.status_code == 200 and r.json()["rows"] == 2, r.text
    for what in ("profile?column=a", "groups?by=a"):
        assert client.get(f"/api/shares/{sid}/artifacts/{oid}/{what}", headers=h.auth("bob")).status_code == 404
    # outsiders (a share of a workspace bob is not in) and everyone after a revoke: 404
    tid = shared.new_thread(workspace="sales")
    sales = client.post(f"/api/threads/{tid}/shares", headers=h.auth("alice")).json()["id"]
    for path in (f"/api/shares/{sales}/artifacts/{table}/profile?column=kwh",
                 f"/api/shares/{sales}/artifacts/{table}/groups?by=building_id"):
        assert client.get(path, headers=h.auth("bob")).status_code == 404, path
    client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    for user in ("bob", "alice"):
        assert client.get(f"{base}/profile?column=kwh", headers=h.auth(user)).status_code == 404
        assert client.get(f"{base}/groups?by=building_id", headers=h.auth(user)).status_code == 404


def test_a_report_file_opens_as_the_owners_sanitized_page(shared) -> None:
    h, client, sid, tid = shared.h, shared.client, shared.share["id"], shared.tid
    save_output(shared, tid, png(3, 3), "png", "image/png", "figs/daily.png")
    md = save_output(shared, tid, b"# Readings\n\n![d](figs/daily.png)\n![far](https://evil.example/p.png)\n"
                     b"<script>alert(1)</script>", "md", "text/markdown", "report.md")
    html_rep = save_output(shared, tid, b"<h1>H</h1><script>x()</script><img src=\"/outputs/figs/daily.png\">",
                           "html", "text/html", "report.html")
    for art in (md, html_rep):
        r = client.get(f"/api/shares/{sid}/artifacts/{art.id}/view", headers=h.auth("bob"))
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/html")
        assert r.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
        assert r.headers["x-content-type-options"] == "nosniff"
        own = client.get(f"/api/artifacts/{art.id}/view", headers=h.auth("alice"))
        assert r.text == own.text  # the owner's page, not a copy of its code
        assert r.text.count("data:image/png;base64,") == 1 and "<script>" not in r.text
    page = client.get(f"/api/shares/{sid}/artifacts/{md.id}/view", headers=h.auth("bob")).text
    assert "<h1>Readings</h1>" in page and "evil.example" not in page and "&lt;script&gt;" in page
    assert "<h1>H</h1>" in r.text  # the HTML report, its image from the thread's outputs embedded
    # a report of another thread through this share; a share bob is outside of; a revoked one: 404
    other = shared.new_thread()
    far = save_output(shared, other, b"# elsewhere", "md", "text/markdown", "far.md")
    assert client.get(f"/api/shares/{sid}/artifacts/{far.id}/view", headers=h.auth("bob")).status_code == 404
    stid = shared.new_thread(workspace="sales")
    sales = client.post(f"/api/threads/{stid}/shares", headers=h.auth("alice")).json()["id"]
    assert client.get(f"/api/shares/{sales}/artifacts/{md.id}/view", headers=h.auth("bob")).status_code == 404
    client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    assert client.get(f"/api/shares/{sid}/artifacts/{md.id}/view", headers=h.auth("bob")).status_code == 404


def test_a_vega_lite_chart_is_drawn_from_its_spec_through_the_share(shared) -> None:
    import json

    import msgspec

    h, client, sid, tid = shared.h, shared.client, shared.share["id"], shared.tid
    spec = {"title": "kWh", "data": {"values": [{"b": "B01", "kwh": 3}]}, "mark": "bar"}
    art = save_output(shared, tid, json.dumps(spec).encode(), "vljson", "application/json", None)
    handle = h.rt.threads.get(tid, "alice", ["demo"])
    h.rt.artifacts.save(handle, msgspec.structs.replace(art, format="vega-lite", title="kWh"))
    r = client.get(f"/api/shares/{sid}/artifacts/{art.id}/view", headers=h.auth("bob"))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json") and r.json() == spec
    assert r.headers["content-security-policy"].startswith("sandbox")
    client.delete(f"/api/shares/{sid}", headers=h.auth("alice"))
    assert client.get(f"/api/shares/{sid}/artifacts/{art.id}/view", headers=h.auth("bob")).status_code == 404
