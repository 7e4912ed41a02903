"""The grid as an explorer (issue 32): a column's profile, a group-by and "chart this view" over
a table artifact's full data (offload/grid/explore.py, chart_step.py).

Each query runs off the event loop (a worker thread) under a query slot, on the grid's
locked-down DuckDB with its time and memory bounds: 400 naming a bad parameter, 422 at a bound,
503 when no slot came free, 404 for another user's artifact, 410 for an expired one. A shared
thread's reader gets the profile and the group-by through the share (`explore`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from litestar import Controller, Request, get
from litestar.exceptions import ClientException, HTTPException
from litestar.params import FromPath

from datadesk.api.controllers.artifacts import GRID_FORMATS, data_file, grid_reader, grid_slot, release_slot
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.composition import Runtime
from datadesk.domain.artifacts import Artifact
from datadesk.domain.users import User
from datadesk.offload.grid.chart_step import chart_code, describe
from datadesk.offload.grid.explore import group_by, parse_groups, parse_profile, profile
from datadesk.offload.grid.pages import Column, GridError, GridLimit, GridView
from datadesk.offload.grid.view import column_of, parse_filters
from datadesk.store.threads import Thread
from datadesk.threads.provenance import artifact_question


def _params(request: Request) -> dict[str, list[str]]:
    return {k: request.query_params.getall(k) for k in request.query_params}


def _bad(exc: GridError) -> ClientException:
    return ClientException(str(exc), extra={"param": exc.param})


async def _table(rt: Runtime, user: User, aid: str) -> tuple[Thread, Artifact, Path, list[Column]]:
    handle, art, path = data_file(rt, user, aid)
    return handle, art, path, await _columns(rt, art, path)


async def _columns(rt: Runtime, art: Artifact, path: Path) -> list[Column]:
    if art.format not in GRID_FORMATS:
        raise ClientException(f"artifact {art.id} is {art.format}, not a table: it has no columns to explore")
    try:
        columns = await asyncio.to_thread(grid_reader(rt).columns, path)
    except GridLimit as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return columns


async def _query(rt: Runtime, user: User, work: Callable[[], Any]) -> Any:
    """`work()` in a worker thread under a query slot (400 / 422 as for a grid page)."""
    slot = await grid_slot(rt, user)
    try:
        return await asyncio.to_thread(work)
    except GridError as exc:
        raise _bad(exc) from None
    except GridLimit as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    finally:
        release_slot(slot)


async def explore(rt: Runtime, user: User, art: Artifact, path: Path, params: Mapping[str, list[str]],
                  kind: Literal["profile", "groups"]) -> dict[str, Any]:
    """A column's profile or a group-by of table `art` (its data file `path`), under one of
    `user`'s query slots: the owner's endpoints here and a shared thread's reader
    (api/sharing/controller.py) get the same answer, limits and errors. Writes nothing."""
    columns = await _columns(rt, art, path)
    try:
        if kind == "profile":
            req = parse_profile(params, columns)
            out = await _query(rt, user, lambda: profile(grid_reader(rt), path, columns, req))
        else:
            groups = parse_groups(params, columns)
            out = await _query(rt, user, lambda: group_by(grid_reader(rt), path, columns, groups))
    except GridError as exc:
        raise _bad(exc) from None
    return {"artifact": art.id, **out}


def _chart_request(params: Mapping[str, list[str]], columns: list[Column]) -> tuple[GridView, Any, Column | None]:
    """The view of a chart request: a group-by when `by` is given, else `filter` and an optional
    `column` (the one to draw; `sort` is accepted and does not change a histogram)."""
    if params.get("by"):
        groups = parse_groups({k: v for k, v in params.items() if k != "column"}, columns)
        return groups.view, groups, None
    unknown = sorted(set(params) - {"filter", "column", "sort"})
    if unknown:
        raise GridError(unknown[0], "unknown parameter (use by, agg, sort, limit, filter, column)")
    by_name = {c.name: c for c in columns}
    names = [v for v in params.get("column", []) if v]
    if len(names) > 1:
        raise GridError("column", "give it once")
    col = column_of(by_name, names[0], "column") if names else None
    return GridView(filters=parse_filters(params.get("filter", []), by_name)), None, col


class GridExploreController(Controller):
    path = "/api/artifacts"

    @get("/{aid:str}/profile")
    async def column_profile(self, aid: FromPath[str], request: Request, user: CurrentUser,
                             rt: RuntimeDep) -> dict[str, Any]:
        """The profile of one column (`column`, `bins`, optional `filter` as for /rows): rows,
        nulls, distinct; min/max/mean and a histogram for numbers, a range and a histogram for
        dates, the most frequent values for text."""
        handle, art, path = data_file(rt, user, aid)
        out = await explore(rt, user, art, path, _params(request), "profile")
        rt.artifacts.touch(handle, [aid])
        return out

    @get("/{aid:str}/groups")
    async def groups(self, aid: FromPath[str], request: Request, user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The matching rows grouped `by` 1-3 columns (`col` or `col:hour|day|week|month|year`)
        with `agg` count | sum:<col> | mean:<col> per group; `sort`, `limit` (1-1000), `filter`."""
        handle, art, path = data_file(rt, user, aid)
        out = await explore(rt, user, art, path, _params(request), "groups")
        rt.artifacts.touch(handle, [aid])
        return out

    @get("/{aid:str}/chart-step")
    async def chart_step(self, aid: FromPath[str], request: Request, user: CurrentUser,
                         rt: RuntimeDep) -> dict[str, Any]:
        """The python step that charts the view (the parameters of /groups, or `filter` and
        `column`): the client runs it with POST /api/threads/{thread}/steps."""
        handle, art, _, columns = await _table(rt, user, aid)
        if not art.sandbox_path:
            raise ClientException(f"artifact {aid} has no path in the kernel: it cannot be charted by code")
        try:
            view, groups, col = _chart_request(_params(request), columns)
        except GridError as exc:
            raise _bad(exc) from None
        question = await asyncio.to_thread(artifact_question, handle, art)
        code = chart_code(aid, art.sandbox_path, question, columns, view, groups, col)
        return {"artifact": aid, "thread": handle.id, "tool": "python", "arguments": {"code": code},
                "view": describe(view, groups)}
