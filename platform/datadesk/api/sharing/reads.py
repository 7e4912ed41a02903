"""What a shared thread shows its readers (api/sharing/controller.py): the records as the owner
sees them, rendered, with every artifact URL pointing through the share; the artifacts listed
read-only; the report page; a grid page of a table. Reads only: nothing here writes to the
owner's thread (not even an artifact's last-used time)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from litestar.exceptions import ClientException, HTTPException

from datadesk.api.controllers.artifacts import artifact_out, grid_reader
from datadesk.api.controllers.threads import record_views
from datadesk.api.report.page import report_json
from datadesk.domain.artifacts import Artifact
from datadesk.domain.branches import active_newest_first
from datadesk.domain.ids import check_id
from datadesk.domain.shares import Share
from datadesk.offload.artifacts.expired import expired_message
from datadesk.offload.artifacts.store import regular_file
from datadesk.offload.grid.pages import GridError, GridLimit, parse_request
from datadesk.threads.report.view import report_items

SHARED_RECORDS = 500  # the newest records of the active branch a shared view shows
HIDDEN_FIELDS = ("provider_fields",)  # the model's raw reply fields (reasoning) stay the owner's


def share_urls(text: str, sid: str) -> str:
    """Artifact URLs in rendered HTML, pointed through the share (`/api/shares/{sid}/artifacts/...`)."""
    return text.replace('"/api/artifacts/', f'"/api/shares/{sid}/artifacts/')


def shared_view(rt: Any, share: Share, thread: Any) -> dict[str, Any]:
    """The records (newest SHARED_RECORDS of the active branch, oldest first) and artifacts."""
    records = []
    for rec in active_newest_first(thread.log.newest_first()):
        records.append(rec)
        if len(records) > SHARED_RECORDS:
            break
    has_more = len(records) > SHARED_RECORDS
    records = records[:SHARED_RECORDS][::-1]
    arts = rt.artifacts.list(thread)
    views = record_views(records, [a.id for a in arts])
    for view in views:
        for name in HIDDEN_FIELDS:
            view.pop(name, None)
        if view.get("html"):
            view["html"] = share_urls(view["html"], share.id)
    listed = [msgspec.structs.replace(artifact_out(rt, thread.id, a), can_requery=False, can_reimport=False)
              for a in arts]
    return {"records": views, "artifacts": msgspec.to_builtins(listed), "has_more": has_more}


def shared_report(rt: Any, share: Share, thread: Any) -> dict[str, Any]:
    """The thread's report page as its owner's shows it (threads/report/view.py, its JSON as
    api/report/page.py shapes it), with the paragraphs' artifact URLs through the share."""
    view = report_json(report_items(thread, rt.artifacts, grid_reader(rt)))
    for item in view.get("items", []):
        if item.get("html"):
            item["html"] = share_urls(item["html"], share.id)
    return view


def table_file(rt: Any, thread: Any, aid: str) -> tuple[Artifact, Path]:
    """Artifact `aid` of the shared thread and its data file (404 when it is not the thread's,
    410 naming why when its data is gone)."""
    check_id(aid, "artifact")
    art = rt.artifacts.load(thread, aid)  # ArtifactNotFound: 404
    if not art.available:
        raise HTTPException(status_code=410, detail=expired_message(art))
    path = rt.artifacts.data_path(thread, art)
    if not regular_file(path):
        raise HTTPException(status_code=410, detail=f"the data file of artifact {aid} is missing")
    return art, path


async def grid_page(rt: Any, user: Any, thread: Any, aid: str, params: dict[str, list[str]]) -> dict[str, Any]:
    """A page of table `aid` for the read-only grid: the same parameters and answer as
    `/api/artifacts/{aid}/rows`, under one of the reader's query slots."""
    art, path = table_file(rt, thread, aid)
    if art.format not in ("parquet", "csv", "tsv"):
        raise ClientException(f"artifact {aid} is {art.format}, not a table: it has no rows to show")
    reader = grid_reader(rt)
    slot = await rt.query_slots.acquire(user.id, "table query")
    try:
        columns = await asyncio.to_thread(reader.columns, path)
        view, offset, limit = parse_request(params, columns, paging=True)
        page = await asyncio.to_thread(reader.page, path, columns, view, offset, limit)
    except GridError as exc:
        raise ClientException(str(exc), extra={"param": exc.param}) from None
    except GridLimit as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    finally:
        slot.release()
    return {"artifact": aid, "total_rows": art.rows, "name": aid, **page}
