"""One rendering and one SSE encoding of a turn's events, shared by every client of the turn in
this worker (the POST stream that started it and every re-attached `GET .../events`).

A `TurnFeed` reads the turn's events once (its journal in the worker that runs it, else one
reader of the thread's events.jsonl per worker), renders the answer's Markdown with one
`TurnRendering` (api/event_stream.py; a few times a second per turn, not per client) and
encodes each event's SSE bytes once. Every client gets those bytes: the ones ready when it
reads are sent as one write.

A client that attaches later replays the kept frames (bounded like the journal's events,
`chat.journal.kept_form`) after its cursor, and then follows live. An intermediate rendering of
the text (a `message.delta` with `html`) is kept only until a newer one replaces it: a replay
carries the newest one at its place and the text pieces without it elsewhere, so the text adds
up exactly and the html always covers the text before it. The last rendering of each part of
the answer (before a tool call, an error, the end) stays.

A client that falls MAX_BEHIND frames behind is dropped (its stream ends without `done`; it
re-attaches with its last id). The feed stops when its last client leaves, or when the turn's
events end; a client attaching after that starts a new one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import msgspec

from datadesk.chat.journal import JournalEvent, event_id, fan_out, kept_form

log = logging.getLogger(__name__)

SEND_BYTES = 256 * 1024  # frames ready at once go to a client as one write of up to about this
SEGMENT_ENDS = frozenset({"tool.started", "error", "done", "message.completed"})  # the rendering restarts
PING = b": ping\r\n\r\n"

_encode = msgspec.json.Encoder().encode


def sse_message(type_: str, data: dict[str, Any], id_: str | None) -> bytes:
    """One SSE message (`id:`, `event:`, one `data:` line: JSON never holds a raw newline)."""
    head = b"id: " + id_.encode() + b"\r\n" if id_ is not None else b""
    return head + b"event: " + type_.encode() + b"\r\ndata: " + _encode(data) + b"\r\n\r\n"


@dataclass
class Frame:
    """The SSE bytes of one event `n` (0: a keep-alive): `live` for a client reading as it
    happens, `replay` for one that reads it later (no superseded `html`)."""

    n: int
    live: bytes
    replay: bytes
    done: bool = False
    rendered_first: bool = False  # it starts with a final rendering of the text before it


class TurnFeed:
    """See the module doc. `rendering.events(ev, send)` gives the SSE messages of `ev` (the
    `TurnRendering` interface of api/event_stream.py)."""

    def __init__(self, turn_id: str, source: AsyncIterator[JournalEvent | None], rendering: Any,
                 on_end: Callable[["TurnFeed"], None]) -> None:
        self.turn_id = turn_id
        self.kept: list[Frame] = []
        self.kept_bytes = 0
        self.ended = False
        self._source = source
        self._rendering = rendering
        self._on_end = on_end
        self._subscribers: set[asyncio.Queue[Frame | None]] = set()
        self._latest: Frame | None = None  # the kept frame with the newest intermediate rendering
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"feed-{turn_id}")

    # -- reading the turn ------------------------------------------------------------
    async def _run(self) -> None:
        try:
            async for ev in self._source:
                if ev is None:
                    self._publish(Frame(0, PING, PING), None)
                    continue
                self._publish(self._frame(ev, await self._rendering.events(ev, True)), ev)
                if ev.type == "done":
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # the clients' streams end without `done`: they re-attach
            log.exception("the event feed of turn %s failed", self.turn_id)
        finally:
            self._end()
            with contextlib.suppress(Exception):
                await self._source.aclose()  # type: ignore[attr-defined]

    def _frame(self, ev: JournalEvent, sent: list[tuple[str, dict[str, Any]]]) -> Frame:
        eid = event_id(self.turn_id, ev.n)
        *before, (type_, data) = sent
        head = b"".join(sse_message(t, d, None) for t, d in before)
        live = head + sse_message(type_, data, eid)
        replay = live
        if type_ == "message.delta" and "html" in data:  # superseded by the next rendering
            replay = head + sse_message(type_, {k: v for k, v in data.items() if k != "html"}, eid)
        return Frame(ev.n, live, replay, ev.type == "done", any("html" in d for _, d in before))

    def _publish(self, frame: Frame, ev: JournalEvent | None) -> None:
        fan_out(self._subscribers, frame)
        if ev is not None:
            self._keep(frame, ev)

    def _keep(self, frame: Frame, ev: JournalEvent) -> None:
        kept, size = kept_form(ev, self.kept_bytes,
                               lambda e: len(frame.replay) if e is ev else len(_encode(e.data)) + 40)
        if kept is None:
            return
        if kept is not ev:  # tool.progress without its printed text
            replay = sse_message(kept.type, kept.data, event_id(self.turn_id, frame.n))
            frame = Frame(frame.n, replay, replay)
        if frame.live is not frame.replay:
            if self._latest is not None:  # its rendering is superseded: the replay form only
                self._latest.live = self._latest.replay
            self._latest = frame
        elif ev.type in SEGMENT_ENDS and self._latest is not None:
            if not frame.rendered_first:  # else this frame carries that part's last rendering
                self._latest.replay = self._latest.live  # the last rendering of that part of the answer
            self._latest = None
        self.kept.append(frame)
        self.kept_bytes += size

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._subscribers.clear()
        self._on_end(self)

    # -- clients ------------------------------------------------------------------------
    def subscribe(self, seen: int) -> "FeedSubscription":
        """The frames after event `seen`: the kept ones, then the live ones."""
        start = bisect.bisect_right(self.kept, seen, key=lambda f: f.n)
        backlog = self.kept[start:]
        queue: asyncio.Queue[Frame | None] = asyncio.Queue()
        if not self.ended:
            self._subscribers.add(queue)
        return FeedSubscription(self, backlog, queue, seen)

    def leave(self, queue: asyncio.Queue[Frame | None]) -> None:
        self._subscribers.discard(queue)
        if not self._subscribers and not self.ended:  # nobody reads: stop reading the turn
            self._task.cancel()
            self._end()


class FeedSubscription:
    """One client's SSE bytes from a feed; `done`: the turn's `done` was sent."""

    def __init__(self, feed: TurnFeed, backlog: list[Frame], queue: asyncio.Queue[Frame | None],
                 seen: int) -> None:
        self.feed, self.backlog, self.queue, self.seen = feed, backlog, queue, seen
        self.done = False

    def _bytes(self, frame: Frame, replay: bool) -> bytes | None:
        if frame.n and frame.n <= self.seen:
            return None
        self.done = self.done or frame.done
        return frame.replay if replay and frame is not self.feed._latest else frame.live

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            out: list[bytes] = []
            size = 0
            for frame in self.backlog:
                if (b := self._bytes(frame, True)) is not None:
                    out.append(b)
                    size += len(b)
                    if size >= SEND_BYTES:
                        yield b"".join(out)
                        out, size = [], 0
            if out:
                yield b"".join(out)
            if self.done or self.feed.ended and self.queue.empty():
                return
            while not self.done:
                item = await self.queue.get()
                batch, size = [], 0
                while item is not None:
                    if (b := self._bytes(item, False)) is not None:
                        batch.append(b)
                        size += len(b)
                    if self.done or size >= SEND_BYTES or self.queue.empty():
                        break
                    item = self.queue.get_nowait()
                if batch:
                    yield b"".join(batch)
                if item is None:  # the feed ended (or dropped this client) without `done`
                    return
        finally:
            self.feed.leave(self.queue)


class TurnFeeds:
    """The running feeds of one worker (per TurnRegistry), by turn id."""

    def __init__(self) -> None:
        self._feeds: dict[str, TurnFeed] = {}

    def get(self, turn_id: str) -> TurnFeed | None:
        feed = self._feeds.get(turn_id)
        return feed if feed is not None and not feed.ended else None

    def start(self, turn_id: str, source: AsyncIterator[JournalEvent | None], rendering: Any) -> TurnFeed:
        feed = TurnFeed(turn_id, source, rendering, self._ended)
        self._feeds[turn_id] = feed
        return feed

    def _ended(self, feed: TurnFeed) -> None:
        if self._feeds.get(feed.turn_id) is feed:
            del self._feeds[feed.turn_id]

    def __len__(self) -> int:
        return len(self._feeds)


_BY_REGISTRY: "weakref.WeakKeyDictionary[Any, TurnFeeds]" = weakref.WeakKeyDictionary()


def feeds_of(registry: Any) -> TurnFeeds:
    """The feeds of the worker whose turns `registry` (a TurnRegistry) holds."""
    feeds = _BY_REGISTRY.get(registry)
    if feeds is None:
        feeds = _BY_REGISTRY[registry] = TurnFeeds()
    return feeds
