"""Refresh a thread's analysis (threads/refresh.py).

- `POST /api/threads/{tid}/refresh`: start a refresh; the answer is its event stream (SSE, as
  `POST /messages`: `refresh.started`, `refresh.step`, `refresh.completed`, `done`), which any
  tab can follow again with `GET /api/threads/{tid}/events`. A running turn or refresh: 409;
  nothing to refresh (no saved query result): 400.
- `GET /api/threads/{tid}/refresh`: the last refresh's report (rows, schema and sum changes per
  step, the new versions of the files under /outputs); 404 when the thread was never refreshed.
- `PUT /api/threads/{tid}/schedule` `{"at": "07:30"}` or `{"cron": "0 7 * * 1-5"}`, optional
  `tz`: refresh the thread on that schedule (threads/schedule.py), as its owner; 400 naming the
  bad field. `GET` shows it (with `next_run` and what the last run did), `DELETE` removes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Controller, Request, delete, get, post, put
from litestar.exceptions import ClientException, NotFoundException
from litestar.params import FromPath
from litestar.response import Stream

from datadesk.api.event_stream import stream_turn
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.threads.refresh import NothingToRefresh, last_report
from datadesk.threads.schedule import ScheduleError

MAX_SCHEDULE_BYTES = 4096


class RefreshController(Controller):
    path = "/api/threads/{tid:str}/refresh"

    @post("/", status_code=200, opt={"stream": True, "strict_query": True})
    async def start_refresh(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> Stream:
        """Re-run the thread's queries and the python that used them; stream the progress."""
        handle = find_thread(rt, user, tid)
        try:
            turn = await rt.refresh.start(handle, user)
        except NothingToRefresh as exc:
            raise ClientException(str(exc)) from None
        return await stream_turn(rt, handle, user.id, turn, None)

    @get("/")
    async def get_refresh(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The last refresh's report."""
        handle = find_thread(rt, user, tid)
        report = await asyncio.to_thread(last_report, handle)
        if report is None:
            raise NotFoundException(f"thread {handle.id} has not been refreshed yet")
        return report


class ScheduleController(Controller):
    path = "/api/threads/{tid:str}/schedule"

    @put("/", status_code=200, request_max_body_size=MAX_SCHEDULE_BYTES)
    async def put_schedule(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
                           request: Request) -> dict[str, Any]:
        """Set (or replace) the thread's refresh schedule."""
        handle = find_thread(rt, user, tid)
        try:
            body = await request.json()
        except Exception:
            raise ClientException("body: not valid JSON; send {\"at\": \"07:30\"} or "
                                  "{\"cron\": \"0 7 * * 1-5\"}") from None
        try:
            return await asyncio.to_thread(rt.scheduler.put, handle, user, body)
        except ScheduleError as exc:
            raise ClientException(str(exc), extra={"field": exc.field}) from None

    @get("/")
    async def get_schedule(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        handle = find_thread(rt, user, tid)
        sched = await asyncio.to_thread(rt.scheduler.get, handle)
        if sched is None:
            raise NotFoundException(f"thread {handle.id} has no refresh schedule")
        return sched

    @delete("/", status_code=204)
    async def delete_schedule(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> None:
        handle = find_thread(rt, user, tid)
        if not await asyncio.to_thread(rt.scheduler.delete, handle):
            raise NotFoundException(f"thread {handle.id} has no refresh schedule")
