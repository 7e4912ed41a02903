"""Artifact endpoints: list, read, download, re-query, uploads (streamed multipart) and the
re-import of a CSV/TSV upload with the analyst's reading options."""

from __future__ import annotations

import asyncio
import os
import re
import unicodedata
import weakref
from pathlib import Path
from urllib.parse import quote as url_quote
from typing import Any, Iterator

import msgspec
import multipart
from litestar import Controller, Request, get, post
from litestar.exceptions import ClientException, HTTPException
from litestar.params import FromPath, FromQuery
from litestar.response import Response, Stream

from datadesk.api.controllers.audit import client_of
from datadesk.api.guards.access import find_artifact, find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.render import data_uri, markdown_html, report_page, sanitize
from datadesk.api.guards.security import SANDBOX_CSP
from datadesk.composition import Runtime
from datadesk.domain.artifacts import Artifact
from datadesk.domain.ids import check_id
from datadesk.domain.users import User
from datadesk.offload.grid.csv_download import FORMULA_PARAM, CSVError, keep_formulas, parquet_csv
from datadesk.offload.grid.pages import Column, GridError, GridLimit, GridReader, GridView, parse_request
from datadesk.offload.artifacts.expired import expired_message
from datadesk.offload.artifacts.store import regular_file
from datadesk.offload.readers.csv.dialect import ChoiceError, ReadChoices
from datadesk.offload.readers.csv.encoding import ENCODINGS
from datadesk.sandbox.files import read_regular
from datadesk.sources.sqllimits import SQLLimits
from datadesk.store.files import not_saved
from datadesk.store.threads import Thread
from datadesk.threads.provenance import artifact_question
from datadesk.threads.titles import upload_title


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
    partial_by: str | None = None  # "source": the source itself cut the result
    shape: str | None = None  # what the source sent ("Python repr of a list of dicts", ...)
    name: str | None = None  # an upload's file name, with its sheet ("sales.xlsx — Q1")
    reading: dict[str, Any] | None = None  # how an upload was read (CSV dialect, sheet layout)
    can_reimport: bool = False  # a CSV/TSV upload whose original is kept: POST .../reimport
    title: str | None = None  # a chart's title (of the figure or the Vega-Lite spec)
    dark_variant: str | None = None  # a figure's dark-theme rendering (an artifact of its own)
    variant_of: str | None = None  # the figure a dark-theme rendering is of


def artifact_out(rt: Runtime, thread_id: str, art: Artifact) -> ArtifactOut:
    tool = rt.tools.get(art.origin.tool or "", art.origin.workspace) if art.origin.source == "tool" else None
    expires = art.last_used + rt.settings.offload.ttl_s if art.is_cache and art.available else None
    return ArtifactOut(
        id=art.id, thread=thread_id, kind=art.kind, format=art.format, status=art.status, rows=art.rows,
        columns=art.columns, schema=[{"name": c.name, "type": c.type} for c in art.schema], bytes=art.bytes,
        created=art.created, last_used=art.last_used, expires_at=expires, expired_at=art.expired_at,
        sandbox_path=art.sandbox_path, origin=msgspec.to_builtins(art.origin),
        can_requery=bool(tool and tool.spec.read_only), partial_reason=art.partial_reason,
        partial_by=art.partial_by, shape=art.shape, name=art.name, reading=art.reading,
        can_reimport=bool(art.original) and art.available,
        title=art.title, dark_variant=art.dark_variant, variant_of=art.variant_of,
    )


def data_file(rt: Runtime, user: User, aid: str) -> tuple[Thread, Artifact, Path]:
    """An artifact whose data file can be read (410 naming why when it cannot)."""
    handle, art = find_artifact(rt, user, aid)
    if not art.available:
        raise HTTPException(status_code=410, detail=expired_message(art))
    path = rt.artifacts.data_path(handle, art)
    if not regular_file(path):
        raise HTTPException(status_code=410, detail=f"the data file of artifact {aid} is missing")
    return handle, art, path


