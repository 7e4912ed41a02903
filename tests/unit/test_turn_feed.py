"""Streaming at a fraction of the cost: text pieces coalesced in the journal, one rendering and
one SSE encoding per turn shared by every client (api/turn_feed.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datadesk.api.event_stream import TurnRendering
from datadesk.api.render import markdown_html
from datadesk.api.turn_feed import TurnFeeds
from datadesk.chat import journal as J
from datadesk.chat.journal import TurnJournal, follow_file


def parse(raw: bytes) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of SSE bytes; comments (pings) skipped."""
    out = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        eid, ev, data = None, "message", None
        for line in block.split("\n"):
            if line.startswith("id: "):
                eid = line[4:]
            elif line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = msgspec.json.decode(line[6:])
        if data is not None:
            out.append((eid, ev, data))
    return out


def text(events) -> str:
    return "".join(d["text"] for _, e, d in events if e == "message.delta")


# -- coalescing (chat/journal.py) ------------------------------------------------------
# an operation: a text piece, another event, a pause past COALESCE_S, or the end of the turn
OPS = st.lists(st.one_of(st.text(min_size=1, max_size=5).map(lambda t: ("text", t)),
                         st.sampled_from([("event", "tool.started"), ("event", "error"), ("pause", ""),
                                          ("event", "tool.progress")])), max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, end=st.sampled_from(["done", "close"]))
def test_coalesced_text_adds_up_to_the_pieces_in_order_with_contiguous_ids(ops, end, tmp_path_factory,
                                                                           monkeypatch) -> None:
    monkeypatch.setattr(J, "COALESCE_S", 0.002)
    path = tmp_path_factory.mktemp("j") / "events.jsonl"

    async def run() -> tuple[list, list]:
        j = TurnJournal("t1", path)
        live = j.subscribe()
        for kind, value in ops:
            if kind == "text":
                j.add_text(value)
            elif kind == "event":
                j.add(value, {"call_id": "c"})
            else:
                await asyncio.sleep(0.005)  # the timer adds the pieces so far as one event
        if end == "done":
            j.add("done", {"turn_id": "t1", "status": "ok"})
        else:  # a turn that ended without `done` (the registry closes its journal)
            j.close()
        got = [ev async for ev in live]
        return got, [ev async for ev in follow_file(path, "t1", lambda t: False)]

    got, filed = asyncio.run(run())
    assert [e.n for e in got] == list(range(1, len(got) + 1))
    assert "".join(e.data["text"] for e in got if e.type == "message.delta") == \
        "".join(v for k, v in ops if k == "text")
    # every other event comes after the text sent before it, none of it after
    order = [("text", e.data["text"]) if e.type == "message.delta" else ("event", e.type) for e in got]
    expect = []
    for kind, value in ops:
        if kind == "text" and expect and expect[-1][0] == "text":
            expect[-1] = ("text", expect[-1][1] + value)
        elif kind != "pause":
            expect.append((kind, value))
    merged = []
    for kind, value in order:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    assert merged[:len(expect)] == expect
    # the file other workers read holds the same events (an ended turn: its `done`)
    if end == "done":
        assert [(e.n, e.type, e.data) for e in filed] == [(e.n, e.type, e.data) for e in got]


def test_pieces_within_the_interval_become_one_event_and_a_pause_flushes(monkeypatch) -> None:
    monkeypatch.setattr(J, "COALESCE_S", 0.05)

    async def run() -> list:
        j = TurnJournal("t", None)
        it = j.subscribe()
        for piece in ("Hel", "lo ", "wor", "ld"):
            j.add_text(piece)
        first = await asyncio.wait_for(anext(it), 2)  # the timer, no other event needed
        j.add_text("!")
        j.add("done", {"turn_id": "t", "status": "ok"})
        return [first, *[ev async for ev in it]]

    got = asyncio.run(run())
    assert [(e.n, e.type, e.data) for e in got] == [(1, "message.delta", {"text": "Hello world"}),
                                                     (2, "message.delta", {"text": "!"}),
                                                     (3, "done", {"turn_id": "t", "status": "ok"})]


def test_an_unread_subscription_leaves_when_closed() -> None:
    async def run() -> int:
        j = TurnJournal("t", None)
        it = j.subscribe()
        await it.aclose()  # never iterated: its queue must not fill for nobody
        return len(j._subscribers)

    assert asyncio.run(run()) == 0


# -- the shared feed (api/turn_feed.py) ------------------------------------------------------
ANSWER = "Intro **bold** text.\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end."


async def _drain(sub) -> bytes:
    return b"".join([chunk async for chunk in sub.chunks()])


