"""Thread endpoints: create, list, read, delete, post a message (SSE), re-attach to the running
turn (SSE), cancel."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Iterable

import msgspec
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.exceptions import ClientException, NotFoundException
from litestar.response import Stream

from datadesk.api.branch_checks import branch_meta
from datadesk.api.event_stream import stream_attachment, stream_turn
from datadesk.api.guards.access import find_thread, member_workspace
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.api.offloop import run_off_loop
from datadesk.api.render import markdown_html, model_img_src, plain_html, tool_html, tool_input_html
from datadesk.api.schemas import NewMessage, NewThread, ThreadDetail, ThreadOut, ThreadPatch
from datadesk.chat.journal import Cursor
from datadesk.chat.loop import start_turn
from datadesk.domain.branches import active_newest_first
from datadesk.domain.records import ThreadMeta
from datadesk.context.manifest import last_manifest

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a pasted table may be large: it becomes an artifact
MAX_TITLE_CHARS = 200
PAGE_CHARS = 8 * 1024 * 1024  # text in one GET of a thread (newest first): a page of huge records is cut
RENDER_BUDGET_CHARS = 512 * 1024  # text rendered as Markdown per GET of a thread (newest first); older: plain


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
        return await stream_turn(rt, handle, user.id, turn, None if background else turn)

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
        return await stream_attachment(rt, handle, user.id, attached)


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
