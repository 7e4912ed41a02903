"""The task state of a thread: the user's goal and standing constraints (DESIGN section 5, item 3).

It is kept apart from the summary text, so a constraint survives whatever happens to the
summary (a summarizer answering prose, a failed refresh, a summary rewritten later). An
item is recorded when it is said, from one of three sources:

- `user`: the user pins it in the UI (their own message, or words they type);
- `model`: the model's `note_constraint` call, accepted only with the user's own words from
  this turn's message (checked by code: the model cannot record what a tool result says);
- `summary`: an active constraint (or the goal) of a new summary that is not recorded yet.

It is revised only by the user's later words: the user unpins it in the UI, or the model
calls `drop_constraint` / `note_constraint(replaces=...)` quoting the user's words of that
turn. A summary may only withdraw what a summary added (listed by it as superseded, which
the summarizer takes from the user's words). Withdrawn items stay in the file for the
record, marked. The active items are injected into every request of the thread.

A branch (an edited question, a regenerated answer: domain/branches.py) takes back what was
said in the stretch it leaves behind (`forget_stretch`, run by the turn that appends the
marker): items whose `user_seq` lies there are withdrawn (`withdrawn_by: "branch"`), and
withdrawals made there are undone. An item a summary brought goes with that summary
(`forget_branch`), as the summary is re-derived from the active branch.

The task state is the `Thread`'s `task_state` document (`task_state.json` in the embedded set,
a row in the cluster set); every change holds the thread (`Thread.guarded`) and is refused once
the thread was cleared since the epoch the work started in (a clear deletes it).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Literal

import msgspec

from datadesk.domain.ids import new_id
from datadesk.store.interfaces.threads import TASK_STATE, LogClosed, Thread
from datadesk.summary.model import ThreadSummary, normalize_item

log = logging.getLogger(__name__)

MAX_ACTIVE = 30  # active items per thread
MAX_CHARS = 500  # per item
MAX_KEPT = 200  # items in the file, withdrawn ones included (the oldest withdrawn go first)

Kind = Literal["goal", "constraint"]
Source = Literal["user", "model", "summary"]
TITLE = ("Task state (the user's goal and standing constraints in this thread, recorded when the user "
         "said them; they hold until the user revises them):")


class TaskStateError(ValueError):
    """A task-state change that cannot be made; the message says why (shown to the model or user)."""


class TaskItemNotFound(TaskStateError):
    """No item with that id in the thread's task state."""


class TaskItem(msgspec.Struct, kw_only=True):
    """One goal or constraint, with where it came from."""

    id: str
    kind: Kind
    text: str
    source: Source
    user_seq: int | None = None  # the user message it was said in (None: from a summary)
    created: float = 0.0
    status: Literal["active", "withdrawn"] = "active"
    withdrawn_by: str = ""  # "user" | "model" | "summary" | "branch" (said in, or summarised from, an earlier branch)
    withdrawn_seq: int | None = None
    replaced_by: str | None = None


class TaskState(msgspec.Struct, kw_only=True):
    """The `task_state` document of a thread."""

    epoch: int = 0
    items: list[TaskItem] = msgspec.field(default_factory=list)
    summary_through: int = 0  # the summary coverage already merged in
    updated: float = 0.0

    def active(self) -> list[TaskItem]:
        return [i for i in self.items if i.status == "active"]

    def goal(self) -> TaskItem | None:
        return next((i for i in reversed(self.items) if i.status == "active" and i.kind == "goal"), None)

    def constraints(self) -> list[TaskItem]:
        return [i for i in self.items if i.status == "active" and i.kind == "constraint"]


_decoder = msgspec.json.Decoder(TaskState)


def render_task_state(state: TaskState) -> str | None:
    """The block injected into every request (None when nothing is recorded)."""
    goal, constraints = state.goal(), state.constraints()
    if goal is None and not constraints:
        return None
    lines = [TITLE]
    if goal is not None:
        lines.append(f"Goal: {goal.text} (id {goal.id})")
    if constraints:
        lines.append("Constraints:")
        lines.extend(f"- {c.text} (id {c.id})" for c in constraints)
    return "\n".join(lines)