def _formulas(request: Request) -> bool:
    """Whether the CSV keeps formula-like text cells as they are (`formulas=keep`); 400 naming
    the parameter for anything but keep or escape."""
    try:
        return keep_formulas(request.query_params.getall(FORMULA_PARAM, []))
    except ValueError as exc:
        raise ClientException(str(exc), extra={"param": FORMULA_PARAM}) from None


async def _parquet_csv(path: Path, aid: str, keep: bool) -> Iterator[bytes]:
    """The CSV of a Parquet artifact, its first batch already encoded (422 naming why it cannot be)."""
    try:
        return await asyncio.to_thread(parquet_csv, path, f"artifact {aid}", keep)
    except CSVError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None


_FROM = re.compile(r"\bfrom\s+([A-Za-z_][\w.]*)", re.IGNORECASE)
_YEAR = re.compile(r"\b(19|20)\d{2}\b")
GENERIC_TITLES = {"", "new chat"}


def _slug(text: str, ascii_only: bool) -> str:
    if ascii_only:
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w.-]+" if not ascii_only else r"[^A-Za-z0-9.-]+", "_", text)
    return re.sub(r"[._-]{2,}", "_", text).strip("._-").lower()[:80].rstrip("._-")


def download_stem(title: str, art: Artifact) -> str:
    """A file name (no extension) for an artifact: the file's own name (uploads, code outputs),
    else the thread's title, else the table the query reads (`readings_2024`), else the id."""
    if art.origin.filename:
        stem = Path(art.origin.filename).stem
        return f"{stem}_{art.origin.sheet}" if art.origin.sheet else stem
    if title.strip().lower() not in GENERIC_TITLES:
        return title
    sql = ""
    if art.origin.arguments:
        try:
            args = msgspec.json.decode(art.origin.arguments.encode())
            sql = str(args.get("sql") or args.get("query") or "") if isinstance(args, dict) else ""
        except msgspec.DecodeError:
            sql = ""
    table = _FROM.search(sql)
    if table:
        year = _YEAR.search(sql)
        return table.group(1).split(".")[-1] + (f"_{year.group(0)}" if year else "")
    return f"{art.origin.tool}_result" if art.origin.tool else art.id


def attachment_header(stem: str, ext: str, fallback: str) -> str:
    """Content-Disposition with a safe ASCII name and the UTF-8 one (RFC 6266 filename*)."""
    plain = _slug(stem, ascii_only=True) or fallback
    wide = _slug(stem, ascii_only=False) or plain
    suffix = f".{ext}" if ext else ""
    return f"attachment; filename=\"{plain}{suffix}\"; filename*=UTF-8''{url_quote(wide + suffix, safe='')}"


def _file_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(1 << 20), b"")


INLINE_IMAGES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
                 "webp": "image/webp"}  # never SVG: it can carry script
REPORT_FORMATS = {"md", "markdown", "html", "htm"}
MAX_VIEW_BYTES = 20 << 20
MAX_EMBED_BYTES = 30 << 20  # all images embedded in one report page


def report_file_page(rt: Runtime, handle: Thread, art: Artifact, path: Path) -> str:
    """A report file as a standalone page. Images it names (`chart.png`, `/outputs/chart.png`,
    `figs/a.png`) are looked up among the same thread's python outputs and embedded as data: URIs;
    anything else (other hosts, other threads, paths with '..') is dropped. Reads only (a shared
    thread's reader gets the same page, api/sharing/controller.py)."""
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


try:  # query slots per user and per process (store/admission.py), where this version has them
    from datadesk.store.admission import Busy
except ImportError:  # pragma: no cover
    class Busy(Exception):  # type: ignore[no-redef]
        pass

GRID_FORMATS = {"parquet", "csv", "tsv"}  # what the grid reads (offload/grid/pages.py)
_READERS: "weakref.WeakKeyDictionary[Runtime, GridReader]" = weakref.WeakKeyDictionary()


def grid_reader(rt: Runtime) -> GridReader:
    """The runtime's grid reader (one per runtime: it caches counts and schemas)."""
    reader = _READERS.get(rt)
    if reader is None:
        s = rt.settings
        reader = _READERS[rt] = GridReader(SQLLimits.from_settings(s.limits, rt.layout.home), s.sql.timeout_s,
                                           s.offload.stream_timeout_s)
    return reader


