"""A re-query the analyst asks for (the artifacts panel), outside any turn.

It runs exactly as the model's `requery_artifact` call would (read-only origins only, the caller's
permission checked again) and is recorded in the thread's log as that call and its result, marked
`via: api`, so the model knows on its next turn that the data was restored and whether it changed.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from datadesk.chat.turns import TurnRegistry
from datadesk.domain.ids import new_id
from datadesk.domain.records import AssistantRecordMeta, Record, ToolCall, ToolRecordMeta, record_meta
from datadesk.domain.users import User
from datadesk.store.diskspace import DiskRoom
from datadesk.store.threads import Thread
from datadesk.tools.context import ToolContext
from datadesk.tools.requery import RequeryService

TOOL_NAME = "requery_artifact"


class UserRequery:
    """Restores an expired artifact on the user's request and records it as a tool call pair."""

    def __init__(self, requery: RequeryService, turns: TurnRegistry, disk: DiskRoom | None = None) -> None:
        self.requery = requery
        self.turns = turns
        self.disk = disk  # below store.min_free_mb no re-query starts (DiskLow -> 507)

    async def run(self, thread: Thread, user: User, aid: str) -> dict[str, Any]:
        """Re-run the origin call of artifact `aid` (409 while a turn runs on the thread) and
        return the report; ToolError says why it cannot be re-run."""
        if self.disk is not None:
            self.disk.check("the re-query")
        turn = self.turns.reserve(thread.id, user.id)
        try:
            call_id = new_id("call_")
            ctx = ToolContext(thread=thread, workspace=thread.workspace, user=user.id,
                              permissions=user.permission_set, call_id=call_id)
            report = await self.requery.requery(aid, ctx)
            args = msgspec.json.encode({"artifact_id": aid}).decode()
            thread.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), turn_id=turn.turn_id,
                                             tool_calls=[ToolCall(call_id, TOOL_NAME, args)],
                                             meta=record_meta(AssistantRecordMeta(via="api"))), thread.epoch,
                          fence=turn.fence)
            thread.append(lambda seq: Record(seq=seq, role="tool", ts=time.time(), turn_id=turn.turn_id,
                                             tool_call_id=call_id, name=TOOL_NAME,
                                             content=msgspec.json.encode(report).decode(),
                                             meta=record_meta(ToolRecordMeta(requery=report, via="api"))),
                          thread.epoch, fence=turn.fence)
            thread.end_turn()  # store.fsync = "turn": the recorded pair reaches the disk, as a turn's records do
            return msgspec.to_builtins(report)
        finally:
            self.turns.release(turn)
