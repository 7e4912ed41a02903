"""A running turn's events as a Server-Sent Events response, for every endpoint that starts or
follows a turn (messages, events, steps, regenerate, refresh).

- `stream_turn(rt, handle, key, turn, cancel_on_leave)`: the response of an endpoint that has
  just started `turn` (its events from the first); `stream_attachment(rt, handle, key,
  attached)`: the response of one that re-attached (`GET .../events`, from a cursor).
- Underneath: `subscribe` gives this client its place in the turn's shared feed
  (api/turn_feed.py), with one `TurnRendering` per turn and worker (the answer's sanitized
  Markdown, a few times a second, off the event loop); `event_chunks` yields the feed's SSE
  bytes and, for a `background: false` turn, cancels it when its client leaves; `sse_response`
  wraps them in Litestar's `Stream` with the SSE headers.

`key` is whose share of the worker threads rendering counts against (api/offloop.py): the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterable

from litestar.response import Stream

from datadesk.api.offloop import run_off_loop
from datadesk.api.render import LiveMarkdown, markdown_html, model_img_src, tool_html, tool_input_html
from datadesk.api.turn_feed import FeedSubscription, feeds_of
from datadesk.chat.journal import JournalEvent
from datadesk.chat.turns import Attachment, RunningTurn

log = logging.getLogger(__name__)

HTML_EVERY_S = 0.25  # while an answer streams, its rendered Markdown is refreshed this often (per turn)
INLINE_RENDER_CHARS = 512  # a refresh of at most this much new text renders on the loop (0.6 ms mean, 2 ms at most)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


async def stream_turn(rt: Any, handle: Any, key: str, turn: RunningTurn,
                      cancel_on_leave: RunningTurn | None) -> Stream:
    """The SSE response of a turn this request just started: its events from the first, for the
    client `key`; `cancel_on_leave` (the turn itself, for `background: false`) is cancelled when
    this client leaves before the end."""
    assert turn.journal is not None
    attached = Attachment(turn.journal.subscribe(), turn.turn_id, 0)
    return sse_response(event_chunks(await subscribe(rt, attached, thread_artifact_ids(rt, handle), key),
                                     cancel_on_leave))


async def stream_attachment(rt: Any, handle: Any, key: str, attached: Attachment) -> Stream:
    """The SSE response of a client re-attached to the thread's turn (`rt.turns.attach`): the
    events after its cursor, then live; leaving stops nothing."""
    return sse_response(event_chunks(await subscribe(rt, attached, thread_artifact_ids(rt, handle), key), None))


def thread_artifact_ids(rt: Any, handle: Any) -> Callable[[], list[str]]:
    """The thread's artifact ids now (read again at each rendering: a turn makes new ones)."""
    return lambda: [a.id for a in rt.artifacts.list(handle)]


class TurnRendering:
    """The answer's sanitized Markdown, added to `message.delta` a few times a second: one per
    turn and worker, shared by all its clients (api/turn_feed.py). Bounded and off the event
    loop: `LiveMarkdown` renders each finished block once and only the open tail again (plain
    text past its limit), in a worker thread within the user's share (`key`, see
    api/offloop.py) unless it is at most INLINE_RENDER_CHARS of text (about a millisecond, less
    than handing it to a thread and waking up for its result costs), and the next rendering waits at least twice as long as
    the last one took.
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
        if self._img_src is not None and self.live.pending_chars() <= INLINE_RENDER_CHARS:
            out = self._render_now()  # about a millisecond: a thread's hand-off and wake-ups cost more
        else:
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


async def subscribe(rt: Any, attached: Attachment, artifact_ids: Callable[[], Iterable[str]],
                     key: str) -> FeedSubscription:
    """This client's place in the turn's feed (api/turn_feed.py): the one of this worker, or a new
    one reading `attached.events` and rendering within the share of `key` (api/offloop.py)."""
    feeds = feeds_of(rt.turns)
    feed = feeds.get(attached.turn_id)
    if feed is None:
        feed = feeds.start(attached.turn_id, attached.events, TurnRendering(artifact_ids, key))
    else:  # the feed reads the turn already: this reader is not needed
        with contextlib.suppress(Exception):
            await attached.events.aclose()  # type: ignore[attr-defined]
    return feed.subscribe(attached.seen)


def sse_response(chunks: AsyncIterator[bytes]) -> Stream:
    """An SSE response of `chunks` (no caching, no proxy buffering)."""
    return Stream(chunks, media_type="text/event-stream", headers=SSE_HEADERS)


async def event_chunks(sub: FeedSubscription, cancel_on_leave: RunningTurn | None) -> AsyncIterator[bytes]:
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
