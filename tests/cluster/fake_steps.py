"""The fake model of the multi-host test (tests/cluster/test_multihost.py) as a process of its
own: the real `FakeOpenAIServer` (tests/fakes/openai_server.py) answering from the request, so
many threads on three hosts can call it at once, and so its event loop does not share the
test's interpreter (the throughput figure would then measure the test's own GIL).

What the last user message says decides the answer (`respond`):

- `slow:<n>:<delay>`: an answer of n words in n pieces, `delay` seconds before each piece;
- `sqlslow:<n>:<delay>`: a first step of about 2 s calling a SQL query of about a second, then
  (after its result) that slow answer;
- `py:<code>`: one `python` call running `code`, then a short answer;
- `offload`: one SQL step whose result is large enough to be offloaded, then a short answer;
- `bench`: three model steps, each `--step-delay` seconds long: the offloaded SQL result, a
  small SQL step, the answer;
- anything else: `ok: <text>`.

    python -m tests.cluster.fake_steps --port-file PATH [--step-delay S]

It writes its port to PATH once it listens on 127.0.0.1 and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

BIG_SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT {rows}"  # offloaded
SMALL_SQL = "SELECT building_id, round(sum(kwh), 1) AS kwh FROM readings GROUP BY 1 ORDER BY 1 LIMIT 3"
BUSY_SQL = "SELECT count(*) AS n, sum(i % 7) AS s FROM range(60000000) t(i)"  # some CPU-seconds of DuckDB
STREAM_EVENTS = 4  # a one-piece answer streams as: role, the piece, the finish, [DONE]


def _user_and_step(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The last user message and how many tool results came after it (the step we are at)."""
    step = 0
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content") or ""), step
        if m.get("role") == "tool":
            step += 1
    return "", step


def slow(spec: str) -> FakeReply:
    n, delay = spec.split(":")[:2]
    return FakeReply(text=" ".join(f"word{i}" for i in range(int(n))), chunks=int(n), delay_s=float(delay))


def respond(req: dict[str, Any], step_delay: float, rows: int = 1000) -> FakeReply:
    user, step = _user_and_step(req.get("messages") or [])
    kind, _, rest = user.partition(":")
    per_event = step_delay / STREAM_EVENTS
    if kind == "slow":
        return slow(rest)
    if kind == "sqlslow":
        if step == 0:
            return FakeReply(text="Looking. ", tool_calls=[{"name": "sql_query", "arguments": {"sql": BUSY_SQL}}],
                             delay_s=0.25)
        return slow(rest)
    if kind == "py":
        if step == 0:
            return FakeReply(tool_calls=[{"name": "python", "arguments": {"code": rest}}])
        return FakeReply(text="ran it", chunks=1)
    if user == "offload":
        if step == 0:
            return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": BIG_SQL.format(rows=1000)}}])
        return FakeReply(text="offloaded", chunks=1)
    if user == "bench":
        if step == 0:
            return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": BIG_SQL.format(rows=rows)}}],
                             delay_s=per_event)
        if step == 1:
            return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": SMALL_SQL}}],
                             delay_s=per_event)
        return FakeReply(text="Done: the totals are in the table.", chunks=1, delay_s=per_event)
    return FakeReply(text=f"ok: {user}", chunks=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--step-delay", type=float, default=0.2)
    parser.add_argument("--rows", type=int, default=1000, help="rows of the offloaded result of `bench`")
    args = parser.parse_args()
    server = FakeOpenAIServer(models=None)
    server.responder = lambda req: respond(req, args.step_delay, args.rows)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(str(server.port))
    tmp.rename(args.port_file)
    while not stop.wait(1.0):
        server.clear()  # keep no history: the process serves thousands of requests
    server.stop()


if __name__ == "__main__":
    main()
