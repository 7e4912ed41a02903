"""Thread endpoints: create, list, read, delete, post a message (SSE), re-attach to the running
turn (SSE), cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Annotated, Any, AsyncIterator, Callable, Iterable

import msgspec
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.exceptions import ClientException, NotFoundException
from litestar.response import Stream

from datadesk.api.branch_checks import branch_meta
from datadesk.api.guards.access import find_thread, member_workspace
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.offloop import run_off_loop
from datadesk.api.render import LiveMarkdown, markdown_html, model_img_src, plain_html, tool_html, tool_input_html
from datadesk.api.turn_feed import FeedSubscription, feeds_of
from datadesk.api.schemas import NewMessage, NewThread, ThreadDetail, ThreadOut, ThreadPatch
from datadesk.chat.journal import Cursor, JournalEvent
from datadesk.chat.loop import start_turn
from datadesk.chat.turns import Attachment, RunningTurn
from datadesk.domain.branches import active_newest_first
from datadesk.domain.records import ThreadMeta
from datadesk.context.manifest import last_manifest

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a pasted table may be large: it becomes an artifact
MAX_TITLE_CHARS = 200
HTML_EVERY_S = 0.25  # while an answer streams, its rendered Markdown is refreshed this often (per turn)
PAGE_CHARS = 8 * 1024 * 1024  # text in one GET of a thread (newest first): a page of huge records is cut
RENDER_BUDGET_CHARS = 512 * 1024  # text rendered as Markdown per GET of a thread (newest first); older: plain
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def record_view(rec: Any, artifact_ids: Iterable[str] = (), plain: bool = False) -> dict[str, Any]:
    """A record for the UI: as stored, plus `html` (sanitized) for assistant text and tool results;
    images may show `data:` URIs and the thread's artifacts (`artifact_ids`) only. `plain`: the
    text escaped, not rendered (past the response's render budget)."""
    out = msgspec.to_builtins(rec)
    if plain and rec.role in ("assistant", "tool") and rec.content:
        out["html"] = plain_html(rec.content)
    elif rec.role == "assistant" and rec.content:
        out["html"] = markdown_html(rec.content, img_src=model_img_src(artifact_ids))
    elif rec.role == "tool" and rec.content:
        out["html"] = tool_html(rec.content)
    for call in out.get("tool_calls") or [] if rec.role == "assistant" else []:
        call["input_html"] = tool_input_html(call.get("arguments"))  # highlighted SQL / Python
    return out


def record_views(records: list[Any], artifact_ids: list[str]) -> list[dict[str, Any]]:
    """The views of `records`, newest first rendered until RENDER_BUDGET_CHARS of text, the older
    ones as plain text: a page of many long answers costs bounded CPU (a worker thread each)."""
    budget, views = RENDER_BUDGET_CHARS, []
    for rec in reversed(records):
        size = len(rec.content or "")
        views.append(record_view(rec, artifact_ids, plain=size > budget))
        budget -= size if size <= budget else 0
    return views[::-1]


def thread_out(rt: RuntimeDep, meta: ThreadMeta, markers: set[str] | None = None) -> ThreadOut:
    running, turn = rt.turns.status(meta.id, markers)
    return ThreadOut(id=meta.id, workspace=meta.workspace, title=meta.title, created=meta.created,
                     updated=meta.updated, running=running, turn=turn, refreshed=meta.refreshed)


def thread_list(rt: RuntimeDep, user: Any) -> list[ThreadOut]:
    """The user's threads, newest first: a meta file per thread, and the turn markers listed once
    (only a thread with one, i.e. a running turn, reads it)."""
    metas = rt.threads.list(user.id, user.workspaces)
    markers = rt.turns.marker_names()
    return [thread_out(rt, m, markers) for m in metas]


class ThreadController(Controller):
    path = "/api/threads"

    @post("/", status_code=201)
    async def create_thread(self, data: JSONBody[NewThread], user: CurrentUser, rt: RuntimeDep) -> ThreadOut:
        ws = member_workspace(user, data.workspace)
        project = data.project.strip() if data.project else None
        if project is not None and not re.fullmatch(r"[A-Za-z0-9 _.-]{1,64}", project):
            raise ClientException("project must be 1-64 letters, digits, spaces, '_', '.' or '-'")
        title = data.title.strip() or "New chat"
        if data.reuse_empty and title == "New chat" and project is None:
            empty = rt.threads.empty_chat(ws, user.id)  # "+ New chat": an empty one is reused
            if empty is not None and empty.meta is not None and not rt.turns.running(empty.id):
                return thread_out(rt, empty.meta)
        handle = rt.threads.create(ws, user.id, title, project=project)
        return thread_out(rt, handle.meta)

    @get("/")
    async def list_threads(self, user: CurrentUser, rt: RuntimeDep) -> list[ThreadOut]:
        # files per thread: in a worker thread, within the user's share (api/offloop.py)
        return await run_off_loop(user.id, thread_list, rt, user)

    @get("/{tid:str}")
    async def get_thread(
        self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep,
        limit: Annotated[int, QueryParameter(ge=1, le=1000, description="newest records to return")] = 200,
        before: Annotated[int | None, QueryParameter(ge=1, description=(
            "only records with a smaller seq (load earlier: the seq of the oldest record shown)"))] = None,
    ) -> ThreadDetail:
        handle = find_thread(rt, user, tid)
        # reading from the end of a long log and rendering are file and CPU work: off the event
        # loop, within the user's share (api/offloop.py)
        return await run_off_loop(user.id, _thread_detail, rt, handle, limit, before)

    @patch("/{tid:str}")
    async def rename_thread(self, tid: FromPath[str], data: JSONBody[ThreadPatch], user: CurrentUser,
                            rt: RuntimeDep) -> ThreadOut:
        handle = find_thread(rt, user, tid)
        title = " ".join(data.title.split())
        if not title:
            raise ClientException("title is empty")
        if len(title) > MAX_TITLE_CHARS:
            raise ClientException(f"title is too long ({len(title)} chars; limit {MAX_TITLE_CHARS})")
        return thread_out(rt, rt.threads.touch(handle, title=title))

    @delete("/{tid:str}", status_code=204)
    async def delete_thread(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> None:
        await rt.lifecycle.delete(find_thread(rt, user, tid), user)

    @post("/{tid:str}/clear", status_code=200)
    async def clear_thread(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """Clear chat: cancel the running turn, bump the epoch, delete the log, summary,
        manifests, artifacts and outputs, shut the kernel down. Memory stays."""
        handle = find_thread(rt, user, tid)
        removed = await rt.lifecycle.clear(handle, user)
        return {"thread": handle.id, "epoch": handle.meta.epoch, "removed": removed, "memory": "kept"}

    @get("/{tid:str}/context")
    async def get_context(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """The manifest of the thread's latest model request (what went into the model)."""
        handle = find_thread(rt, user, tid)
        manifest = last_manifest(handle)
        if manifest is None:
            raise NotFoundException(f"thread {tid} has no model request yet")
        out = msgspec.to_builtins(manifest)
        # for the inspector: the summary the request carried and the memory facts by text
        summary = rt.summaries.store.load_current(handle, handle.meta.epoch) if manifest.summary else None
        out["summary_detail"] = ({**summary.fields(), "covers_through_seq": summary.covers_through_seq,
                                  "model": summary.model, "created": summary.created} if summary else None)
        facts = []
        if manifest.memory_facts:
            known = {f.id: f for f in rt.memory.facts(handle.meta.workspace, user.id)}
            for fid in manifest.memory_facts:
                f = known.get(fid)
                facts.append({"id": fid, "text": f.text if f else "(deleted since)",
                              "kind": f.kind if f else None, "status": f.status if f else "deleted"})
        out["memory_detail"] = facts
        return out

    @post("/{tid:str}/cancel", status_code=200)
    async def cancel_turn(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        handle = find_thread(rt, user, tid)
        cancelled = await rt.turns.cancel(handle.id)
        return {"cancelled": cancelled, "thread": handle.id}

    # `stream`: an event stream, counted by api/guards/ratelimit.py against server.streams_per_user
    @post("/{tid:str}/messages", status_code=200, request_max_body_size=MAX_MESSAGE_BYTES,
          opt={"stream": True, "strict_query": True})
    async def post_message(self, tid: FromPath[str], data: JSONBody[NewMessage], user: CurrentUser, rt: RuntimeDep,
                           request: Request) -> Stream:
        handle = find_thread(rt, user, tid)
        text = data.content.strip()
        if not text:
            raise ClientException("message content is empty")
        meta = None
        if data.edit_of is not None:  # edit a question: the thread continues from it (a new branch)
            meta = (await run_off_loop(user.id, branch_meta, handle, data.edit_of, "edit"))[1]
        # too long for the model: never sent raw (a pasted table becomes an artifact, else a 413)
        text = await rt.attachments.message_text(handle, user, text)
        background = rt.settings.chat.finish_in_background if data.background is None else data.background
        turn = await start_turn(rt.turn_services, rt.turns, handle, user, text, background, meta)
        assert turn.journal is not None
        attached = Attachment(turn.journal.subscribe(), turn.turn_id, 0)
        sub = await _subscribe(rt, attached, _artifact_ids(rt, handle), user.id)
        return _sse(_stream(sub, None if background else turn))

    @get("/{tid:str}/events", opt={"stream": True, "strict_query": True})
    async def turn_events(
        self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep, request: Request,
        after: Annotated[str | None, QueryParameter(
            description="an event id ('<turn>:<n>'): only the events after it (the Last-Event-ID header wins)")] = None,
    ) -> Response[Any]:
        """Re-attach to the thread's running turn (SSE, same events and ids as the POST stream),
        from any tab and any worker. 204 when there is nothing to attach to: no turn runs, and the
        cursor does not name the turn whose events are kept (then the rest of that one comes)."""
        handle = find_thread(rt, user, tid)
        try:
            cursor = Cursor.parse(request.headers.get("last-event-id") or after)
        except ValueError as exc:
            raise ClientException(str(exc)) from None
        attached = rt.turns.attach(handle.id, handle.events_path, cursor)
        if attached is None:
            return Response(content=b"", status_code=204)
        return _sse(_stream(await _subscribe(rt, attached, _artifact_ids(rt, handle), user.id), None))


def _thread_detail(rt: RuntimeDep, handle: Any, limit: int, before: int | None) -> ThreadDetail:
    """A page of the thread: its newest `limit` records (before `before`), rendered."""
    # the active branch (an edited question's earlier branch: GET .../branches/{seq})
    records = _before(handle, before or (1 << 62), limit + 1)
    has_more_before = len(records) > limit
    page = records[-limit:]
    records = _newest_within(page, PAGE_CHARS)  # at least one record; the older ones: load earlier
    has_more = has_more_before or len(records) < len(page)
    views = record_views(records, [a.id for a in rt.artifacts.list(handle)])
    return ThreadDetail(thread=thread_out(rt, handle.meta), records=views, has_more=has_more)


def _newest_within(records: list[Any], chars: int) -> list[Any]:
    """The newest of `records` whose text fits in `chars` (always the newest one)."""
    total, start = 0, len(records)
    while start > 0:
        total += len(records[start - 1].content or "")
        if total > chars and start < len(records):
            break
        start -= 1
    return records[start:]


def _before(handle: Any, seq: int, n: int) -> list[Any]:
    """The newest `n` records older than `seq`, oldest first (read from the end of the log)."""
    found = []
    for rec in active_newest_first(handle.log.newest_first()):
        if rec.seq < seq:
            found.append(rec)
            if len(found) >= n:
                break
    return found[::-1]


def _artifact_ids(rt: RuntimeDep, handle: Any) -> Callable[[], list[str]]:
    """The thread's artifact ids now (read again at each rendering: a turn makes new ones)."""
    return lambda: [a.id for a in rt.artifacts.list(handle)]


class _Rendering:
    """The answer's sanitized Markdown, added to `message.delta` a few times a second: one per
    turn and worker, shared by all its clients (api/turn_feed.py). Bounded and off the event
    loop: `LiveMarkdown` renders each finished block once and only the open tail again (plain
    text past its limit), in a worker thread within the user's share (`key`, see
    api/offloop.py), and the next rendering waits at least twice as long as the last one took.
    The thread's artifacts (the images it may show) are listed again only after a new one."""

    def __init__(self, artifact_ids: Callable[[], Iterable[str]] = tuple, key: str = "") -> None:
        self.artifact_ids = artifact_ids
        self.key = key
        self.live = LiveMarkdown()
        self.has_text = False
        self.rendered_at = 0.0
        self.wait_s = HTML_EVERY_S
        self.stale = False  # text arrived since the last rendering
        self._img_src: Callable[[str], str | None] | None = None  # None: list the artifacts again

    def _images(self) -> Callable[[str], str | None]:
        # in the worker thread: the thread's artifacts are files too
        if self._img_src is None:
            self._img_src = model_img_src(self.artifact_ids())
        return self._img_src

    def _render_now(self) -> str:
        self.live.img_src = self._images()
        return self.live.render()

    def _completed_html(self, content: str) -> str:
        return markdown_html(content, img_src=self._images())

    async def _render(self) -> str:
        start = time.monotonic()
        out = await run_off_loop(self.key, self._render_now)
        self.rendered_at = time.monotonic()
        self.wait_s = max(HTML_EVERY_S, 2 * (self.rendered_at - start))
        self.stale = False
        return out

    async def events(self, ev: JournalEvent, send: bool = True) -> list[tuple[str, dict[str, Any]]]:
        """What to send for `ev`: a final rendering of the text before it when due, then `ev`
        (with `html` where it has some). With `send` false (a replayed event) nothing renders."""
        data, out = ev.data, []
        if ev.type == "artifact.created":
            self._img_src = None
        if ev.type == "message.delta":
            self.live.feed(str(data.get("text", "")))
            self.has_text = True
            if send and time.monotonic() - self.rendered_at >= self.wait_s:
                data = {**data, "html": await self._render()}
            else:
                self.stale = True
        elif ev.type in ("tool.started", "error", "done") and self.has_text:
            if self.stale and send:  # the text before a tool call (or an error) gets its final rendering
                out.append(("message.delta", {"text": "", "html": await self._render()}))
            self._reset()
        elif ev.type == "message.completed":
            self._reset()
            if send:
                data = {**data, "html": await run_off_loop(self.key, self._completed_html,
                                                           str(data.get("content") or ""))}
        elif ev.type == "tool.finished" and send:
            data = {**data, "html": await run_off_loop(self.key, tool_html, str(data.get("preview") or ""))}
        if ev.type == "tool.started" and send:  # its SQL / Python highlighted
            data = {**data, "input_html": await run_off_loop(self.key, tool_input_html, data.get("arguments"))}
        out.append((ev.type, data))
        return out

    def _reset(self) -> None:
        self.live, self.has_text, self.stale = LiveMarkdown(), False, False


async def _subscribe(rt: RuntimeDep, attached: Attachment, artifact_ids: Callable[[], Iterable[str]],
                     key: str) -> FeedSubscription:
    """This client's place in the turn's feed (api/turn_feed.py): the one of this worker, or a new
    one reading `attached.events` and rendering within the share of `key` (api/offloop.py)."""
    feeds = feeds_of(rt.turns)
    feed = feeds.get(attached.turn_id)
    if feed is None:
        feed = feeds.start(attached.turn_id, attached.events, _Rendering(artifact_ids, key))
    else:  # the feed reads the turn already: this reader is not needed
        with contextlib.suppress(Exception):
            await attached.events.aclose()  # type: ignore[attr-defined]
    return feed.subscribe(attached.seen)


def _sse(chunks: AsyncIterator[bytes]) -> Stream:
    return Stream(chunks, media_type="text/event-stream", headers=SSE_HEADERS)


async def _stream(sub: FeedSubscription, cancel_on_leave: RunningTurn | None) -> AsyncIterator[bytes]:
    """The turn's events as SSE with ids `<turn>:<n>`, those after the client's cursor, and a
    `: ping` comment when nothing happens for a while, as the turn's feed encoded them once for
    all its clients. A client that leaves stops nothing, except the one that started a turn with
    `background: false` (`cancel_on_leave`). The stream ends at `done`, or without it when this
    client fell too far behind (it re-attaches with its last id)."""
    chunks = sub.chunks()
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        # nothing before the cancel may await: a client that left cancels this generator's awaits
        turn = cancel_on_leave
        if not sub.done and turn is not None and turn.task is not None and not turn.task.done():
            log.info("client left turn %s: cancelling", turn.turn_id)
            turn.task.cancel()
            # let the cancelled turn record its state before the request ends
            await asyncio.wait([turn.task], timeout=10)
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
