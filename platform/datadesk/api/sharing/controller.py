"""Share endpoints (issue 32, part 3): a thread shared read-only with its workspace's members.

The owner: `POST /api/threads/{tid}/shares` (a new link), `GET /api/shares` (their shares,
`?thread=` one thread's), `DELETE /api/shares/{sid}` (revoke). A member of the workspace:
`GET /api/shares/{sid}` (the thread as it is: records rendered, artifacts listed),
`GET /api/shares/{sid}/report` (its report page), `GET .../artifacts/{aid}/view|rows|download`
(charts and report files, the grid, the files), `GET .../artifacts/{aid}/profile|groups` (the
grid's column profile and group-by, under the reader's query slot): reads only, none of them
touching the owner's artifacts. `POST /api/shares/{sid}/fork` (Copy into my chats).
Anyone else, and everyone once it is revoked: 404, as for an id that never existed. No other
endpoint takes a share id, so nothing writes through one (sharing/service.py holds the rules).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath, FromQuery
from litestar.response import Response, Stream

from datadesk.api.controllers.artifacts import (INLINE_IMAGES, REPORT_FORMATS, attachment_header, download_stem,
                                                report_file_page)
from datadesk.api.controllers.audit import client_of
from datadesk.api.controllers.grid.explore import explore
from datadesk.api.controllers.threads import thread_out
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.guards.security import SANDBOX_CSP
from datadesk.api.offloop import run_off_loop
from datadesk.api.sharing.reads import grid_page, shared_report, shared_view, table_file
from datadesk.domain.ids import check_id
from datadesk.domain.shares import Share
from datadesk.sandbox.files import read_regular
from datadesk.sharing.service import ShareNotFound, TooManyShares

MAX_VIEW_BYTES = 20 << 20


class ShareOut(msgspec.Struct):
    id: str
    thread: str
    workspace: str
    title: str
    created: float
    active: bool
    link: str  # the app's URL of the shared view (sign-in needed)
    revoked: float | None = None


def share_out(share: Share) -> ShareOut:
    return ShareOut(id=share.id, thread=share.thread, workspace=share.workspace, title=share.title,
                    created=share.created, active=share.active, link=f"/#s={share.id}", revoked=share.revoked)


def _params(request: Request) -> dict[str, list[str]]:
    return {k: request.query_params.getall(k) for k in request.query_params}


def _not_found(exc: ShareNotFound) -> NotFoundException:
    return NotFoundException(str(exc))


class ShareController(Controller):
    path = "/api"

    @post("/threads/{tid:str}/shares", status_code=201)
    async def create_share(self, tid: FromPath[str], request: Request, user: CurrentUser,
                           rt: RuntimeDep) -> ShareOut:
        handle = find_thread(rt, user, tid)
        try:
            share = rt.sharing.create(handle, user, client_of(request))
        except TooManyShares as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return share_out(share)

    @get("/shares")
    async def list_shares(self, user: CurrentUser, rt: RuntimeDep,
                          thread: FromQuery[str | None] = None) -> list[ShareOut]:
        return [share_out(s) for s in await run_off_loop(user.id, rt.sharing.mine, user, thread)]

    @delete("/shares/{sid:str}", status_code=200)
    async def revoke_share(self, sid: FromPath[str], request: Request, user: CurrentUser,
                           rt: RuntimeDep) -> ShareOut:
        try:
            return share_out(rt.sharing.revoke(sid, user, client_of(request)))
        except ShareNotFound as exc:
            raise _not_found(exc) from None

    @get("/shares/{sid:str}")
    async def open_share(self, sid: FromPath[str], request: Request, user: CurrentUser,
                         rt: RuntimeDep) -> dict[str, Any]:
        """The shared thread as it is now, read-only (records rendered, artifacts listed)."""
        try:
            share, thread = rt.sharing.open(sid, user, client_of(request))
        except ShareNotFound as exc:
            raise _not_found(exc) from None
        view = await run_off_loop(user.id, shared_view, rt, share, thread)
        owner = rt.users.get(share.owner)
        out = thread_out(rt, thread.meta)
        view["thread"] = {"id": out.id, "workspace": out.workspace, "title": out.title, "created": out.created,
                          "updated": out.updated}
        view["share"] = {"id": share.id, "owner": share.owner, "owner_name": getattr(owner, "name", None) or share.owner,
                         "created": share.created, "mine": share.owner == user.id}
        return view

    @get("/shares/{sid:str}/report")
    async def shared_report_page(self, sid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The thread's report page (its pinned items) through the same share."""
        share, thread = self._find(rt, sid, user)
        return await run_off_loop(user.id, shared_report, rt, share, thread)

    @get("/shares/{sid:str}/artifacts/{aid:str}/view")
    async def shared_artifact_view(self, sid: FromPath[str], aid: FromPath[str], user: CurrentUser,
                                   rt: RuntimeDep) -> Response[bytes]:
        """A chart of the shared thread (raster images inline, a Vega-Lite chart as its spec), or a
        Markdown/HTML report file as the owner's view shows it: sanitized, sandboxed, its images
        found among the thread's outputs."""
        share, thread = self._find(rt, sid, user)
        art, path = table_file(rt, thread, aid)
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        if art.format in REPORT_FORMATS:
            page = await run_off_loop(user.id, report_file_page, rt, thread, art, path)
            return Response(page.encode(), media_type="text/html; charset=utf-8",
                            headers={**headers, "Content-Security-Policy": SANDBOX_CSP})
        if art.format == "vega-lite":  # the spec, for the chat's renderer (web/js/charts.js)
            spec = await run_off_loop(user.id, read_regular, path, MAX_VIEW_BYTES)
            return Response(spec, media_type="application/json", headers={
                **headers, "Content-Security-Policy": "sandbox; default-src 'none'"})
        if art.format not in INLINE_IMAGES:
            raise HTTPException(status_code=415, detail=(
                f"artifact {aid} is {art.format}: a shared view shows charts and reports inline; download it "
                f"instead (/api/shares/{sid}/artifacts/{aid}/download)"))
        data = await run_off_loop(user.id, read_regular, path, MAX_VIEW_BYTES)
        return Response(data, media_type=INLINE_IMAGES[art.format], headers={
            **headers, "Content-Security-Policy": "sandbox; default-src 'none'"})

    @get("/shares/{sid:str}/artifacts/{aid:str}/rows")
    async def shared_rows(self, sid: FromPath[str], aid: FromPath[str], request: Request, user: CurrentUser,
                          rt: RuntimeDep) -> dict[str, Any]:
        """A page of a table of the shared thread for the read-only grid (as /api/artifacts/{aid}/rows)."""
        share, thread = self._find(rt, sid, user)
        return await grid_page(rt, user, thread, aid, _params(request))

    @get("/shares/{sid:str}/artifacts/{aid:str}/profile")
    async def shared_profile(self, sid: FromPath[str], aid: FromPath[str], request: Request, user: CurrentUser,
                             rt: RuntimeDep) -> dict[str, Any]:
        """A column's profile of a table of the shared thread (as /api/artifacts/{aid}/profile)."""
        share, thread = self._find(rt, sid, user)
        art, path = table_file(rt, thread, aid)
        return await explore(rt, user, art, path, _params(request), "profile")

    @get("/shares/{sid:str}/artifacts/{aid:str}/groups")
    async def shared_groups(self, sid: FromPath[str], aid: FromPath[str], request: Request, user: CurrentUser,
                            rt: RuntimeDep) -> dict[str, Any]:
        """A group-by of a table of the shared thread (as /api/artifacts/{aid}/groups)."""
        share, thread = self._find(rt, sid, user)
        art, path = table_file(rt, thread, aid)
        return await explore(rt, user, art, path, _params(request), "groups")

    @get("/shares/{sid:str}/artifacts/{aid:str}/download")
    async def shared_download(self, sid: FromPath[str], aid: FromPath[str], request: Request, user: CurrentUser,
                              rt: RuntimeDep) -> Stream:
        """An artifact's file as stored (audited as a download by the reader)."""
        share, thread = self._find(rt, sid, user)
        art, path = table_file(rt, thread, aid)
        rt.audit.record("download", user=user.id, workspace=share.workspace, thread=thread.id, target=aid,
                        rows=art.rows, bytes=art.bytes, detail=f"{art.format} through share {share.id}",
                        client=client_of(request))
        ext = art.file.rsplit(".", 1)[-1] if "." in art.file else ""

        def chunks() -> Any:
            with open(path, "rb") as fh:
                yield from iter(lambda: fh.read(1 << 20), b"")

        return Stream(chunks(), media_type=art.media_type, headers={
            "Content-Disposition": attachment_header(download_stem(thread.meta.title, art), ext, aid),
            "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox",
            "Cache-Control": "private, no-store"})

    @post("/shares/{sid:str}/fork", status_code=201)
    async def fork_share(self, sid: FromPath[str], request: Request, user: CurrentUser,
                         rt: RuntimeDep) -> dict[str, Any]:
        """Copy into my chats: a new thread of the reader's own with the records and artifacts copied."""
        try:
            copy = await run_off_loop(user.id, rt.sharing.fork, sid, user, client_of(request))
        except ShareNotFound as exc:
            raise _not_found(exc) from None
        return msgspec.to_builtins(thread_out(rt, copy.meta))

    @staticmethod
    def _find(rt: RuntimeDep, sid: str, user: Any) -> tuple[Share, Any]:
        try:
            return rt.sharing.find(check_id(sid, "share"), user)
        except ShareNotFound as exc:
            raise _not_found(exc) from None

