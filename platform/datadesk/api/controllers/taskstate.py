"""The thread's task state and summary state, for the context inspector and the chat.

- `GET /api/threads/{tid}/task-state`: the task state (the user's goal and standing
  constraints, each with its source) and the summary state (`off`, `none`, `ok`, `stale`,
  `failed` with the reason; and how far history left the request unsummarised);
- `POST /api/threads/{tid}/task-state`: the user pins a goal or constraint: one of their own
  messages (`{"seq": 5}`) or words they type (`{"text": "exclude holidays"}`);
- `DELETE /api/threads/{tid}/task-state/{item_id}`: the user withdraws an item.
The user's own words are the only source that needs no check: this is the user's request.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Controller, delete, get, post
from litestar.exceptions import ClientException, NotFoundException
from litestar.params import FromPath, JSONBody

from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.context.taskstate import TaskItemNotFound, TaskStateError
from datadesk.domain.ids import check_id


class PinItem(msgspec.Struct, forbid_unknown_fields=True):
    """A goal or constraint the user pins: one of their messages (`seq`) or their own `text`."""

    seq: int | None = None
    text: str | None = None
    kind: Literal["constraint", "goal"] = "constraint"


class TaskStateController(Controller):
    path = "/api/threads/{tid:str}/task-state"

    @get("/")
    async def get_task_state(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The thread's task state and its summary state."""
        return rt.requests.continuity(find_thread(rt, user, tid))

    @post("/", status_code=200)
    async def pin(self, tid: FromPath[str], data: JSONBody[PinItem], user: CurrentUser,
                  rt: RuntimeDep) -> dict[str, Any]:
        """Pin one of the user's messages, or typed words, as a goal or constraint of the thread."""
        handle = find_thread(rt, user, tid)
        if (data.seq is None) == (data.text is None):
            raise ClientException("give either `seq` (one of your messages) or `text`, not both")
        text, seq = data.text, data.seq
        if seq is not None:
            found = [r for r in handle.log.since(seq, seq) if r.seq == seq]
            if not found or found[0].role != "user":
                raise ClientException(f"record #{seq} is not one of your messages in this thread")
            text = found[0].content
        try:
            item = rt.task_state.note(handle, handle.meta.epoch, text or "", data.kind, "user", user_seq=seq)
        except TaskStateError as exc:
            raise ClientException(str(exc)) from None
        return {"item": msgspec.to_builtins(item), **rt.requests.continuity(handle)}

    @delete("/{item_id:str}", status_code=200)
    async def unpin(self, tid: FromPath[str], item_id: FromPath[str], user: CurrentUser,
                    rt: RuntimeDep) -> dict[str, Any]:
        """Withdraw a goal or constraint (it stays in the file, marked withdrawn by the user)."""
        handle = find_thread(rt, user, tid)
        check_id(item_id, "task-state item")
        try:
            item = rt.task_state.withdraw(handle, handle.meta.epoch, item_id, "user")
        except TaskItemNotFound as exc:
            raise NotFoundException(str(exc)) from None
        except TaskStateError as exc:
            raise ClientException(str(exc)) from None
        return {"item": msgspec.to_builtins(item), **rt.requests.continuity(handle)}
