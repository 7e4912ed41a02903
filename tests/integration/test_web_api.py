"""What the web UI needs from the API: rename, rendered records, report/chart views, context details."""

from __future__ import annotations

import io

from datadesk.domain.artifacts import ArtifactOrigin


def png_bytes() -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([1, 2, 3])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def save(h, tid: str, user: str, data: bytes, ext: str, media: str, filename: str | None):
    handle = h.rt.threads.get(tid, user, ["demo"])
    origin = ArtifactOrigin(source="python", user=user, thread=tid, workspace="demo", filename=filename)
    return h.rt.artifacts.save_bytes(handle, data, ext, "deliverable", media, origin)


def test_rename_validates_and_keeps_the_log(api) -> None:
    client, tid, auth = api.client, api.tid, api.h.auth("alice")
    api.turn("hi")
    r = client.patch(f"/api/threads/{tid}", json={"title": "  Q3   energy  "}, headers=auth)
    assert r.status_code == 200 and r.json()["title"] == "Q3 energy"
    assert client.patch(f"/api/threads/{tid}", json={"title": "   "}, headers=auth).status_code == 400
    r = client.patch(f"/api/threads/{tid}", json={"title": "x" * 201}, headers=auth)
    assert r.status_code == 400 and "too long" in r.json()["error"]
    assert client.patch(f"/api/threads/{tid}", json={"name": "x"}, headers=auth).status_code == 400
    assert client.patch(f"/api/threads/{tid}", json={"title": "x"}, headers=api.h.auth("bob")).status_code == 404
    detail = client.get(f"/api/threads/{tid}", headers=auth).json()
    assert detail["thread"]["title"] == "Q3 energy" and len(detail["records"]) == 2


def test_records_and_stream_carry_sanitized_html(api) -> None:
    client, tid, auth = api.client, api.tid, api.h.auth("alice")
    api.model.steps.append("**bold** <script>alert(1)</script>")
    body = client.post(f"/api/threads/{tid}/messages", json={"content": "hi"}, headers=auth).text
    assert "event: message.completed" in body and "<strong>bold</strong>" in body
    assert "<script>" not in body.split("event: message.completed")[1].split('"html"')[1]
    recs = client.get(f"/api/threads/{tid}", headers=auth).json()["records"]
    answer = recs[-1]
    assert answer["html"].startswith("<p><strong>bold</strong> &lt;script&gt;")
    assert "html" not in recs[0]  # user text is shown as text by the client


def test_view_images_inline_reports_rendered_and_everything_else_refused(api) -> None:
    h, client, tid, auth = api.h, api.client, api.tid, api.h.auth("alice")
    png = png_bytes()
    chart = save(h, tid, "alice", png, "png", "image/png", "figs/daily.png")
    md = save(h, tid, "alice", b"# Report\n\n![d](figs/daily.png)\n\n![x](/outputs/../etc/passwd)\n"
              b"![far](https://evil.example/p.png)\n<script>alert(1)</script>", "md", "text/markdown", "report.md")
    html_rep = save(h, tid, "alice", b"<h1>H</h1><script>x()</script><img src=\"figs/daily.png\" onerror=\"x()\">",
                    "html", "text/html", "report.html")
    svg = save(h, tid, "alice", b"<svg xmlns='http://www.w3.org/2000/svg'><script>x()</script></svg>", "svg",
               "image/svg+xml", "a.svg")
    r = client.get(f"/api/artifacts/{chart.id}/view", headers=auth)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content == png
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["content-security-policy"].startswith("sandbox")
    r = client.get(f"/api/artifacts/{md.id}/view", headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("sandbox; default-src 'none'")
    page = r.text
    assert "<h1>Report</h1>" in page and page.count("data:image/png;base64,") == 1
    assert "evil.example" not in page and "passwd" not in page  # dropped: another host, a path outside
    assert "<script>" not in page and "&lt;script&gt;" in page
    r = client.get(f"/api/artifacts/{html_rep.id}/view", headers=auth)
    assert "<h1>H</h1>" in r.text and "<script>" not in r.text and "onerror" not in r.text
    assert "data:image/png;base64," in r.text
    r = client.get(f"/api/artifacts/{svg.id}/view", headers=auth)
    assert r.status_code == 415 and "download it instead" in r.json()["error"]
    # another user's artifact is not found; an expired one says so
    assert client.get(f"/api/artifacts/{md.id}/view", headers=h.auth("bob")).status_code == 404
    handle = h.rt.threads.get(tid, "alice", ["demo"])
    h.rt.artifacts.expire(handle, md.id)
    assert client.get(f"/api/artifacts/{md.id}/view", headers=auth).status_code == 410


def test_me_reports_sandbox_state_and_csrf_only_for_cookie_sessions(api) -> None:
    h, client = api.h, api.client
    me = client.get("/api/me", headers=h.auth("alice")).json()
    assert me["csrf"] is None  # bearer: no ambient credential, no token needed
    assert me["sandbox"]["available"] is False and "turned off" in me["sandbox"]["reason"]
    bob = client.get("/api/me", headers=h.auth("bob")).json()
    assert bob["sandbox"]["can_execute_code"] is ("code_execution" in bob["permissions"])
