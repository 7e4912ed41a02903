"""Timers on one grid wake the process once (chat/wakeups.py), and the live rendering of an
answer gives the same HTML whether it runs on the loop or in a worker thread."""

from __future__ import annotations

import asyncio

from datadesk.api.event_stream import INLINE_RENDER_CHARS, TurnRendering
from datadesk.api.render import markdown_html
from datadesk.chat.journal import JournalEvent
from datadesk.chat.wakeups import next_grid_point, sleep_to_grid


def test_the_next_grid_point_is_a_multiple_ahead_never_a_hair_away():
    for period in (0.05, 0.1, 0.25):
        for now in (0.0, 0.001, 12.3456, 99.9999, 1e6 + 0.049):
            point = next_grid_point(now, period)
            assert point > now + period / 4 - 1e-9
            assert point <= now + period * 1.25 + 1e-9
            assert abs(point / period - round(point / period)) < 1e-6


def test_timers_of_periods_that_divide_each_other_fire_in_one_wake_up():
    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        woke: list[tuple[float, float]] = []

        async def one(period: float) -> None:
            due = await sleep_to_grid(period)
            woke.append((due, loop.time()))

        await sleep_to_grid(0.1)  # start on a point of both grids
        await asyncio.gather(one(0.05), one(0.1), one(0.05))
        return woke

    woke = asyncio.run(main())
    dues = sorted(d for d, _ in woke)
    assert dues[0] < dues[-1]  # the 0.05 timers' next point comes before the 0.1 one's ...
    at_shared = [(d, t) for d, t in woke if abs(d - dues[-1]) < 1e-6]
    assert len(at_shared) == 1
    firsts = [t for d, t in woke if abs(d - dues[0]) < 1e-6]
    assert len(firsts) == 2 and max(firsts) - min(firsts) < 0.002  # ... and both 0.05 ones wake together


def test_a_small_rendering_on_the_loop_equals_one_in_a_thread():
    text = "Revenue grew in **every region**.\n\n- north: up 12%\n- south: up 7%\n\n| a | b |\n|---|---:|\n| 1 | 2 |\n\nThe `west` "

    async def render(pieces: list[str]) -> str:
        rendering = TurnRendering()
        html = ""
        for i, piece in enumerate(pieces):
            rendering.rendered_at = 0.0  # a refresh is due at every piece
            out = await rendering.events(JournalEvent(i + 1, "message.delta", {"text": piece}))
            html = out[-1][1].get("html", html)
        return html

    small = asyncio.run(render([text[i:i + 4] for i in range(0, len(text), 4)]))
    big_tail = "x" * (INLINE_RENDER_CHARS + 10)
    big = asyncio.run(render([text, big_tail]))  # more than the inline limit: rendered in a thread
    assert small == markdown_html(text)
    assert big == markdown_html(text + big_tail)
