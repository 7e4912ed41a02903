"""`GET /api/threads/{tid}/export?format=`: a thread as Markdown, a printable HTML page, a Jupyter
notebook, or a zip of the notebook with the thread's data (threads/export.py builds them).
`&audience=readers` (md and html): the questions, answers and charts only, without tool calls,
the text the model read with them, its notices and sandbox paths (threads/reader_export.py).

The HTML page is self-contained: every turn, the SQL and code highlighted, tool results, charts
embedded as `data:` images, and a print stylesheet that lets the browser paginate (no fixed
heights, no clipped overflow; figures and code blocks are not split across pages). It is served
sandboxed with a CSP that allows no script at all, images only from `data:`, and exactly its own
stylesheet (by hash).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import os
import tempfile
import time
import weakref
from typing import Annotated, Any, AsyncIterator, Callable

from litestar import Controller, Request, Response, get
from litestar.exceptions import ClientException, HTTPException
from litestar.params import FromPath, QueryParameter
from litestar.response import Stream

from datadesk.api.controllers.audit import client_of
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.render import code_html, markdown_html, plain_html, tool_html
from datadesk.threads.chart_table import ChartTable
from datadesk.threads.export import MAX_RESULT_CHARS, Entry, ThreadDocument, call_source, safe_name
from datadesk.threads.notebook import notebook_for, write_bundle
from datadesk.threads.reader_export import reader_markdown, reader_turns

FORMATS = ("md", "html", "ipynb", "zip")
AUDIENCES = ("full", "readers")
EMBEDDED_IMAGES = ("png", "jpeg", "gif", "webp")  # never SVG (it could carry script)

EXPORT_CSS = """
:root{color-scheme:light}
body{font:14px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2430;max-width:60rem;margin:2rem auto;
padding:0 1.25rem}
header{border-bottom:2px solid #dde3ea;margin-bottom:1.5rem}
header p{color:#5c6778;font-size:.85em}
.turn{border-top:1px solid #dde3ea;padding-top:.75rem;margin-top:1.25rem}
header+.turn{border-top:none;margin-top:0}
.who{font-weight:600;font-size:.8em;color:#5c6778;text-transform:uppercase;letter-spacing:.04em;margin:.6rem 0 .2rem}
.user .text{background:#eef4fb;border-radius:6px;padding:.5rem .75rem;white-space:pre-wrap}
.readers h2{font-size:1.15em;margin:1.6rem 0 .4rem}
.tool{border:1px solid #dde3ea;border-radius:6px;padding:.4rem .75rem;margin:.6rem 0;background:#fafbfc}
.tool .name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;color:#3b4656}
.tool .status{color:#5c6778;font-size:.85em}
.tool.failed{border-color:#e2a5a5}
table{border-collapse:collapse;margin:.6rem 0;font-size:.85em}
th,td{border:1px solid #c9d0da;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#eef2f7}
.dd-al-right{text-align:right;font-variant-numeric:tabular-nums}.dd-al-center{text-align:center}
img{max-width:100%;height:auto}
figure{margin:.75rem 0}
figcaption{font-size:.8em;color:#5c6778}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f4f6f9;padding:.6rem;overflow:auto;white-space:pre-wrap;word-break:break-word}
.pyg-k,.pyg-kn,.pyg-kd,.pyg-ow{color:#7a3e9d;font-weight:600}.pyg-s,.pyg-s1,.pyg-s2,.pyg-sd{color:#2c7a39}
.pyg-c,.pyg-c1,.pyg-cm{color:#6a737d;font-style:italic}.pyg-m,.pyg-mi,.pyg-mf{color:#b35900}.pyg-nf,.pyg-nb{color:#1f5fa8}
@page{margin:16mm 14mm}
@media print{
  body{margin:0;max-width:none;font-size:11pt}
  pre{overflow:visible}
  figure,img,pre,table,.who{break-inside:avoid}
  .who{break-after:avoid}
  .turn{break-before:auto}
  a{color:inherit;text-decoration:none}
}
"""
EXPORT_CSP = ("sandbox; default-src 'none'; img-src data:; style-src 'sha256-"
              + base64.b64encode(hashlib.sha256(EXPORT_CSS.encode()).digest()).decode() + "'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'self'")


# The same policy inside the page, for the copy a user saves and opens from disk (no header then).
META_CSP = "default-src 'none'; img-src data:; style-src " + EXPORT_CSP.split("style-src ")[1].split(";")[0] + \
    "; base-uri 'none'; form-action 'none'"
RENDER_BUDGET_CHARS = 1 << 20  # answer and result text rendered as Markdown per page; past it: plain text


def _data_image(src: str) -> str | None:
    """Images in answers may only be `data:` rasters: a saved page never fetches from anywhere."""
    s = src.strip()
    return s if s[:11].lower() == "data:image/" and not s[11:].lower().startswith("svg") else None


def _rendered(text: str, budget: list[int], render: Any) -> str:
    """`render(text)` while the page's budget lasts, else the text escaped (bounded CPU per export)."""
    if len(text) > budget[0]:
        return plain_html(text)
    budget[0] -= len(text)
    return render(text)


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def _call_html(doc: ThreadDocument, e: Entry, budget: list[int]) -> str:
    code, lang = call_source(e)
    ok = e.status == "ok"
    art = doc.result_artifact(e)
    facts = [e.status] + ([f"{art.rows:,} rows saved as {art.file}"] if art is not None and art.rows is not None else [])
    parts = [f'<div class="tool{"" if ok else " failed"}"><span class="name">{html.escape(e.name)}</span> '
             f'<span class="status">· {html.escape(" · ".join(facts))}</span>']
    if code:
        parts.append(code_html(code, lang if lang != "json" else None))
    if e.result is not None and e.result.content:
        text = e.result.content
        parts.append(_rendered(text[:MAX_RESULT_CHARS] + (f"\n… ({len(text) - MAX_RESULT_CHARS:,} more chars)"
                                                          if len(text) > MAX_RESULT_CHARS else ""), budget, tool_html))
    parts.append("</div>")
    for aid in doc.images_of(e):
        img = doc.image(aid)
        if img is None:
            parts.append(f"<p><em>chart {html.escape(aid)} is no longer available</em></p>")
        else:
            src = f"data:{img[0]};base64,{base64.b64encode(img[1]).decode('ascii')}"
            parts.append(f'<figure><img src="{src}" alt="chart {html.escape(aid)}"></figure>')
    for aid in doc.charts_of(e):
        parts.append(_chart_html(doc.chart(aid), budget))
    for f in doc.files_of(e):
        img = doc.image(str(f["id"])) if str(f.get("format")) in EMBEDDED_IMAGES else None
        if img is not None:  # a chart the code saved to /outputs
            src = f"data:{img[0]};base64,{base64.b64encode(img[1]).decode('ascii')}"
            parts.append(f'<figure><img src="{src}" alt="{html.escape(str(f["file"]))}">'
                         f"<figcaption>{html.escape(str(f['file']))}</figcaption></figure>")
        else:
            parts.append(f"<p>File: <code>{html.escape(str(f['file']))}</code> (artifact {html.escape(str(f['id']))})</p>")
    return "".join(parts)


def _chart_html(table: ChartTable, budget: list[int]) -> str:
    """A Vega-Lite chart in a page that runs no script: its title and a table of its data."""
    return f'<figure class="chart-table">{_rendered(table.markdown(), budget, markdown_html)}</figure>'


def thread_html(doc: ThreadDocument) -> str:
    """The printable page of a thread (every turn; see the module docstring)."""
    questions = sum(1 for e in doc.entries if e.kind == "user")
    out = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(doc.title)}</title>"
           f"<meta http-equiv=\"Content-Security-Policy\" content=\"{META_CSP}\">"
           f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{EXPORT_CSS}</style>"
           f"</head><body><header><h1>{html.escape(doc.title)}</h1><p>Exported from DataDesk on "
           f"{_stamp(doc.exported)} UTC · thread {html.escape(doc.thread.id)} · {questions} questions</p></header>"]
    open_turn = False
    budget = [RENDER_BUDGET_CHARS]
    for e in doc.entries:
        if e.kind == "user":
            if open_turn:
                out.append("</section>")
            meta = e.record.meta or {}
            text = (f"Uploaded {meta.get('filename')} (artifact {meta.get('artifact')})"
                    if meta.get("kind") == "upload" else e.record.content)
            out.append(f'<section class="turn user"><div class="who">You · {_stamp(e.record.ts)}</div>'
                       f'<div class="text">{html.escape(text)}</div>')
            open_turn = True
        elif e.kind == "answer":
            answer = _rendered(e.record.content or "", budget, lambda t: markdown_html(t, img_src=_data_image))
            out.append(f'<div class="who">Assistant</div><div class="answer">{answer}</div>')
            if e.record.status == "error":
                out.append(f"<p><em>error: {html.escape(str((e.record.meta or {}).get('error')))}</em></p>")
        else:
            out.append(_call_html(doc, e, budget))
    if open_turn:
        out.append("</section>")
    out.append("</body></html>")
    return "".join(out)


def readers_html(doc: ThreadDocument) -> str:
    """The printable page for readers: each question as a heading, its answers and charts."""
    out = [f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(doc.title)}</title>"
           f"<meta http-equiv=\"Content-Security-Policy\" content=\"{META_CSP}\">"
           f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{EXPORT_CSS}</style>"
           f"</head><body class=\"readers\"><header><h1>{html.escape(doc.title)}</h1>"
           f"<p>{time.strftime('%Y-%m-%d', time.gmtime(doc.exported))}</p></header>"]
    budget = [RENDER_BUDGET_CHARS]
    for turn in reader_turns(doc):
        out.append("<section>")
        if turn.question:
            first, _, rest = turn.question.strip().partition("\n")
            out.append(f"<h2>{html.escape(first[:200])}</h2>")
            if rest.strip():
                out.append(f'<p class="text">{html.escape(rest.strip())}</p>')
        for text in turn.answers:
            out.append(f'<div class="answer">'
                       f'{_rendered(text, budget, lambda t: markdown_html(t, img_src=_data_image))}</div>')
        for fig in turn.figures:
            out.append(f'<figure><img src="{fig.uri}" alt="{html.escape(fig.caption)}">'
                       f"<figcaption>{html.escape(fig.caption)}</figcaption></figure>")
        for chart in turn.charts:
            out.append(_chart_html(chart, budget))
        out.append("</section>")
    out.append("</body></html>")
    return "".join(out)


MAX_ZIPS_PER_USER = 1  # zip exports one user may have in the making or downloading at once
MAX_ZIPS = 4  # all users together: each may take up to MAX_BUNDLE_BYTES of temp disk
_ZIPS: dict[str, int] = {}


def _zip_slot(uid: str) -> Callable[[], None]:
    """A zip-export slot for `uid` (429 naming the limits when none is free); returns its release."""
    if _ZIPS.get(uid, 0) >= MAX_ZIPS_PER_USER or sum(_ZIPS.values()) >= MAX_ZIPS:
        raise HTTPException(status_code=429, headers={"Retry-After": "5"}, detail=(
            f"a zip export is being made or downloaded already (at most {MAX_ZIPS_PER_USER} per user, "
            f"{MAX_ZIPS} in all): wait for it to finish, or export md, html or ipynb (no data files)"))
    _ZIPS[uid] = _ZIPS.get(uid, 0) + 1
    held = [True]

    def release() -> None:
        if held.pop() if held else False:
            _ZIPS[uid] -= 1
            if not _ZIPS[uid]:
                del _ZIPS[uid]
    return release


def _file_chunks(path: str, release: Callable[[], None] = lambda: None) -> AsyncIterator[bytes]:
    """The file, then removed and its slot released (also when the stream is dropped unread)."""
    def cleanup() -> None:
        release()
        if os.path.exists(path):
            os.unlink(path)

    async def gen() -> AsyncIterator[bytes]:
        try:
            with open(path, "rb") as fh:
                while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                    yield chunk
        finally:
            cleanup()
    it = gen()
    weakref.finalize(it, cleanup)
    return it


def _exported(rt: Any, request: Request, uid: str, handle: Any, fmt: str, size: int) -> None:
    """The audit entry of one export (its format and size; never its content)."""
    rt.audit.record("export", user=uid, workspace=getattr(handle.meta, "workspace", None), thread=handle.id,
                    target=handle.id, bytes=size, detail=fmt, client=client_of(request))


class ExportController(Controller):
    path = "/api/threads"

    @get("/{tid:str}/export", opt={"strict_query": True})  # takes `request` (audit): unknown parameters stay 400s
    async def export_thread(
        self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep, request: Request,
        format: Annotated[str, QueryParameter(description="md, html (printable page), ipynb, or zip "
                                                          "(the notebook with the thread's data)")] = "md",
        download: Annotated[bool, QueryParameter(description="html: as a download, not shown")] = False,
        audience: Annotated[str, QueryParameter(description="full (the transcript, default) or readers "
                                                            "(md and html: questions, answers and charts only)")] = "full",
    ) -> Response[Any]:
        if format not in FORMATS:
            raise ClientException(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
        if audience not in AUDIENCES:
            raise ClientException(f"unknown audience {audience!r}: use full or readers")
        if audience == "readers" and format not in ("md", "html"):
            raise ClientException(f"audience=readers is for the md and html exports, not {format}: "
                                  "a notebook is the analysis itself")
        readers = audience == "readers"
        handle = find_thread(rt, user, tid)
        doc = await asyncio.to_thread(ThreadDocument.read, handle, rt.artifacts)
        name = safe_name(doc.title) + ("-for-readers" if readers else "")
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        if format == "zip":
            release = _zip_slot(user.id)
            fd, path = tempfile.mkstemp(prefix="datadesk-export-", suffix=".zip")
            os.close(fd)
            try:
                await asyncio.to_thread(write_bundle, doc, path)
            except BaseException:
                os.unlink(path)
                release()
                raise
            _exported(rt, request, user.id, handle, format, os.path.getsize(path))
            return Stream(_file_chunks(path, release), media_type="application/zip", headers={
                **headers, "Content-Disposition": f'attachment; filename="{name}.zip"',
                "Content-Security-Policy": "sandbox"})
        if format == "html":
            body = await asyncio.to_thread(readers_html if readers else thread_html, doc)
            _exported(rt, request, user.id, handle, format + ("/readers" if readers else ""), len(body.encode()))
            disp = f'{"attachment" if download else "inline"}; filename="{name}.html"'
            return Response(body.encode(), media_type="text/html; charset=utf-8", headers={
                **headers, "Content-Disposition": disp, "Content-Security-Policy": EXPORT_CSP})
        if format == "ipynb":
            data, media, ext = json.dumps(await asyncio.to_thread(notebook_for, doc), indent=1).encode(), \
                "application/x-ipynb+json", "ipynb"
        else:
            text = await asyncio.to_thread(lambda: reader_markdown(doc) if readers else doc.to_markdown())
            data, media, ext = text.encode(), "text/markdown; charset=utf-8", "md"
        _exported(rt, request, user.id, handle, format + ("/readers" if readers else ""), len(data))
        return Response(data, media_type=media, headers={
            **headers, "Content-Disposition": f'attachment; filename="{name}.{ext}"',
            "Content-Security-Policy": "sandbox"})
