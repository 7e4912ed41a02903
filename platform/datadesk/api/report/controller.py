"""A thread's report page (threads/report/pins.py stores it, threads/report/view.py resolves it).

- `GET /api/threads/{tid}/report`: the report: title, items in order (each resolved: a chart's
  newest version, a table's first rows of its view, a paragraph's Markdown and HTML, the last
  refresh's mark), `refreshed`. `?format=html` (self-contained page; `download=true` as a file)
  or `?format=md`: the export, audited like the thread exports (action `export`, detail
  `report html|md`).
- `PUT /api/threads/{tid}/report` `{"title": "..."}`: the report's title ("" : the thread's).
- `POST /api/threads/{tid}/report/items` `{"kind": "chart"|"table", "artifact": "...",
  "view": {"sort": [...], "filter": "..."}, "note": "..."}` or `{"kind": "paragraph", "seq": 12,
  "paragraph": 0}`: pin an item (201, the item and the report).
- `PATCH /api/threads/{tid}/report/items/{pin_id}` `{"note": "..."}`: the item's note.
- `DELETE /api/threads/{tid}/report/items/{pin_id}`: unpin it.
- `PUT /api/threads/{tid}/report/order` `{"order": ["pin_...", ...]}`: reorder (every item once).
Bad input is a 400 naming the field (`extra.field`); an unknown item or artifact a 404. Only
the thread's owner reaches these (another user's thread is not found); writes need the CSRF
token of a cookie session, as every other write.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.exceptions import ClientException
from litestar.params import FromPath, JSONBody, QueryParameter

from datadesk.api.controllers.artifacts import grid_reader
from datadesk.api.controllers.audit import client_of
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.report.page import REPORT_CSP, report_html, report_json
from datadesk.domain.ids import check_id
from datadesk.threads.export import safe_name
from datadesk.threads.report.pins import PinRequest, ThreadReport
from datadesk.threads.report.markdown import report_markdown
from datadesk.threads.report.view import report_items

FORMATS = ("json", "html", "md")
MAX_BODY = 64 << 10


class NoteEdit(msgspec.Struct, forbid_unknown_fields=True):
    note: str


class TitleEdit(msgspec.Struct, forbid_unknown_fields=True):
    title: str


class OrderEdit(msgspec.Struct, forbid_unknown_fields=True):
    order: list[str]


class ReportController(Controller):
    path = "/api/threads/{tid:str}/report"

    def _report(self, rt: Any, user: Any, tid: str) -> ThreadReport:
        return ThreadReport(find_thread(rt, user, tid), rt.artifacts, grid_reader(rt))

    async def _shown(self, rt: Any, report: ThreadReport) -> dict[str, Any]:
        view = await asyncio.to_thread(report_items, report.thread, rt.artifacts, report.reader)
        return await asyncio.to_thread(report_json, view)

    @get("/", opt={"strict_query": True})
    async def get_report(
        self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep, request: Request,
        format: Annotated[str, QueryParameter(description="json (the page), html or md (exports)")] = "json",
        download: Annotated[bool, QueryParameter(description="html: as a download, not shown")] = False,
    ) -> Response[Any]:
        """The report page's items, or its HTML / Markdown export."""
        if format not in FORMATS:
            raise ClientException(f"unknown report format {format!r}: use one of {', '.join(FORMATS)}")
        report = self._report(rt, user, tid)
        if format == "json":
            return Response(await self._shown(rt, report))
        view = await asyncio.to_thread(report_items, report.thread, rt.artifacts, report.reader)
        name = safe_name(view.title) + "_report"
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        if format == "html":
            body = (await asyncio.to_thread(report_html, view, report.thread, rt.artifacts, time.time())).encode()
            media, csp = "text/html; charset=utf-8", REPORT_CSP
            disp = f'{"attachment" if download else "inline"}; filename="{name}.html"'
        else:
            body = (await asyncio.to_thread(report_markdown, view, report.thread, rt.artifacts)).encode()
            media, csp, disp = "text/markdown; charset=utf-8", "sandbox", f'attachment; filename="{name}.md"'
        rt.audit.record("export", user=user.id, workspace=getattr(report.thread.meta, "workspace", None),
                        thread=report.thread.id, target=report.thread.id, bytes=len(body),
                        detail=f"report {format}", client=client_of(request))
        return Response(body, media_type=media, headers={**headers, "Content-Disposition": disp,
                                                         "Content-Security-Policy": csp})

    @put("/", status_code=200, request_max_body_size=MAX_BODY)
    async def put_title(self, tid: FromPath[str], data: JSONBody[TitleEdit], user: CurrentUser,
                        rt: RuntimeDep) -> dict[str, Any]:
        """Set the report's title ("": the thread's title)."""
        report = self._report(rt, user, tid)
        await asyncio.to_thread(report.retitle, data.title)
        return await self._shown(rt, report)

    @post("/items", status_code=201, request_max_body_size=MAX_BODY)
    async def pin(self, tid: FromPath[str], data: JSONBody[PinRequest], user: CurrentUser,
                  rt: RuntimeDep) -> dict[str, Any]:
        """Pin a chart, a table (or a grid view of one) or a paragraph of an answer."""
        report = self._report(rt, user, tid)
        item = await asyncio.to_thread(report.pin, data, user.id)
        return {"item": msgspec.to_builtins(item), "report": await self._shown(rt, report)}

    @patch("/items/{pin_id:str}", status_code=200, request_max_body_size=MAX_BODY)
    async def edit_note(self, tid: FromPath[str], pin_id: FromPath[str], data: JSONBody[NoteEdit],
                        user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """Set (or clear, with "") the analyst's note on a pinned item."""
        report = self._report(rt, user, tid)
        check_id(pin_id, "pinned item")
        await asyncio.to_thread(report.note, pin_id, data.note)
        return await self._shown(rt, report)

    @delete("/items/{pin_id:str}", status_code=200)
    async def unpin(self, tid: FromPath[str], pin_id: FromPath[str], user: CurrentUser,
                    rt: RuntimeDep) -> dict[str, Any]:
        """Take an item off the report."""
        report = self._report(rt, user, tid)
        check_id(pin_id, "pinned item")
        await asyncio.to_thread(report.unpin, pin_id)
        return await self._shown(rt, report)

    @put("/order", status_code=200, request_max_body_size=MAX_BODY)
    async def reorder(self, tid: FromPath[str], data: JSONBody[OrderEdit], user: CurrentUser,
                      rt: RuntimeDep) -> dict[str, Any]:
        """Put the items in a new order (every pinned id once)."""
        report = self._report(rt, user, tid)
        await asyncio.to_thread(report.reorder, data.order)
        return await self._shown(rt, report)
