"""Artifact endpoints: list, read, download, re-query, and uploads (streamed multipart)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Iterator

import msgspec
import multipart
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from litestar import Controller, Request, get, post
from litestar.exceptions import ClientException, HTTPException
from litestar.params import FromPath, FromQuery
from litestar.response import Response, Stream

from datadesk.api.access import find_artifact, find_thread
from datadesk.api.auth import CurrentUser, RuntimeDep
from datadesk.api.render import data_uri, markdown_html, report_page, sanitize
from datadesk.api.security import SANDBOX_CSP
from datadesk.chat.runtime import Runtime
from datadesk.domain.artifacts import Artifact
from datadesk.domain.users import User
from datadesk.offload.requery import expired_message
from datadesk.offload.store import regular_file
from datadesk.sandbox.files import read_regular
from datadesk.store.threads import Thread


class ArtifactOut(msgspec.Struct):
    id: str
    thread: str
    kind: str
    format: str
    status: str
    rows: int | None
    columns: int | None
    schema: list[dict[str, str]]
    bytes: int
    created: float
    last_used: float
    expires_at: float | None
    expired_at: float | None
    sandbox_path: str
    origin: dict[str, Any]
    can_requery: bool
    partial_reason: str | None = None


def artifact_out(rt: Runtime, thread_id: str, art: Artifact) -> ArtifactOut:
    tool = rt.tools.get(art.origin.tool or "", art.origin.workspace) if art.origin.source == "tool" else None
    expires = art.last_used + rt.settings.offload.ttl_s if art.is_cache and art.available else None
    return ArtifactOut(
        id=art.id, thread=thread_id, kind=art.kind, format=art.format, status=art.status, rows=art.rows,
        columns=art.columns, schema=[{"name": c.name, "type": c.type} for c in art.schema], bytes=art.bytes,
        created=art.created, last_used=art.last_used, expires_at=expires, expired_at=art.expired_at,
        sandbox_path=art.sandbox_path, origin=msgspec.to_builtins(art.origin),
        can_requery=bool(tool and tool.spec.read_only), partial_reason=art.partial_reason,
    )


def _data_file(rt: Runtime, user: User, aid: str) -> tuple[Thread, Artifact, Path]:
    """An artifact whose data file can be read (410 naming why when it cannot)."""
    handle, art = find_artifact(rt, user, aid)
    if not art.available:
        raise HTTPException(status_code=410, detail=expired_message(art))
    path = rt.artifacts.data_path(handle, art)
    if not regular_file(path):
        raise HTTPException(status_code=410, detail=f"the data file of artifact {aid} is missing")
    return handle, art, path


def _csv_chunks(path: str) -> Iterator[bytes]:
    pf = pq.ParquetFile(path)
    first = True
    for batch in pf.iter_batches(batch_size=65_536):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.Table.from_batches([batch]), sink,
                        write_options=pacsv.WriteOptions(include_header=first))
        first = False
        yield sink.getvalue().to_pybytes()
    if first:  # no batches: still send the header
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pf.schema_arrow.empty_table(), sink)
        yield sink.getvalue().to_pybytes()


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(1 << 20), b"")


INLINE_IMAGES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
                 "webp": "image/webp"}  # never SVG: it can carry script
REPORT_FORMATS = {"md", "markdown", "html", "htm"}
MAX_VIEW_BYTES = 20 << 20
MAX_EMBED_BYTES = 30 << 20  # all images embedded in one report page


def _report_page(rt: Runtime, handle: Thread, art: Artifact, path: Path) -> str:
    """A report file as a standalone page. Images it names (`chart.png`, `/outputs/chart.png`,
    `figs/a.png`) are looked up among the same thread's python outputs and embedded as data: URIs;
    anything else (other hosts, other threads, paths with '..') is dropped."""
    text = read_regular(path, MAX_VIEW_BYTES).decode("utf-8", "replace")
    by_name: dict[str, Artifact] = {}
    for other in sorted(rt.artifacts.list(handle), key=lambda a: a.created):
        if other.origin.source == "python" and other.origin.filename and other.format in INLINE_IMAGES \
                and other.available:
            by_name[other.origin.filename] = other  # the newest file of that name wins
    budget = MAX_EMBED_BYTES

    def img_src(src: str) -> str | None:
        nonlocal budget
        if src.startswith("data:image/") and not src.startswith("data:image/svg"):
            return src
        name = src.strip()
        for prefix in ("/outputs/", "./"):
            if name.startswith(prefix):
                name = name[len(prefix):]
        target = by_name.get(name)
        if target is None or ".." in name.split("/"):
            return None
        try:
            data = read_regular(rt.artifacts.data_path(handle, target), MAX_VIEW_BYTES)
        except OSError:  # swept or replaced meanwhile: the page shows the alt text
            return None
        if len(data) > budget:
            return None
        budget -= len(data)
        return data_uri(INLINE_IMAGES[target.format], data)

    name = art.origin.filename or art.file
    body = markdown_html(text, img_src=img_src) if art.format in ("md", "markdown") else sanitize(text, img_src=img_src)
    note = f"{name} · report from thread “{handle.meta.title}” · artifact {art.id} · sanitized copy, scripts removed"
    return report_page(name, body, note)


class ArtifactController(Controller):
    path = "/api"

    @get("/threads/{tid:str}/artifacts")
    async def list_artifacts(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> list[ArtifactOut]:
        handle = find_thread(rt, user, tid)
        return [artifact_out(rt, handle.id, a) for a in rt.artifacts.list(handle)]

    @get("/artifacts/{aid:str}")
    async def get_artifact(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> ArtifactOut:
        handle, art = find_artifact(rt, user, aid)
        return artifact_out(rt, handle.id, art)

    @get("/artifacts/{aid:str}/download")
    async def download(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                       format: FromQuery[str | None] = None) -> Stream:
        handle, art, path = _data_file(rt, user, aid)
        rt.artifacts.touch(handle, [aid])
        if format not in (None, "csv", "parquet", "original"):
            raise ClientException(f"unknown format {format!r}: use csv or parquet (default: as stored)")
        if format == "csv":
            if art.format != "parquet":
                raise ClientException(f"artifact {aid} is {art.format}, not a table: CSV is not available")
            body, name, media = _csv_chunks(str(path)), f"{aid}.csv", "text/csv; charset=utf-8"
        else:
            body, name, media = _file_chunks(str(path)), art.file, art.media_type
        return Stream(body, media_type=media, headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",
            "Cache-Control": "private, no-store",
        })

    @get("/artifacts/{aid:str}/view")
    async def view(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> Response[bytes]:
        """Show an artifact in the browser: raster images inline (charts), Markdown and HTML reports
        as a sanitized, printable page with their charts embedded; anything else is a download."""
        handle, art, path = _data_file(rt, user, aid)
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        if art.format in INLINE_IMAGES:
            data = await asyncio.to_thread(read_regular, path, MAX_VIEW_BYTES)
            return Response(data, media_type=INLINE_IMAGES[art.format],
                            headers={**headers, "Content-Security-Policy": "sandbox; default-src 'none'"})
        if art.format not in REPORT_FORMATS:
            raise HTTPException(status_code=415, detail=(
                f"artifact {aid} is {art.format}: it cannot be shown in the browser, download it instead "
                f"(/api/artifacts/{aid}/download)"))
        page = await asyncio.to_thread(_report_page, rt, handle, art, path)
        rt.artifacts.touch(handle, [aid])
        return Response(page.encode(), media_type="text/html; charset=utf-8",
                        headers={**headers, "Content-Security-Policy": SANDBOX_CSP})

    @post("/artifacts/{aid:str}/requery", status_code=200)
    async def requery(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """Restore an expired artifact by re-running its origin call (read-only tools only)."""
        handle, _ = find_artifact(rt, user, aid)
        return await rt.user_requery.run(handle, user, aid)

    @post("/threads/{tid:str}/uploads", status_code=201, request_max_body_size=None)
    async def upload(self, tid: FromPath[str], request: Request, user: CurrentUser,
                     rt: RuntimeDep) -> dict[str, Any]:
        """A file (CSV, TSV, Excel, Parquet, JSON, image) streamed into the thread as an artifact."""
        handle = find_thread(rt, user, tid)
        ctype, options = multipart.parse_options_header(request.headers.get("content-type", ""))
        if ctype != "multipart/form-data" or not options.get("boundary"):
            raise ClientException("send the file as multipart/form-data with a 'file' field")
        limit = rt.settings.offload.upload_max_bytes
        art = await rt.attachments.upload(
            handle, user, lambda fd: _receive_file(request, options["boundary"], fd, limit))
        return {"artifact": msgspec.to_builtins(artifact_out(rt, handle.id, art))}


async def _receive_file(request: Request, boundary: str, fd: int, limit: int) -> str:
    """Stream the 'file' part of a multipart body into `fd`; returns its file name."""
    parser = multipart.PushMultipartParser(boundary, max_segment_count=8, max_header_size=8192)
    filename: str | None = None
    current: str | None = None
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in request.stream():
                for event in parser.parse(chunk):
                    if isinstance(event, multipart.MultipartSegment):
                        current = event.name
                        if current == "file":
                            if filename is not None:
                                raise ClientException("send one file per upload")
                            filename = os.path.basename(event.filename or "upload")[:200] or "upload"
                    elif isinstance(event, (bytes, bytearray)) and current == "file":
                        written += len(event)
                        if written > limit:
                            raise HTTPException(status_code=413, detail=(
                                f"the file is larger than the upload limit of {limit / 1e6:.0f} MB"))
                        out.write(event)
                    elif event is None:
                        current = None
            parser.close()
    except multipart.MultipartError as exc:
        raise ClientException(f"malformed multipart body: {exc}") from None
    if filename is None:
        raise ClientException("no 'file' field in the upload")
    if written == 0:
        raise ClientException(f"{filename}: the file is empty")
    return filename
