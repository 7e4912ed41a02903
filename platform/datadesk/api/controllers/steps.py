"""User steps: `POST /api/threads/{tid}/steps` runs one `sql_query` or `python` call on the
user's behalf, outside the model (chat/user_steps.py), and streams its events as SSE, the
same stream (and ids) `POST /messages` gives; `/events` re-attaches to it from another tab."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from datadesk.api.event_stream import stream_turn
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.chat.user_steps import MAX_INPUT_CHARS, StepRefused, run_user_step

MAX_STEP_BYTES = 4 * MAX_INPUT_CHARS + 64 * 1024  # the SQL or code (in JSON, escaped) and the rest


class NewStep(msgspec.Struct, forbid_unknown_fields=True):
    tool: str
    arguments: dict[str, Any]
    edited_from: str | None = None  # the call id of the card it was edited from
    background: bool | None = None  # as for a message: false, leaving the stream cancels the step


class StepController(Controller):
    path = "/api/threads"

    @post("/{tid:str}/steps", status_code=200, request_max_body_size=MAX_STEP_BYTES,
          opt={"stream": True, "strict_query": True})
    async def run_step(self, tid: FromPath[str], data: JSONBody[NewStep], user: CurrentUser,
                       rt: RuntimeDep) -> Stream:
        handle = find_thread(rt, user, tid)
        background = rt.settings.chat.finish_in_background if data.background is None else data.background
        try:
            turn = await run_user_step(rt.turn_services, rt.turns, handle, user, data.tool, data.arguments,
                                       data.edited_from, background)
        except StepRefused as exc:
            raise HTTPException(status_code=exc.status, detail=str(exc)) from None
        return await stream_turn(rt, handle, user.id, turn, None if background else turn)
