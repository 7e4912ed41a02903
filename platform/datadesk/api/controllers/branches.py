"""Edit a question, regenerate an answer, and the branches they leave (issue 31, item 3).

- `POST /api/threads/{tid}/messages` with `"edit_of": <seq>`: the question at user record
  `seq` gets new text and the thread continues from there (threads.py calls `branch_meta`);
- `POST /api/threads/{tid}/regenerate` (`{"seq": <user seq>}`, default: the last question):
  the same question asked again, a new answer;
- `GET /api/threads/{tid}/branches`: every branch point and its branches ("‹ 2 / 2 ›");
- `GET /api/threads/{tid}/branches/{seq}`: the records of the branch that starts at user
  record `seq`, read-only (an earlier branch as it stood).
Both writes start a normal turn (the same lock: a running turn answers 409). The log stays
append-only: the record format is in domain/branches.py and docs/internals.md.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from datadesk.api.controllers.threads import record_views
from datadesk.api.event_stream import stream_turn
from datadesk.api.branch_checks import branch_meta, last_question
from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.offloop import run_off_loop
from datadesk.chat.loop import start_turn
from datadesk.domain.branches import branch_points, branch_records


class Regenerate(msgspec.Struct, forbid_unknown_fields=True):
    seq: int | None = None  # the user record whose answer is made again (default: the last one)
    background: bool | None = None


def _branches(handle: Any) -> dict[str, Any]:
    return {"thread": handle.id, "points": branch_points(list(handle.log))}


def _branch(rt: Any, handle: Any, seq: int) -> dict[str, Any]:
    records = branch_records(list(handle.log), seq)
    if records is None:
        raise NotFoundException(f"no branch starts at record #{seq} in thread {handle.id}")
    views = record_views(records, [a.id for a in rt.artifacts.list(handle)])
    return {"thread": handle.id, "seq": seq, "records": views}


class BranchController(Controller):
    path = "/api/threads/{tid:str}"

    @post("/regenerate", status_code=200, opt={"stream": True, "strict_query": True})
    async def regenerate(self, tid: FromPath[str], data: JSONBody[Regenerate], user: CurrentUser, rt: RuntimeDep,
                         request: Request) -> Stream:
        """The question asked again from where it stood: a new answer; the old one is kept."""
        handle = find_thread(rt, user, tid)
        seq = data.seq if data.seq is not None else await run_off_loop(user.id, last_question, handle)
        rec, meta = await run_off_loop(user.id, branch_meta, handle, seq, "regenerate")
        background = rt.settings.chat.finish_in_background if data.background is None else data.background
        turn = await start_turn(rt.turn_services, rt.turns, handle, user, rec.content, background, meta)
        return await stream_turn(rt, handle, user.id, turn, None if background else turn)

    @get("/branches")
    async def list_branches(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """Every branch point (`at`: the last seq its branches share) and its branches, oldest first."""
        handle = find_thread(rt, user, tid)
        return await run_off_loop(user.id, _branches, handle)

    @get("/branches/{seq:int}")
    async def get_branch(self, tid: FromPath[str], seq: FromPath[int], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The records of the branch starting at user record `seq` (read-only)."""
        handle = find_thread(rt, user, tid)
        return await run_off_loop(user.id, _branch, rt, handle, seq)