async def grid_slot(rt: Runtime, user: User) -> Any:
    """A query slot (limits.sql_queries_per_user / sql_queries) for one grid query; 503 naming the
    limit when none came free within limits.sql_queue_s (as for SQL, api/errors.py)."""
    slots = getattr(rt, "query_slots", None)
    if slots is None:
        return None
    try:
        return await slots.acquire(user.id, "table query")
    except Busy as exc:
        raise HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": "2"}) from None


def release_slot(slot: Any) -> None:
    if slot is not None:
        slot.release()


async def _grid_page(rt: Runtime, user: User, path: Path, columns: list[Column], view: GridView,
                     offset: int, limit: int) -> dict[str, Any]:
    """One grid query under a query slot: 400 naming a bad parameter, 422 at a time or memory bound."""
    slot = await grid_slot(rt, user)
    try:
        return await asyncio.to_thread(grid_reader(rt).page, path, columns, view, offset, limit)
    except GridError as exc:
        raise ClientException(str(exc), extra={"param": exc.param}) from None
    except GridLimit as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    finally:
        release_slot(slot)


async def _grid_request(rt: Runtime, user: User, aid: str, request: Request,
                        paging: bool) -> tuple[Thread, Artifact, Path, list[Column], Any, int, int]:
    """The table behind `aid` and the view the query parameters ask for (400 naming a bad one)."""
    handle, art, path = data_file(rt, user, aid)
    if art.format not in GRID_FORMATS:
        raise ClientException(f"artifact {aid} is {art.format}, not a table: it has no rows to show")
    params = {k: request.query_params.getall(k) for k in request.query_params
              if paging or k != FORMULA_PARAM}  # formulas=: the CSV's, read by rows_csv
    try:
        columns = await asyncio.to_thread(grid_reader(rt).columns, path)
        view, offset, limit = parse_request(params, columns, paging=paging)
    except GridError as exc:
        raise ClientException(str(exc), extra={"param": exc.param}) from None
    except GridLimit as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return handle, art, path, columns, view, offset, limit


async def _grid_csv_check(rt: Runtime, user: User, path: Path, columns: list[Column], view: GridView,
                          keep: bool) -> None:
    """Before a grid CSV starts, under a query slot: its columns and first rows are written to
    nowhere, so what fails (busy: 503, a filter value its column cannot hold: 400, a table that
    cannot be read or written: 422) is a status now, not an empty 200 stream later."""
    slot = await grid_slot(rt, user)
    try:
        await asyncio.to_thread(grid_reader(rt).csv_check, path, columns, view, keep)
    except GridError as exc:
        raise ClientException(str(exc), extra={"param": exc.param}) from None
    except (GridLimit, CSVError) as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    finally:
        release_slot(slot)