def clean_text(text: str) -> str:
    """One line, trimmed; TaskStateError when empty or too long."""
    text = " ".join(str(text).split())
    if not text:
        raise TaskStateError("the goal or constraint is empty")
    if len(text) > MAX_CHARS:
        raise TaskStateError(f"a task-state item holds at most {MAX_CHARS} characters, this one {len(text)}: "
                             "state it shorter")
    return text


class TaskStateStore:
    """Reads and changes a thread's task state (see the module docstring)."""

    def load(self, thread: Thread, epoch: int | None) -> TaskState:
        """The task state of `epoch` (empty when none, unreadable, or left from before a clear)."""
        raw = thread.read_doc(TASK_STATE)
        if raw is None:
            return TaskState(epoch=epoch or 0)
        try:
            state = _decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("ignoring an unreadable task state of %s: %s", thread.id, exc)
            return TaskState(epoch=epoch or 0)
        return state if state.epoch == (epoch or 0) else TaskState(epoch=epoch or 0)

    def _save(self, thread: Thread, state: TaskState, epoch: int | None) -> None:
        """Write `state`; called inside `_guard(thread, epoch)`, whose hold the write joins."""
        state.updated = time.time()
        if len(state.items) > MAX_KEPT:  # the oldest withdrawn items go first
            drop = len(state.items) - MAX_KEPT
            kept: list[TaskItem] = []
            for item in state.items:
                if drop and item.status == "withdrawn":
                    drop -= 1
                    continue
                kept.append(item)
            state.items = kept
        if not thread.write_doc(TASK_STATE, state, epoch):
            raise TaskStateError(f"the task state was not changed: thread {thread.id} was cleared")

    def note(self, thread: Thread, epoch: int | None, text: str, kind: Kind, source: Source,
             user_seq: int | None = None, replaces: str | None = None) -> TaskItem:
        """Record a goal or constraint (the existing item when it is already active). A new goal
        replaces the active one; `replaces` withdraws that item in favour of this one."""
        text = clean_text(text)
        with self._guard(thread, epoch):
            state = self.load(thread, epoch)
            old = self._find(state, replaces) if replaces else None
            key = normalize_item(text)
            same = next((i for i in state.active() if i.kind == kind and normalize_item(i.text) == key), None)
            if same is not None and old is None:
                return same
            if old is None and len(state.active()) >= MAX_ACTIVE:
                raise TaskStateError(f"the task state holds {MAX_ACTIVE} active items already: drop one first")
            item = TaskItem(id=new_id("c"), kind=kind, text=text, source=source, user_seq=user_seq,
                            created=time.time())
            previous_goal = state.goal() if kind == "goal" else None
            for gone in (old, previous_goal):
                if gone is not None and gone.status == "active":
                    gone.status, gone.withdrawn_by, gone.withdrawn_seq = "withdrawn", source, user_seq
                    gone.replaced_by = item.id
            state.items.append(item)
            self._save(thread, state, epoch)
            return item

    def withdraw(self, thread: Thread, epoch: int | None, item_id: str, by: Source,
                 user_seq: int | None = None) -> TaskItem:
        """Withdraw an active item (TaskStateError when there is no such active item)."""
        with self._guard(thread, epoch):
            state = self.load(thread, epoch)
            item = self._find(state, item_id)
            item.status, item.withdrawn_by, item.withdrawn_seq = "withdrawn", by, user_seq
            self._save(thread, state, epoch)
            return item

    def merge_summary(self, thread: Thread, epoch: int | None, summary: ThreadSummary | None) -> TaskState:
        """Take in a summary newer than the last one merged: its goal when none is recorded, its active
        constraints not recorded yet; a summary's own items it lists as superseded are withdrawn."""
        state = self.load(thread, epoch)
        if summary is None or summary.covers_through_seq <= state.summary_through:
            return state
        try:
            with self._guard(thread, epoch):
                state = self.load(thread, epoch)
                if summary.covers_through_seq > state.summary_through:
                    self._merge(state, summary)
                    self._save(thread, state, epoch)
        except TaskStateError as exc:  # cleared meanwhile: nothing to merge into
            log.info("summary not merged into the task state of %s: %s", thread.id, exc)
        return state

    def forget_branch(self, thread: Thread, epoch: int | None) -> None:
        """An edit rewound the thread past the summary merged in (domain/branches.py): what the
        summary brought is withdrawn (`withdrawn_by: "branch"`), and the re-derived summary is merged
        afresh; the user's and the model's own items stay."""
        try:
            with self._guard(thread, epoch):
                state = self.load(thread, epoch)
                for item in state.active():
                    if item.source == "summary":
                        item.status, item.withdrawn_by = "withdrawn", "branch"
                state.summary_through = 0
                self._save(thread, state, epoch)
        except TaskStateError as exc:  # cleared meanwhile
            log.info("branch not applied to the task state of %s: %s", thread.id, exc)

    def forget_stretch(self, thread: Thread, epoch: int | None, rewinds_to: int, marker_seq: int) -> int:
        """A branch marker at `marker_seq` left records `rewinds_to < seq < marker_seq` behind
        (domain/branches.py): an active item said there (its `user_seq` in that stretch: a
        model's `note_constraint` of a turn there, the user's pin of a question there) is
        withdrawn (`withdrawn_by: "branch"`, kept in the file), and an item withdrawn or
        replaced there is active again (the active branch never said to drop it). Items with
        no source record (typed by the user; a summary's: `forget_branch`) stay. Returns the
        number of items changed; idempotent."""
        def inside(seq: int | None) -> bool:
            return seq is not None and rewinds_to < seq < marker_seq

        try:
            with self._guard(thread, epoch):
                state = self.load(thread, epoch)
                changed = 0
                for item in state.items:
                    if item.status == "active" and inside(item.user_seq):
                        item.status, item.withdrawn_by, item.withdrawn_seq = "withdrawn", "branch", marker_seq
                        changed += 1
                    elif (item.status == "withdrawn" and item.withdrawn_by in ("user", "model")
                          and inside(item.withdrawn_seq)):
                        item.status, item.withdrawn_by, item.withdrawn_seq, item.replaced_by = "active", "", None, None
                        changed += 1
                if changed:
                    self._save(thread, state, epoch)
                return changed
        except TaskStateError as exc:  # cleared meanwhile
            log.info("branch not applied to the task state of %s: %s", thread.id, exc)
            return 0

    @staticmethod
    def _merge(state: TaskState, summary: ThreadSummary) -> None:
        now = time.time()
        known = {normalize_item(i.text) for i in state.active()}
        superseded = {normalize_item(s) for s in summary.superseded}
        for item in state.active():
            if item.source == "summary" and normalize_item(item.text) in superseded:
                item.status, item.withdrawn_by = "withdrawn", "summary"
        wanted: list[tuple[Kind, str]] = [("constraint", c) for c in summary.active_constraints]
        if state.goal() is None and summary.goal.strip():
            wanted.insert(0, ("goal", summary.goal))
        for kind, raw in wanted:
            text = " ".join(raw.split())[:MAX_CHARS]
            key = normalize_item(text)
            if not key or key in known or key in superseded or len(state.active()) >= MAX_ACTIVE:
                continue
            known.add(key)
            state.items.append(TaskItem(id=new_id("c"), kind=kind, text=text, source="summary", created=now))
        state.summary_through = summary.covers_through_seq

    @staticmethod
    def _find(state: TaskState, item_id: str) -> TaskItem:
        item = next((i for i in state.items if i.id == item_id), None)
        if item is None:
            raise TaskItemNotFound(f"no task-state item {item_id!r} in this thread (the ids are shown in the "
                                 "task state)")
        if item.status != "active":
            raise TaskStateError(f"task-state item {item_id!r} was already withdrawn")
        return item

    @staticmethod
    @contextlib.contextmanager
    def _guard(thread: Thread, epoch: int | None) -> Iterator[None]:
        """`thread.guarded(epoch)`, a cleared or deleted thread reported as a TaskStateError."""
        try:
            with thread.guarded(epoch):
                yield
        except LogClosed as exc:
            raise TaskStateError(f"the task state was not changed: {exc}") from None