def test_every_client_gets_the_rest_after_its_cursor_and_the_html_covers_the_text_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.api import event_stream

    monkeypatch.setattr(event_stream, "HTML_EVERY_S", 0.0)  # render at every text event
    renderings: list[TurnRendering] = []

    def rendering() -> TurnRendering:
        renderings.append(TurnRendering())
        return renderings[-1]

    async def run() -> dict[int, bytes]:
        j = TurnJournal("t1", None)
        feeds = TurnFeeds()
        feed = feeds.start("t1", j.subscribe(), rendering())
        subs = {0: feed.subscribe(0)}
        pieces = [ANSWER[i:i + 7] for i in range(0, len(ANSWER), 7)]
        for i, piece in enumerate(pieces):
            j.add("message.delta", {"text": piece})
            await asyncio.sleep(0.01)  # the feed renders (in a worker thread)
            if i == 3:
                subs[2] = feed.subscribe(2)  # attaches mid-way, having seen events 1 and 2
        j.add("tool.started", {"call_id": "c", "name": "python", "arguments": "{}"})
        await asyncio.sleep(0.05)
        subs[len(pieces)] = feed.subscribe(len(pieces))  # has seen all the text
        j.add("message.completed", {"seq": 3, "content": ANSWER})
        j.add("done", {"turn_id": "t1", "status": "ok"})
        late = {}
        for seen in (0, 5):
            await asyncio.sleep(0.05)
            if (f := feeds.get("t1")) is not None:  # the turn ended: its feed is gone
                late[seen] = f.subscribe(seen)
        assert not late and len(feeds) == 0
        out = {seen: await _drain(sub) for seen, sub in subs.items()}
        return out, len(pieces)

    out, n = asyncio.run(run())
    assert len(renderings) == 1  # one rendering for every client of the turn
    pieces = [ANSWER[i:i + 7] for i in range(0, len(ANSWER), 7)]
    for seen, raw in out.items():
        events = parse(raw)
        ids = [int(i.split(":")[1]) for i, _, _ in events if i is not None]
        assert ids == list(range(seen + 1, n + 4)), seen  # exactly the rest, in order
        assert text(events) == "".join(pieces[seen:])
        assert events[-1][1] == "done" and events[-2][1] == "message.completed"
        assert events[-2][2]["html"] == markdown_html(ANSWER)
    live = parse(out[0])
    htmls = [d["html"] for _, e, d in live if e == "message.delta" and "html" in d]
    assert htmls and htmls[-1] == markdown_html(ANSWER)  # the last one, before the tool call


def test_a_replay_keeps_only_the_newest_rendering_at_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from datadesk.api import event_stream

    monkeypatch.setattr(event_stream, "HTML_EVERY_S", 0.0)

    async def run() -> tuple[bytes, bytes]:
        j = TurnJournal("t1", None)
        feeds = TurnFeeds()
        feed = feeds.start("t1", j.subscribe(), TurnRendering())
        first = feed.subscribe(0)
        for word in ("alpha ", "beta ", "gamma"):
            j.add("message.delta", {"text": word})
            await asyncio.sleep(0.02)
        j.add("tool.started", {"call_id": "c", "name": "python", "arguments": "{}"})
        for word in ("second ", "part"):
            j.add("message.delta", {"text": word})
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        replay = feed.subscribe(0)  # a reload mid-turn: everything from the start
        j.add("done", {"turn_id": "t1", "status": "ok"})
        return await _drain(first), await _drain(replay)

    live, replay = (parse(raw) for raw in asyncio.run(run()))
    assert [(i, e) for i, e, _ in live if i] == [(i, e) for i, e, _ in replay if i]
    assert text(live) == text(replay) == "alpha beta gammasecond part"
    with_html = [(i, d["html"]) for i, e, d in replay if e == "message.delta" and "html" in d]
    # the first part's last rendering (before the tool call), then the newest of the second part
    assert [h for _, h in with_html] == [markdown_html("alpha beta gamma"), markdown_html("second part")]
    cut = next(k for k, (_, e, _) in enumerate(live) if e == "tool.started")
    for part, events in (("alpha beta gamma", live[:cut]), ("second part", live[cut:])):
        assert [d["html"] for _, e, d in events if "html" in d][-1] == markdown_html(part)


def test_a_replay_drops_the_rendering_a_final_one_before_the_tool_call_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text after the last refresh gets its final rendering just before the tool call (a busy
    worker renders less often): the replay keeps that one, not the older refresh as well."""
    from datadesk.api import event_stream

    monkeypatch.setattr(event_stream, "HTML_EVERY_S", 0.0)
    rendering = TurnRendering()

    async def run() -> bytes:
        j = TurnJournal("t1", None)
        feed = TurnFeeds().start("t1", j.subscribe(), rendering)
        live = feed.subscribe(0)
        j.add("message.delta", {"text": "alpha "})
        while not rendering.rendered_at:  # that one is rendered at once
            await asyncio.sleep(0.005)
        monkeypatch.setattr(event_stream, "HTML_EVERY_S", 60.0)
        rendering.wait_s = 60.0  # the next ones wait: stale until the tool call
        for word in ("beta ", "gamma"):
            j.add("message.delta", {"text": word})
        j.add("tool.started", {"call_id": "c", "name": "python", "arguments": "{}"})
        j.add("message.delta", {"text": "after"})
        await asyncio.sleep(0.05)
        replay = feed.subscribe(0)
        j.add("done", {"turn_id": "t1", "status": "ok"})
        await _drain(live)
        return await _drain(replay)

    replay = parse(asyncio.run(run()))
    assert text(replay) == "alpha beta gammaafter"
    assert [d["html"] for _, e, d in replay if e == "message.delta" and "html" in d] == [
        markdown_html("alpha beta gamma"), markdown_html("after")]


def test_a_feed_of_the_event_file_is_shared_and_stops_when_its_last_client_leaves(tmp_path) -> None:
    path = tmp_path / "events.jsonl"

    async def run() -> tuple[int, bool, list]:
        j = TurnJournal("t1", path)
        j.add("message.delta", {"text": "from the file"})
        j._flush()  # what another worker can read
        feeds = TurnFeeds()
        feed = feeds.start("t1", follow_file(path, "t1", lambda t: not j.done), TurnRendering())
        a, b = feed.subscribe(0), feed.subscribe(0)
        ita, itb = a.chunks(), b.chunks()
        got_a, got_b = await anext(ita), await anext(itb)
        await ita.aclose()
        one_left = feeds.get("t1") is feed
        await itb.aclose()
        return len(feeds), one_left, parse(got_a + got_b)

    left, one_left, events = asyncio.run(run())
    assert one_left and left == 0
    assert [(i, d["text"]) for i, e, d in events if e == "message.delta"] == [("t1:1", "from the file")] * 2