def _csv_view(rt: Runtime, user: User, path: Path, columns: list[Column], view: Any,
              keep: bool) -> Iterator[bytes]:
    """The CSV stream; it takes its query slot when it starts (in the worker thread that reads it),
    so a response that is never read holds none."""
    slots = getattr(rt, "query_slots", None)
    slot = slots.acquire_blocking(user.id, "table download") if slots is not None else None
    try:
        yield from grid_reader(rt).csv(path, columns, view, keep)
    finally:
        release_slot(slot)


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
    async def download(self, aid: FromPath[str], request: Request, user: CurrentUser, rt: RuntimeDep,
                       format: FromQuery[str | None] = None) -> Stream:
        """The artifact's file, or with `format=csv` a table as CSV (`formulas=keep|escape`)."""
        handle, art, path = data_file(rt, user, aid)
        rt.artifacts.touch(handle, [aid])
        if format not in (None, "csv", "parquet", "original"):
            raise ClientException(f"unknown format {format!r}: use csv or parquet (default: as stored)")
        keep = _formulas(request)
        if format != "csv" and FORMULA_PARAM in request.query_params:
            raise ClientException(f"{FORMULA_PARAM}: applies to format=csv only (a file is sent as stored)",
                                  extra={"param": FORMULA_PARAM})
        if format == "csv":
            if art.format != "parquet":
                raise ClientException(f"artifact {aid} is {art.format}, not a table: CSV is not available")
            body, ext, media = await _parquet_csv(path, aid, keep), "csv", "text/csv; charset=utf-8"
        else:
            body, ext, media = _file_chunks(str(path)), Path(art.file).suffix.lstrip("."), art.media_type
        rt.audit.record("download", user=user.id, workspace=art.origin.workspace, thread=handle.id, target=aid,
                        rows=art.rows, bytes=None if format == "csv" else art.bytes, detail=format or art.format,
                        client=client_of(request))
        return Stream(body, media_type=media, headers={
            "Content-Disposition": attachment_header(download_stem(handle.meta.title, art), ext, aid),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",
            "Cache-Control": "private, no-store",
        })

    @get("/artifacts/{aid:str}/rows")
    async def rows(self, aid: FromPath[str], request: Request, user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """A page of a table artifact's full data for the grid: `offset`, `limit` (1-1000), `sort`
        (`column:asc|desc`, up to 3) and `filter` (a JSON list of {column, op, value}; ops
        contains, =, !=, <, <=, >, >=, between, in, is null, not null: offload/grid/view.py).
        Counts are of the rows matching the filters. The first page (offset 0) carries the
        `question` that produced the artifact (the grid's title), null when none is known."""
        handle, art, path, columns, view, offset, limit = await _grid_request(rt, user, aid, request, True)
        page = await _grid_page(rt, user, path, columns, view, offset, limit)
        rt.artifacts.touch(handle, [aid])
        out = {"artifact": aid, "thread": handle.id, "total_rows": art.rows,
               "name": _slug(download_stem(handle.meta.title, art), True), **page}
        if offset == 0:
            out["question"] = await asyncio.to_thread(artifact_question, handle, art)
        return out

    @get("/artifacts/{aid:str}/rows.csv")
    async def rows_csv(self, aid: FromPath[str], request: Request, user: CurrentUser, rt: RuntimeDep) -> Stream:
        """Every row of the grid's current view (same `sort` and `filter` as /rows) as CSV;
        `formulas=keep` writes formula-like text cells without the leading `'`."""
        handle, art, path, columns, view, _, _ = await _grid_request(rt, user, aid, request, False)
        keep = _formulas(request)
        await _grid_csv_check(rt, user, path, columns, view, keep)
        rt.artifacts.touch(handle, [aid])
        stem = download_stem(handle.meta.title, art) + ("_view" if view.sort or view.filters else "")
        rt.audit.record("download", user=user.id, workspace=art.origin.workspace, thread=handle.id, target=aid,
                        rows=art.rows if not view.filters else None, client=client_of(request),
                        detail="csv of the table view" + (" (filtered)" if view.filters else ""))
        return Stream(_csv_view(rt, user, path, columns, view, keep), media_type="text/csv; charset=utf-8",
                      headers={"Content-Disposition": attachment_header(stem, "csv", aid),
                               "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox",
                               "Cache-Control": "private, no-store"})

    @get("/artifacts/{aid:str}/view")
    async def view(self, aid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> Response[bytes]:
        """Show an artifact in the browser: raster images inline (charts), a Vega-Lite chart as its
        spec (JSON), Markdown and HTML reports as a sanitized, printable page with their charts
        embedded; anything else is a download."""
        handle, art, path = data_file(rt, user, aid)
        headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}
        if art.format in INLINE_IMAGES:
            data = await asyncio.to_thread(read_regular, path, MAX_VIEW_BYTES)
            return Response(data, media_type=INLINE_IMAGES[art.format],
                            headers={**headers, "Content-Security-Policy": "sandbox; default-src 'none'"})
        if art.format == "vega-lite":  # the spec, for the chat's renderer (web/js/charts.js)
            data = await asyncio.to_thread(read_regular, path, MAX_VIEW_BYTES)
            return Response(data, media_type="application/json",
                            headers={**headers, "Content-Security-Policy": "sandbox; default-src 'none'"})
        if art.format not in REPORT_FORMATS:
            raise HTTPException(status_code=415, detail=(
                f"artifact {aid} is {art.format}: it cannot be shown in the browser, download it instead "
                f"(/api/artifacts/{aid}/download)"))
        page = await asyncio.to_thread(report_file_page, rt, handle, art, path)
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
        got: dict[str, int] = {}
        upload = await rt.attachments.upload(
            handle, user, lambda fd: _receive_file(request, options["boundary"], fd, limit, got))
        arts = [msgspec.to_builtins(artifact_out(rt, handle.id, a)) for a in upload.artifacts]
        out: dict[str, Any] = {"artifact": arts[0], "artifacts": arts,
                               "skipped_sheets": [{"sheet": n, "why": w} for n, w in upload.skipped]}
        title = upload_title(handle.meta.title, upload.artifacts[0].origin.filename)
        if title:  # a chat started with an upload is named after its file (threads/titles.py)
            rt.threads.touch(handle, title=title)
        out["thread_title"] = handle.meta.title
        warning = upload_warning(upload.artifacts[0], got.get("bytes", 0))
        if warning:
            out["warning"] = warning
        return out

    @post("/threads/{tid:str}/artifacts/{aid:str}/reimport", status_code=200)
    async def reimport(self, tid: FromPath[str], aid: FromPath[str], request: Request, user: CurrentUser,
                       rt: RuntimeDep) -> dict[str, Any]:
        """Read a CSV/TSV upload's kept original again with the options of the JSON body
        (`delimiter`, `decimal`, `thousands`, `header_row`, `encoding`; any left out is sniffed
        again) and replace the artifact's data in place (same id). 400 naming a bad field."""
        handle = find_thread(rt, user, tid)
        check_id(aid, "artifact")
        raw = await request.body()
        try:
            body = msgspec.json.decode(raw) if raw.strip() else {}
        except msgspec.DecodeError as exc:
            raise ClientException(f"body: not JSON ({exc})", extra={"field": "body"}) from None
        try:
            choices = ReadChoices.parse(body, ENCODINGS)
        except ChoiceError as exc:
            raise ClientException(str(exc), extra={"field": exc.field}) from None
        upload = await rt.attachments.reimport(handle, user, aid, choices)
        art = upload.artifacts[0]
        out: dict[str, Any] = {"artifact": msgspec.to_builtins(artifact_out(rt, handle.id, art))}
        warning = upload_warning(art, art.original_bytes)
        if warning:
            out["warning"] = warning
        return out


SUSPICIOUS_BYTES_PER_CELL = 2_000  # more bytes per parsed cell than this: the file likely parsed wrong


def upload_warning(art: Artifact, size: int) -> str | None:
    """A warning when a table upload parsed into suspiciously few rows or columns for its size
    (a malformed CSV read as one row, a wrong delimiter read as one column)."""
    if art.format != "parquet" or art.rows is None or art.columns is None or size < 512:
        return None
    rows, cols = art.rows, art.columns
    if rows > 1 and rows * cols and size / (rows * cols) <= SUSPICIOUS_BYTES_PER_CELL:
        return None
    name = art.origin.filename or "the file"
    return (f"{name} ({size:,} bytes) was read as only {rows:,} row{'s' if rows != 1 else ''} x {cols} "
            f"column{'s' if cols != 1 else ''}: check its delimiter, header and quoting (a malformed file "
            "can parse into one row or one column)")


async def _receive_file(request: Request, boundary: str, fd: int, limit: int,
                        got: dict[str, int] | None = None) -> str:
    """Stream the 'file' part of a multipart body into `fd`; returns its file name."""
    parser = multipart.PushMultipartParser(boundary, max_segment_count=8, max_header_size=8192)
    filename: str | None = None
    current: str | None = None
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:  # closed on every way out: a failed upload holds no space
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
    except OSError as exc:  # the disk filled up while the file arrived (the caller removes the temp file)
        error = not_saved(exc, f"the upload {filename or 'file'}")
        if error is None:
            raise
        raise error from None
    if filename is None:
        raise ClientException("no 'file' field in the upload")
    if written == 0:
        raise ClientException(f"{filename}: the file is empty")
    if got is not None:
        got["bytes"] = written
    return filename
