"""A thread's report as the API shows it: the JSON of the report page (each paragraph's Markdown
rendered to sanitized HTML beside it) and the self-contained HTML export (`?format=html`).

The HTML page embeds its charts as `data:` images and carries its stylesheet; it is served with
a CSP that allows no script, images only from `data:`, and exactly that stylesheet (by hash),
like the thread export (api/controllers/export.py). The print stylesheet puts each item on a
page of its own where it fits, never splitting a chart or a table row.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any

import msgspec

from datadesk.api.render import markdown_html
from datadesk.offload.artifacts.store import ArtifactStore
from datadesk.store.threads import Thread
from datadesk.threads.report.markdown import (MAX_EMBEDDED_BYTES, cell_text, is_numeric, item_image, mark_text,
                                              stamp, table_caption)
from datadesk.threads.report.pins import VEGA_FORMAT
from datadesk.threads.report.vega import INTERACTIVE_LINE, vega_table
from datadesk.threads.report.view import ReportView, ShownItem

REPORT_CSS = """
:root{color-scheme:light}
body{font:15px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2430;max-width:60rem;margin:2rem auto;
padding:0 1.25rem}
header{border-bottom:2px solid #dde3ea;margin-bottom:1.5rem}
header p{color:#5c6778;font-size:.85em}
h1{font-size:1.7em;margin:.2em 0}
.item{margin:0 0 2rem}
.item h2{font-size:1.05em;color:#3b4656;margin:0 0 .4rem}
.mark{border-left:3px solid #c98a00;background:#fff8e6;padding:.3rem .6rem;font-size:.85em;margin:.3rem 0 .6rem}
.mark.same{border-color:#9aa5b4;background:#f4f6f9}
.note{border-left:3px solid #3d6fb6;background:#eef4fb;padding:.4rem .7rem;margin:.6rem 0;white-space:pre-wrap}
.missing{color:#8a5a00;font-style:italic}
table{border-collapse:collapse;margin:.4rem 0;font-size:.85em}
th,td{border:1px solid #c9d0da;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#eef2f7}
td.num,th.num,.dd-al-right{text-align:right;font-variant-numeric:tabular-nums}.dd-al-center{text-align:center}
caption{caption-side:bottom;text-align:left;color:#5c6778;font-size:.9em;padding-top:.3rem}
img{max-width:100%;height:auto}
pre,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f4f6f9;padding:.6rem;white-space:pre-wrap;word-break:break-word}
@page{margin:16mm 14mm}
@media print{
  body{margin:0;max-width:none;font-size:11pt}
  .item{break-inside:avoid-page}
  .item+.item{break-before:page}
  img,tr,pre{break-inside:avoid}
  h2{break-after:avoid}
}
"""
REPORT_CSP = ("sandbox; default-src 'none'; img-src data:; style-src 'sha256-"
              + base64.b64encode(hashlib.sha256(REPORT_CSS.encode()).digest()).decode() + "'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
META_CSP = ("default-src 'none'; img-src data:; style-src " + REPORT_CSP.split("style-src ")[1].split(";")[0]
            + "; base-uri 'none'; form-action 'none'")


def _data_image(src: str) -> str | None:
    s = src.strip()
    return s if s[:11].lower() == "data:image/" and not s[11:].lower().startswith("svg") else None


def report_json(view: ReportView) -> dict[str, Any]:
    """The report page's JSON: the view, each paragraph's sanitized HTML beside its Markdown."""
    out = msgspec.to_builtins(view)
    for item, shown in zip(out["items"], view.items):
        if shown.text is not None:
            item["html"] = markdown_html(shown.text, img_src=_data_image)
    return out


def table_html(table: dict[str, Any]) -> str:
    cols = table["columns"]
    num = [is_numeric(c) for c in cols]
    head = "".join(f'<th scope="col"{" class=num" if n else ""}>{html.escape(str(c["name"]))}</th>'
                   for c, n in zip(cols, num))
    rows = "".join("<tr>" + "".join(f'<td{" class=num" if n else ""}>{html.escape(cell_text(v))}</td>'
                                    for v, n in zip(row, num)) + "</tr>" for row in table["data"])
    return (f"<table><caption>{html.escape(table_caption(table))}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _vega_html(thread: Thread, artifacts: ArtifactStore, aid: str) -> str:
    """A Vega-Lite chart in a page without script: its title, its inline data's first rows."""
    got = vega_table(thread, artifacts, aid)
    if got is None:
        return f'<p class="missing">chart {html.escape(aid)} cannot be read: open it in DataDesk</p>'
    title = f'<p class="vl-title"><strong>{html.escape(got["title"])}</strong></p>' if got["title"] else ""
    table = table_html(got) if got["columns"] else ""
    return f'<figure class="vega-lite">{title}{table}<p class="missing">{INTERACTIVE_LINE}</p></figure>'


def _item_html(thread: Thread, artifacts: ArtifactStore, n: int, item: ShownItem, budget: list[int]) -> str:
    parts = [f'<section class="item {item.kind}"><h2>{n}. {html.escape(item.label or item.kind)}</h2>']
    if item.mark is not None:
        parts.append(f'<p class="mark{"" if item.mark.changed else " same"}">{html.escape(mark_text(item.mark))}</p>')
    if item.missing:
        parts.append(f'<p class="missing">{html.escape(item.missing)}</p>')
    elif item.kind == "paragraph":
        parts.append(f'<div class="text">{markdown_html(item.text or "", img_src=_data_image)}</div>')
    elif item.kind == "chart" and item.artifact and item.format == VEGA_FORMAT:
        parts.append(_vega_html(thread, artifacts, item.artifact))
    elif item.kind == "chart" and item.artifact:
        img = item_image(thread, artifacts, item.artifact, budget)
        if img is None:
            parts.append(f'<p class="missing">chart {html.escape(item.artifact)} is too large to embed: '
                         "open it in DataDesk</p>")
        else:
            src = f"data:{img[0]};base64,{base64.b64encode(img[1]).decode('ascii')}"
            parts.append(f'<figure><img src="{src}" alt="{html.escape(item.label)}"></figure>')
    elif item.table is not None:
        parts.append(table_html(item.table))
    if item.note:
        parts.append(f'<p class="note">{html.escape(item.note)}</p>')
    parts.append("</section>")
    return "".join(parts)


def report_html(view: ReportView, thread: Thread, artifacts: ArtifactStore, exported: float) -> str:
    """The self-contained, printable HTML page of the report (module docstring)."""
    refreshed = f" · last refreshed {stamp(view.refreshed['at'])}" if view.refreshed else ""
    out = [f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(view.title)}</title>'
           f'<meta http-equiv="Content-Security-Policy" content="{META_CSP}">'
           f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{REPORT_CSS}</style></head>'
           f"<body><header><h1>{html.escape(view.title)}</h1><p>Report exported from DataDesk on {stamp(exported)}"
           f" · {len(view.items)} item{'s' if len(view.items) != 1 else ''}{refreshed}</p></header><main>"]
    if not view.items:
        out.append("<p>Nothing is pinned to this report yet.</p>")
    budget = [MAX_EMBEDDED_BYTES]
    out.extend(_item_html(thread, artifacts, n, item, budget) for n, item in enumerate(view.items, 1))
    out.append("</main></body></html>")
    return "".join(out)
