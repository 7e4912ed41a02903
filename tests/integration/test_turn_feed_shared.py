"""Every client of a turn in a worker reads one feed (api/turn_feed.py): the POST stream and the
re-attached followers, in the worker running the turn and in another one (real HTTP, uvicorn
on 127.0.0.1, the scripted model streaming a Markdown answer in small pieces)."""

from __future__ import annotations

import threading

import httpx

from datadesk.api.render import markdown_html
from datadesk.api.turn_feed import feeds_of
from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel, ScriptStep
from tests.conftest import Harness, serve_app, wait_until
from tests.integration.test_turn_reattach import Events, plain, text_of

ANSWER = ("Totals by region:\n\n- north: 12\n- south: 7\n\n| region | total |\n|---|---:|\n| north | 12 |\n"
          "| south | 7 |\n\n" + " ".join(f"word{i}" for i in range(150)))


def test_followers_in_both_workers_share_one_feed_each_and_get_exactly_the_rest(harness_factory) -> None:
    h = harness_factory(ScriptedModel([ScriptStep(text=ANSWER, delay_s=0.01)], chunk_size=4))
    h2 = Harness(rt=Runtime(settings=h.rt.settings, model=ScriptedModel([])), tokens=h.tokens)
    with serve_app(h.app()) as base, serve_app(h2.app()) as base2, \
            httpx.Client(base_url=base, headers=h.auth("bob"), timeout=30) as c:
        tid = c.post("/api/threads", json={}).json()["id"]
        got: dict[str, list] = {}
        feeds: dict[str, int] = {}

        def follow(name: str, url: str, last_id: str | None) -> None:
            with httpx.Client(headers=h.auth("bob"), timeout=30) as f:
                hdrs = {"Last-Event-ID": last_id} if last_id else {}
                with f.stream("GET", f"{url}/api/threads/{tid}/events", headers=hdrs) as resp:
                    assert resp.status_code == 200
                    got[name] = Events(resp).rest()

        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "totals"}) as resp:
            poster = Events(resp)
            poster.until(lambda it: it[1] == "message.delta")
            poster.until(lambda it: it[1] == "message.delta")
            cursor = poster.got[-1][0]  # a client that saw two text events, then reloaded
            followers = [threading.Thread(target=follow, args=(f"{side}-{i}", url, cursor if i else None))
                         for side, url in (("same", base), ("other", base2)) for i in range(2)]
            for t in followers:
                t.start()
            wait_until(lambda: len(feeds_of(h2.rt.turns)) == 1, timeout=10)
            feeds.update(same=len(feeds_of(h.rt.turns)), other=len(feeds_of(h2.rt.turns)))
            rest = poster.rest()
            for t in followers:
                t.join(30)
        assert feeds == {"same": 1, "other": 1}  # one feed per turn and worker, whoever reads it
        wait_until(lambda: len(feeds_of(h.rt.turns)) == 0 and len(feeds_of(h2.rt.turns)) == 0, timeout=10)

    everything = poster.got
    assert rest[-1][1] == "done" and text_of(everything) == ANSWER
    assert everything[-2][1] == "message.completed" and everything[-2][2]["html"] == markdown_html(ANSWER)
    assert any("html" in d for _, e, d in everything if e == "message.delta")  # rendered while streaming
    n_cursor = int(cursor.split(":")[1])
    for name, events in got.items():
        ids = [int(i.split(":")[1]) for i, _, _ in events if i is not None]
        start = n_cursor + 1 if name.endswith("-1") else 1
        assert ids == list(range(start, ids[-1] + 1)) and events[-1][1] == "done", name
        assert plain(events) == [e for e in plain(everything) if int(e[0].split(":")[1]) >= start], name
        assert events[-2][2]["html"] == markdown_html(ANSWER), name
    # the deltas were coalesced: far fewer text events than the model's 4-character pieces
    assert sum(1 for _, e, _ in everything if e == "message.delta") < len(ANSWER) / 4 / 2
