"""What a client of the multi-host topology does (tests/cluster/test_multihost.py): threads,
turns, event streams read in the background with the time each event came, records, artifacts,
python calls; and the figures of the test, printed as a table and appended as JSON lines to
$DATADESK_MULTIHOST_REPORT when set."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from tests.cluster.test_takeover import client
from tests.conftest import parse_sse, wait_until

REPORT = os.environ.get("DATADESK_MULTIHOST_REPORT")


def report(test: str, rows: dict[str, Any]) -> None:
    """Print `rows` as a table; append them as one JSON line to $DATADESK_MULTIHOST_REPORT."""
    width = max(len(k) for k in rows)
    print(f"\n{test}\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows.items()))
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps({"test": test, **rows}) + "\n")


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.95 + 0.999) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def new_thread(base: str, token: str) -> str:
    with client(base, token) as c:
        r = c.post("/api/threads", json={})
        assert r.status_code == 201, r.text
        return r.json()["id"]


def turn(base: str, token: str, tid: str, content: str, timeout: float = 120) -> list[tuple[str, dict]]:
    """One whole turn; its SSE events (the last one is `done`)."""
    with client(base, token) as c:
        r = c.post(f"/api/threads/{tid}/messages", json={"content": content}, timeout=timeout)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        events = parse_sse(r.text)
    assert events and events[-1][0] == "done", events[-3:]
    return events


def records(base: str, token: str, tid: str) -> list[dict[str, Any]]:
    with client(base, token) as c:
        r = c.get(f"/api/threads/{tid}", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()["records"]


def kept(recs: list[dict[str, Any]]) -> list[tuple]:
    """What a record is, apart from how the page renders it."""
    return [(r["seq"], r["role"], r.get("status"), r.get("content"), r.get("turn_id")) for r in recs]


def tool_output(recs: list[dict[str, Any]]) -> str:
    tools = [r for r in recs if r["role"] == "tool"]
    assert tools, kept(recs)
    return str(tools[-1].get("content"))


class Feed(threading.Thread):
    """An SSE stream read in the background: (id, event, data, monotonic time) as they come."""

    def __init__(self, base: str, token: str, method: str, path: str, body: Any = None) -> None:
        super().__init__(daemon=True)
        self.args = (base, token, method, path, body)
        self.got: list[tuple[str | None, str, dict[str, Any], float]] = []
        self.status: int | None = None
        self.http: httpx.Client | None = None

    def run(self) -> None:
        base, token, method, path, body = self.args
        with contextlib.suppress(httpx.HTTPError, RuntimeError), client(base, token) as self.http, \
                self.http.stream(method, path, json=body, timeout=httpx.Timeout(120, read=120)) as r:
            self.status = r.status_code
            eid, ev = None, "message"
            for line in r.iter_lines():
                if line.startswith("id:"):
                    eid = line[3:].strip()
                elif line.startswith("event:"):
                    ev = line[6:].strip()
                elif line.startswith("data:"):
                    self.got.append((eid, ev, msgspec.json.decode(line[5:].strip()), time.monotonic()))
                    eid, ev = None, "message"

    def ids(self) -> list[str]:
        return [i for i, *_ in list(self.got) if i]

    def events(self) -> list[str]:
        return [e for _, e, _, _ in list(self.got)]

    def count(self, event: str) -> int:
        return self.events().count(event)

    def ended(self) -> bool:
        return "done" in self.events()

    def when(self, event: str) -> float:
        return next(t for _, e, _, t in self.got if e == event)

    def abandon(self) -> None:
        """Stop reading (a stream from a host that is gone)."""
        with contextlib.suppress(Exception):
            if self.http is not None:
                self.http.close()


def started_turn(base: str, token: str, tid: str, content: str, events: int = 1) -> Feed:
    feed = Feed(base, token, "POST", f"/api/threads/{tid}/messages", {"content": content})
    feed.start()
    wait_until(lambda: len(feed.got) >= events or feed.ended(), timeout=60)
    return feed


def cancel(base: str, token: str, tid: str) -> None:
    with client(base, token) as c:
        r = c.post(f"/api/threads/{tid}/cancel")
    assert r.status_code == 200 and r.json()["cancelled"], r.text


def post_status(base: str, token: str, tid: str, content: str) -> tuple[int, str]:
    """The status of a turn's POST (a 200's stream is left at once: the turn runs on)."""
    with client(base, token) as c, c.stream("POST", f"/api/threads/{tid}/messages",
                                            json={"content": content}) as r:
        return r.status_code, "" if r.status_code == 200 else r.read().decode()[:200]


def kernel_of(pid: int) -> str:
    """The gateway's id of the kernel process `pid` (its connection file is kernel-<id>.json)."""
    with contextlib.suppress(OSError):
        found = re.search(rb"kernel-([0-9a-f-]{36})\.json", Path(f"/proc/{pid}/cmdline").read_bytes())
        if found:
            return found.group(1).decode()
    return f"pid {pid}"


def artifacts(base: str, token: str, tid: str) -> list[dict[str, Any]]:
    with client(base, token) as c:
        got = c.get(f"/api/threads/{tid}/artifacts").json()
    return got if isinstance(got, list) else got["artifacts"]


def ask_python(base: str, token: str, tid: str, code: str) -> str:
    """A python call through host `base`; what the tool recorded."""
    events = turn(base, token, tid, "py:" + code)
    assert events[-1][1]["status"] == "ok", events[-3:]
    return tool_output(records(base, token, tid))




# --------------------------------------------------------------------------- what runs

def listening_ports() -> set[int]:
    """The TCP ports something listens on in this network namespace (/proc/net/tcp{,6})."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A":  # LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


# --------------------------------------------------------------------------- where the CPU went

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds of the process and of its reaped children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0.0
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK


def cpu_seconds(roots: dict[int, str]) -> dict[str, float]:
    """CPU seconds used so far by each named process tree (`roots`: pid -> name), by the rest of
    the machine ("others": other people's work, the kernel's threads) and in all ("machine")."""
    procs = {int(d): _stat(int(d)) for d in os.listdir("/proc") if d.isdigit()}
    out = dict.fromkeys([*roots.values(), "others"], 0.0)
    for pid, (_, used) in procs.items():
        up, name = pid, "others"
        for _ in range(64):
            if up in roots:
                name = roots[up]
                break
            up = procs.get(up, (0, 0.0))[0]
            if up <= 1:
                break
        out[name] += used
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    out["machine"] = (sum(ticks) - ticks[3] - ticks[4]) / TICK  # all but idle and iowait
    return out


def cpu_use(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """CPUs used on average over `seconds` by each part."""
    return {k: round((after[k] - before.get(k, 0.0)) / seconds, 2) for k in after}
