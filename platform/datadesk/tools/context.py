"""What a tool call may know: who calls, in which thread, and the facts of the turn.

The turn loop builds one `ToolContext` per call and passes it to the handler; nothing else
reaches a tool. The thread is its `Thread` owner, so a tool reads the log and writes
artifacts through it and never builds a path of its own.
"""

from __future__ import annotations

from typing import Callable, Literal

import msgspec

from datadesk.domain.artifacts import ArtifactOrigin
from datadesk.store.threads import Thread


class TurnFacts(msgspec.Struct, frozen=True):
    """Facts of the running turn that the model does not get to decide (memory provenance).

    - `user_seq`: seq of the user message of this turn (None outside a turn);
    - `after_tool_output`: tool output came between that message and this call, so what
      the call carries may come from a document or query result (a prompt injection);
    - `user_asked`: the user's message asked directly for it (an instruction to remember);
    - `project`: the thread's project label (for `scope: "project"`).
    """

    user_seq: int | None = None
    after_tool_output: bool = False
    user_asked: bool = False
    project: str | None = None


class ToolContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling and where: passed to every tool handler.

    `epoch` is the thread's epoch when the turn started (a clear bumps it): writes made
    under it are refused once the thread was cleared; None writes unguarded.
    """

    thread: Thread
    workspace: str
    user: str
    permissions: frozenset[str]
    call_id: str = ""
    epoch: int | None = None
    facts: TurnFacts = TurnFacts()
    # how a long call reports what it is doing (`tool.progress`): keyword fields of
    # domain.events.ToolProgress (stdout, stderr, rows, bytes, message); a no-op outside a turn
    progress: Callable[..., None] | None = None

    def report(self, **fields: object) -> None:
        """Report progress of this call (output printed, rows written, ...); never raises."""
        if self.progress is not None:
            try:
                self.progress(**fields)
            except Exception:  # progress is advice: it must never break the call
                pass

    def origin(self, source: Literal["tool", "python"], tool: str | None = None, arguments: str | None = None,
               filename: str | None = None) -> ArtifactOrigin:
        """The origin of an artifact this call produces (enough to re-run a tool call)."""
        return ArtifactOrigin(source=source, user=self.user, thread=self.thread.id, workspace=self.workspace,
                              tool=tool, arguments=arguments, call_id=self.call_id, filename=filename)
