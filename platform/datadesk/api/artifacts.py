"""Artifact endpoints: list, read, download, re-query, and uploads (streamed multipart)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
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

from datadesk.api.auth import CurrentUser, RuntimeDep
from datadesk.api.render import data_uri, markdown_html, report_page, sanitize
from datadesk.api.security import SANDBOX_CSP
from datadesk.api.threads import find_thread
from datadesk.chat.runtime import Runtime
from datadesk.domain.artifacts import Artifact, ArtifactOrigin
from datadesk.domain.ids import check_id, new_id
from datadesk.domain.records import Record, ToolCall
from datadesk.domain.users import User
from datadesk.llm.tokens import count_tokens
from datadesk.offload import preview
from datadesk.offload.requery import expired_message
from datadesk.offload.store import artifacts_dir, regular_file
from datadesk.sandbox.files import read_regular
from datadesk.offload.uploads import IMAGES, UploadError, ingest_upload
from datadesk.store.threads import ThreadHandle
from datadesk.tools.registry import ToolContext, ToolError


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


def tool_context(rt: Runtime, user: User, handle: ThreadHandle, call_id: str = "") -> ToolContext:
    return ToolContext(workspace=handle.meta.workspace, user=user.id, thread=handle.id,
                       permissions=user.permission_set, workspace_dir=rt.layout.workspace_dir(handle.meta.workspace),
                       thread_dir=handle.dir, call_id=call_id)


def _find(rt: Runtime, user: User, aid: str) -> tuple[ThreadHandle, Artifact]:
    check_id(aid, "artifact")
    tdir, art = rt.artifacts.find(aid, user.id, user.workspaces)
    return rt.threads.get(tdir.name, user.id, user.workspaces), art


def _data_file(rt: Runtime, user: User, aid: str) -> tuple[ThreadHandle, Artifact, Path]:
    """An artifact whose data file can be read (410 naming why when it cannot)."""
    handle, art = _find(rt, user, aid)
    if not art.available:
        raise HTTPException(status_code=410, detail=expired_message(art))
    path = rt.artifacts.data_path(handle.dir, art)
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


def _report_page(rt: Runtime, handle: ThreadHandle, art: Artifact, path: Path) -> str:
    """A report file as a standalone page. Images it names (`chart.png`, `/outputs/chart.png`,
    `figs/a.png`) are looked up among the same thread's python outputs and embedded as data: URIs;
    anything else (other hosts, other threads, paths with '..') is dropped."""
    text = read_regular(path, MAX_VIEW_BYTES).decode("utf-8", "replace")
    by_name: dict[str, Artifact] = {}
    for other in sorted(rt.artifacts.list(handle.dir), key=lambda a: a.created):
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
            data = read_regular(rt.artifacts.data_path(handle.dir, target), MAX_VIEW_BYTES)
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
        return [artifact_out(rt, handle.id, a) for a in rt.artifacts.list(handle.dir)]

    @get("/artifacts/{aid:str}")
    async def get_artifact(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> ArtifactOut:
        handle, art = _find(rt, user, aid)
        return artifact_out(rt, handle.id, art)

    @get("/artifacts/{aid:str}/download")
    async def download(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                       format: FromQuery[str | None] = None) -> Stream:
        handle, art, path = _data_file(rt, user, aid)
        rt.artifacts.touch(handle.dir, [aid])
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
        rt.artifacts.touch(handle.dir, [aid])
        return Response(page.encode(), media_type="text/html; charset=utf-8",
                        headers={**headers, "Content-Security-Policy": SANDBOX_CSP})

    @post("/artifacts/{aid:str}/requery", status_code=200)
    async def requery(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        handle, art = _find(rt, user, aid)
        turn = rt.turns.reserve(handle.id, user.id)  # 409 while a turn runs on the thread
        try:
            call_id = new_id("call_")
            try:
                report = await rt.requery.requery(handle.dir, aid, tool_context(rt, user, handle, call_id))
            except ToolError as exc:
                raise ClientException(str(exc)) from None
            args = msgspec.json.encode({"artifact_id": aid}).decode()
            log = handle.log
            log.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), turn_id=turn.turn_id,
                                          tool_calls=[ToolCall(call_id, "requery_artifact", args)],
                                          meta={"via": "api"}))
            log.append(lambda seq: Record(seq=seq, role="tool", ts=time.time(), turn_id=turn.turn_id,
                                          tool_call_id=call_id, name="requery_artifact",
                                          content=msgspec.json.encode(report).decode(),
                                          meta={"via": "api", "requery": report}))
            return report
        finally:
            rt.turns.release(turn)

    @post("/threads/{tid:str}/uploads", status_code=201, request_max_body_size=None)
    async def upload(self, tid: FromPath[str], request: Request, user: CurrentUser,
                     rt: RuntimeDep) -> dict[str, Any]:
        handle = find_thread(rt, user, tid)
        ctype, options = multipart.parse_options_header(request.headers.get("content-type", ""))
        if ctype != "multipart/form-data" or not options.get("boundary"):
            raise ClientException("send the file as multipart/form-data with a 'file' field")
        limit = rt.settings.offload.upload_max_bytes
        turn = rt.turns.reserve(handle.id, user.id)
        tmp_path = None
        try:
            adir = artifacts_dir(handle.dir)
            adir.mkdir(parents=True, exist_ok=True)
            fd, tmp_path = tempfile.mkstemp(prefix=".upload-", suffix=".tmp", dir=adir)
            filename = await _receive_file(request, options["boundary"], fd, limit)
            origin = ArtifactOrigin(source="upload", user=user.id, thread=handle.id,
                                    workspace=handle.meta.workspace, filename=filename)
            try:
                art, head, schema = await asyncio.to_thread(
                    ingest_upload, rt.offload, handle.dir, Path(tmp_path), filename, origin)
            except UploadError as exc:
                raise ClientException(str(exc)) from None
            tmp_path = None
            rt.quota.after_create(handle.meta.workspace, user.id, handle.dir, art)
            _record_upload(rt, user, handle, turn.turn_id, art, head, schema, filename)
            return {"artifact": msgspec.to_builtins(artifact_out(rt, handle.id, art))}
        finally:
            rt.turns.release(turn)
            if tmp_path and os.path.exists(tmp_path):
                os.unlink(tmp_path)


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


def _record_upload(rt: Runtime, user: User, handle: ThreadHandle, turn_id: str, art: Artifact,
                   head: pa.Table | None, schema: pa.Schema | None, filename: str) -> None:
    """Tell the model about the upload in the same preview form as an offloaded result."""
    text = upload_note(rt, user, handle, art, head, schema, filename)
    handle.log.append(lambda seq: Record(seq=seq, role="user", ts=time.time(), turn_id=turn_id, content=text,
                                         meta={"kind": "upload", "artifact": art.id, "filename": filename,
                                               "image": art.format in IMAGES}))


def upload_note(rt: Runtime, user: User, handle: ThreadHandle, art: Artifact, head: pa.Table | None,
                schema: pa.Schema | None, filename: str) -> str:
    """The upload in the same preview form as an offloaded result (what the model reads)."""
    specs = rt.permitted_tools(user, handle.meta.workspace)
    cap = rt.offload_capability(user, handle.meta.workspace, specs)
    s = rt.settings.offload
    if art.format in IMAGES:
        text = f"[The user uploaded an image: {filename} (artifact {art.id}, {preview.human_bytes(art.bytes)})]"
    else:
        text = f"[The user uploaded a file: {filename}]\n" + preview.render_table_artifact(
            art, schema, head, f"upload {filename!r}", count_tokens,
            s.max_tokens, s.preview_rows, s.preview_cell_chars, s.max_columns)
        if not cap.can_offload:
            text += (f"\nNOTE: the python tool is not available ({cap.reason}), so the full file cannot be "
                     "read in this chat; only the preview above is visible. Say so if asked for statistics.")
    return text
