"""SIGKILL at random moments (issue 25): nothing a client was told about is lost.

The real server (`python -m datadesk.cli serve`, its own home in a temp dir, the local sandbox
backend so that the python tool is there and large results are offloaded, no kernel started)
talks to a fake OpenAI server in this process, which streams long answers slowly, asks for a
`sql_query` with a large result and for `remember` calls. Clients (httpx, in threads) run one
kind of work and write down everything they are told: every SSE event that names a `seq`, every
`artifact.created`, every upload answered 201, every fact the memory API answered 201 and every
`remember` that finished ok. At a random moment (a seeded RNG) the server is killed with SIGKILL;
then the data directory is read directly, not through the app:

- every complete line of every `*.jsonl` parses; in `log.jsonl` the seqs go 1, 2, 3... (never
  repeated); only the last line may be torn, and only when nobody was told about it;
- every record a client was told about is on disk with the same content;
- every artifact whose metadata says `ready`/`partial` has its data file with the rows, bytes
  and SHA-256 its metadata says (Parquet read whole with pyarrow); every told artifact, upload and
  fact is there; every other JSON document parses.

Then the server is started again on the same home: it answers `/api/health` within 30 s; a new
turn on every thread the trial touched answers, and the request the model got for it pairs
every tool call with a tool result; the thread, its artifacts and the memory panel are served;
every log ends with a whole line again; and no temp file whose owner tag names the killed
process remains (the start-up sweep). That restarted server runs the next trial.

Kinds: `offload` (a query of 1-2M rows written to Parquet, 1-5M with DATADESK_FAULT_BIG=1),
`answer` (a ~300,000-character answer streamed slowly), `memory` (the memory API in a loop and
a turn of `remember` calls), `upload` (a CSV of 5-20 MB, 50 MB with DATADESK_FAULT_BIG=1) and
`mix` (all at once). DATADESK_FAULT_TRIALS (default 2) trials per kind; DATADESK_FAULT_SEED fixes
the seed; DATADESK_FAULT_REPORT=<file> appends one JSON line per trial (kill point, what was told,
what held).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from datadesk.store.layout import Layout
from datadesk.store.tempnames import host_hash, proc_start
from datadesk.store.users import UserStore
from datadesk.store.workspaces import ensure_demo_workspace
from tests.conftest import free_port, parse_sse
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

# serial: kills at timed moments and bounds the restart (BACK_WITHIN_S); a busy CPU moves both
pytestmark = [pytest.mark.faults, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("offload", "answer", "memory", "upload", "mix")
TRIALS = int(os.environ.get("DATADESK_FAULT_TRIALS") or 2)
BIG = os.environ.get("DATADESK_FAULT_BIG") == "1"
SEED = int(os.environ.get("DATADESK_FAULT_SEED") or random.SystemRandom().randrange(1 << 31))
REPORT = os.environ.get("DATADESK_FAULT_REPORT")
BACK_WITHIN_S = 30.0  # the only timed bound: the restarted server answers within this
ROWS = (1_000_000, 5_000_000) if BIG else (1_000_000, 2_000_000)
UPLOAD_MB = (5, 50) if BIG else (5, 20)
ANSWER_CHARS = 300_000
# when the kill comes, in ms after the trial's work started (uniform)
KILL_MS = {"offload": (150, 6_000), "answer": (150, 4_500), "memory": (150, 2_500),
           "upload": (150, 6_000), "mix": (300, 7_000)} if BIG else \
    {"offload": (150, 3_000), "answer": (150, 3_500), "memory": (150, 2_000), "upload": (150, 3_000),
     "mix": (300, 4_000)}

SETTINGS = """
[chat]
max_turns_per_user = 20
max_steps = 40
[sandbox]
backend = "local"
pool_size = 0
[summary]
enabled = false
[memory]
max_active = 100000
max_total_chars = 100000000
max_inactive = 100000
[server]
requests_per_minute_per_user = 0
requests_in_flight_per_user = 0
streams_per_user = 0
[store]
min_free_mb = 0
[limits]
sql_queries_per_user = 4
sql_queries = 4
uploads_per_user = 2
"""


# -- the model: replies follow the request ----------------------------------------------------------

def _last_user(messages: list[dict[str, Any]]) -> tuple[int, str]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            content = messages[i].get("content")
            return i, content if isinstance(content, str) else json.dumps(content)
    return -1, ""


def model_reply(req: dict[str, Any]) -> FakeReply:
    """`offload:<rows>:<tag>` asks for a query of that many rows; `answer:<chars>:<tag>` streams
    an answer of that size slowly; `remember:<rounds>:<tag>` asks for three `remember` calls a
    step for that many steps; anything else gets a short answer."""
    messages = req.get("messages") or []
    at, text = _last_user(messages)
    after = messages[at + 1:]
    steps_done = sum(1 for m in after if m.get("role") == "assistant" and m.get("tool_calls"))
    m = re.match(r"(offload|answer|remember):(\d+):(\S+)", text)
    if m is None:
        return FakeReply(text=f"fine: {text[:80]}", chunks=2)
    what, n, tag = m.group(1), int(m.group(2)), m.group(3)
    if what == "offload":
        if steps_done:
            return FakeReply(text=f"the {n} rows are in the artifact ({tag})", chunks=2)
        sql = f"SELECT range AS id, md5(range::VARCHAR) AS note, range * 0.5 AS x FROM range({n})"
        return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": sql}}])
    if what == "answer":
        body = (f"Part {tag}. " + "All the numbers, one by one, and what they mean. " * (n // 48 + 1))[:n]
        return FakeReply(text=body, chunks=max(1, n // 500), delay_s=0.004)
    if steps_done < n:  # remember
        calls = [{"name": "remember", "arguments": {"text": f"Remembered fact {tag} step {steps_done} item {i}"}}
                 for i in range(3)]
        return FakeReply(tool_calls=calls)
    return FakeReply(text=f"remembered ({tag})", chunks=2)


# -- what the clients were told ---------------------------------------------------------------------

@dataclass
class Told:
    """Everything the server acknowledged to a client, over all trials on one home."""

    records: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (tid, seq) -> what
    artifacts: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # aid -> (tid, ref)
    uploads: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # aid -> (tid, artifact)
    facts: dict[str, str] = field(default_factory=dict)  # fact id -> text
    lock: threading.Lock = field(default_factory=threading.Lock)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"records": len(self.records), "artifacts": len(self.artifacts),
                    "uploads": len(self.uploads), "facts": len(self.facts)}


class Cut(Exception):
    """A turn's stream ended without `done`: the server died under it."""


class Worker(threading.Thread):
    """One client's work in a loop until the server dies (or `stop`); `doing` says what it is
    doing now and since when (for the report of the kill point)."""

    def __init__(self, name: str, body: Callable[["Worker"], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.body = body
        self.stop = threading.Event()
        self.doing = "starting"
        self.since = time.monotonic()
        self.done_units = 0
        self.error: BaseException | None = None

    def now(self, doing: str) -> None:
        self.doing, self.since = doing, time.monotonic()

    def run(self) -> None:
        try:
            self.body(self)
        except (httpx.HTTPError, OSError, Cut):
            pass  # the server died under the request: what matters is what was told before
        except BaseException as exc:  # a bug of the test: reported by the trial
            self.error = exc


def stream_turn(c: httpx.Client, tid: str, content: str, told: Told, w: Worker | None = None) -> list[tuple[str, Any]]:
    """POST a message and read its SSE stream event by event, writing down each acknowledgement as
    it arrives. Returns the events seen (the stream may end early: the server died)."""
    events: list[tuple[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": content}) as r:
        if r.status_code != 200:
            raise AssertionError(f"turn refused: {r.status_code} {r.read()[:300]!r}")
        ev, data = "message", []
        for line in r.iter_lines():
            if line.startswith("event:"):
                ev = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line == "" and data:
                payload = json.loads("\n".join(data))
                events.append((ev, payload))
                note(told, tid, ev, payload, calls, w)
                ev, data = "message", []
    if not events or events[-1][0] != "done":
        raise Cut()
    return events


def note(told: Told, tid: str, ev: str, d: dict[str, Any], calls: dict[str, dict[str, Any]], w: Worker | None) -> None:
    with told.lock:
        if ev == "tool.started":
            calls[d["call_id"]] = d
            if w is not None:
                w.now(f"tool {d['name']} running")
        elif ev == "tool.finished":
            told.records[(tid, d["seq"])] = {"role": "tool", "call_id": d["call_id"], "ok": d["ok"], "name": d["name"]}
            meta = d.get("meta") or {}
            if d["name"] == "remember" and d["ok"] and meta.get("fact"):
                told.facts[meta["fact"]] = json.loads(calls[d["call_id"]]["arguments"])["text"]
        elif ev == "artifact.created":
            art = d["artifact"]
            if "id" in art:
                told.artifacts[art["id"]] = (tid, art)
        elif ev == "message.completed":
            told.records[(tid, d["seq"])] = {"role": "assistant", "content": d["content"]}
        elif ev == "message.delta" and w is not None and not w.doing.startswith("streaming"):
            w.now("streaming the answer")


# -- the server as a process ------------------------------------------------------------------------

class Server:
    """`python -m datadesk.cli serve` on `home` (single process: its pid writes every temp file)."""

    def __init__(self, home: Path, fake: FakeOpenAIServer) -> None:
        self.home, self.fake = home, fake
        self.proc: subprocess.Popen | None = None
        self.base = ""
        self.starts = 0
        self.pid_tag = ""

    def start(self) -> float:
        """Start it and wait for /api/health; returns the seconds that took (asserted under
        BACK_WITHIN_S)."""
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATADESK_"))}
        env.update(PYTHONPATH=str(ROOT / "platform"), PYTHONUNBUFFERED="1", DATADESK_HOME=str(self.home),
                   DATADESK_CONFIG=str(self.home.parent / "datadesk.toml"), DATADESK_LLM_BASE_URL=self.fake.base_url,
                   DATADESK_LLM_API_KEY="sk-test", DATADESK_LLM_MODEL="fake-model")
        self.starts += 1
        log = self.home.parent / f"serve-{self.starts}.log"
        t0 = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "datadesk.cli", "serve", "--port", str(port)],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.home.parent)
        self.base = f"http://127.0.0.1:{port}"
        start = None
        while True:
            if start is None:
                start = proc_start(self.proc.pid)
            try:
                if httpx.get(f"{self.base}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            took = time.monotonic() - t0
            assert self.proc.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
            assert took < BACK_WITHIN_S, f"no /api/health within {BACK_WITHIN_S} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        self.pid_tag = f"~{host_hash()}-{self.proc.pid}-{start or proc_start(self.proc.pid) or 0}~"
        return time.monotonic() - t0

    @property
    def log(self) -> Path:
        return self.home.parent / f"serve-{self.starts}.log"

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "the server died before the kill"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# -- reading the data directory directly ------------------------------------------------------------

def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def jsonl_lines(path: Path, strict: bool = True) -> tuple[list[dict[str, Any]], bytes, int]:
    """The complete lines of a JSONL file, parsed, the torn tail (b"" when the file ends with a
    newline) and how many complete lines did not parse (`strict`: one fails)."""
    raw = path.read_bytes()
    body, nl, tail = raw.rpartition(b"\n")
    out, bad = [], 0
    for n, line in enumerate(body.split(b"\n") if nl else [], 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            if strict:
                raise AssertionError(f"{path}: line {n} does not parse: {line[:200]!r}") from None
            bad += 1
    return out, tail, bad


def thread_dirs(home: Path) -> Iterator[Path]:
    yield from sorted(p.parent for p in (home / "workspaces").glob("*/users/*/threads/*/meta.json"))


def check_disk(home: Path, told: Told, after_restart: bool = False,
               verified: dict[str, tuple[int, int, int]] | None = None) -> dict[str, Any]:
    """Everything on disk is readable and every acknowledged thing is there; returns counts.
    `verified`: data files already read whole, by (inode, mtime, size): not read again unchanged."""
    verified = {} if verified is None else verified
    import pyarrow.parquet as pq

    stats: dict[str, Any] = {"threads": 0, "records": 0, "torn_tails": [], "unparsed_lines": [],
                             "artifacts_ready": 0, "parquet_rows": 0, "facts_on_disk": 0}
    logs: dict[str, dict[int, dict[str, Any]]] = {}
    for tdir in thread_dirs(home):
        stats["threads"] += 1
        json.loads((tdir / "meta.json").read_bytes())
        for f in tdir.iterdir():
            if f.suffix == ".jsonl" and not is_temp(f.name):
                # the log strictly; the others' readers skip a line they cannot read (counted)
                lines, tail, bad = jsonl_lines(f, strict=f.name == "log.jsonl")
                if bad:
                    stats["unparsed_lines"].append(f"{tdir.name}/{f.name}: {bad}")
                if tail:
                    stats["torn_tails"].append(f"{tdir.name}/{f.name}: {len(tail)} bytes")
                    assert not (after_restart and f.name == "log.jsonl"), f"{f}: still torn after a new turn"
                if f.name == "log.jsonl":
                    seqs = [r["seq"] for r in lines]
                    assert seqs == list(range(1, len(seqs) + 1)), f"{f}: seqs {seqs}"
                    logs[tdir.name] = {r["seq"]: r for r in lines}
                    stats["records"] += len(lines)
            elif f.suffix == ".json" and not is_temp(f.name):
                json.loads(f.read_bytes())  # written by rename: old or new, never a part
        adir = tdir / "artifacts"
        for meta in sorted(adir.glob("*.json")) if adir.is_dir() else []:
            art = json.loads(meta.read_bytes())
            if art["status"] not in ("ready", "partial"):
                continue
            data = adir / art["file"]
            assert data.is_file(), f"{meta}: {art['status']} but {data.name} is missing"
            st = data.stat()
            stats["artifacts_ready"] += 1
            stats["parquet_rows"] += art["rows"] or 0
            if verified.get(f"{data}:{art['sha256']}") == (st.st_ino, st.st_mtime_ns, st.st_size):
                continue
            with open(data, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            assert (digest, st.st_size) == (art["sha256"], art["bytes"]), f"{data}: hash or size differ"
            if art["format"] == "parquet":
                pf = pq.ParquetFile(data)
                rows = sum(b.num_rows for b in pf.iter_batches(batch_size=262_144))  # every page decodes
                assert (rows, len(pf.schema_arrow)) == (art["rows"], art["columns"]), meta
            verified[f"{data}:{art['sha256']}"] = (st.st_ino, st.st_mtime_ns, st.st_size)
    with told.lock:
        records, artifacts = dict(told.records), dict(told.artifacts)
        uploads, facts = dict(told.uploads), dict(told.facts)
    for (tid, seq), want in records.items():
        rec = logs.get(tid, {}).get(seq)
        assert rec is not None, f"thread {tid}: seq {seq} was acknowledged ({want}) but is not in log.jsonl"
        assert rec["role"] == want["role"], (tid, seq, rec["role"], want)
        if want["role"] == "assistant":
            assert rec.get("content", "") == want["content"], f"thread {tid} seq {seq}: other content on disk"
        else:
            assert rec.get("tool_call_id") == want["call_id"], (tid, seq, rec, want)
            assert (rec.get("status", "ok") == "ok") == want["ok"], (tid, seq, rec.get("status"), want)
    for aid, (tid, ref) in {**artifacts, **uploads}.items():
        meta = next(home.glob(f"workspaces/*/users/*/threads/{tid}/artifacts/{aid}.json"), None)
        assert meta is not None, f"artifact {aid} was announced but its metadata is gone"
        art = json.loads(meta.read_bytes())
        assert art["status"] in ("ready", "partial") and art["rows"] == ref["rows"], (aid, art["status"], ref)
    memory = {}
    for mfile in home.glob("workspaces/*/users/*/memory.json"):
        memory.update({f["id"]: f for f in json.loads(mfile.read_bytes()).get("facts", [])})
    stats["facts_on_disk"] = len(memory)
    spill = home / "tmp" / "sql"  # DuckDB's spill folders (not tagged: reported, not asserted)
    stats["sql_spill_left"] = len(list(spill.iterdir())) if spill.is_dir() else 0
    for fid, text in facts.items():
        assert fid in memory, f"fact {fid} ({text!r}) was acknowledged but is not in memory.json"
        assert memory[fid]["text"] == text, (fid, memory[fid]["text"], text)
    return stats


def temp_files_of(home: Path, tag: str) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob(f"*{tag}*"))


def pairs_every_call(messages: list[dict[str, Any]]) -> list[str]:
    """What is unpaired in a request: calls without a result, results without a call."""
    calls = [c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    results = [m.get("tool_call_id") for m in messages if m.get("role") == "tool"]
    return [f"call {c} has no result" for c in calls if c not in results] + \
        [f"result {r} has no call" for r in results if r not in calls]


# -- the work ---------------------------------------------------------------------------------------

@dataclass
class Home:
    home: Path
    token: str
    told: Told
    server: Server
    fake: FakeOpenAIServer
    csv: dict[int, tuple[Path, int]]  # MB -> (file, rows)
    verified: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # data files read whole

    def client(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.server.base, headers={"Authorization": f"Bearer {self.token}"},
                            timeout=timeout)

    def new_thread(self, title: str) -> str:
        with self.client() as c:
            r = c.post("/api/threads", json={"title": title})
            assert r.status_code == 201, r.text
            return r.json()["id"]


def offload_work(h: Home, tid: str, rng: random.Random, tag: str) -> Callable[[Worker], None]:
    def body(w: Worker) -> None:
        with h.client() as c:
            while not w.stop.is_set():
                rows = rng.randint(*ROWS)
                w.now(f"offload of {rows:,} rows (turn {w.done_units + 1})")
                events = stream_turn(c, tid, f"offload:{rows}:{tag}-{w.done_units}", h.told, w)
                assert [d for e, d in events if e == "artifact.created"], events[-4:]
                w.done_units += 1
    return body


def answer_work(h: Home, tid: str, tag: str) -> Callable[[Worker], None]:
    def body(w: Worker) -> None:
        with h.client() as c:
            while not w.stop.is_set():
                w.now(f"answer of {ANSWER_CHARS:,} chars (turn {w.done_units + 1}), waiting for the model")
                events = stream_turn(c, tid, f"answer:{ANSWER_CHARS}:{tag}-{w.done_units}", h.told, w)
                assert [d for e, d in events if e == "message.completed"], events[-3:]
                w.done_units += 1
    return body


def remember_work(h: Home, tid: str, tag: str) -> Callable[[Worker], None]:
    def body(w: Worker) -> None:
        with h.client() as c:
            while not w.stop.is_set():
                w.now(f"turn of 8 x 3 remember calls (turn {w.done_units + 1})")
                stream_turn(c, tid, f"remember:8:{tag}-{w.done_units}", h.told, w)
                w.done_units += 1
    return body


def panel_work(h: Home, tag: str) -> Callable[[Worker], None]:
    def body(w: Worker) -> None:
        with h.client() as c:
            while not w.stop.is_set():
                text = f"Panel fact {tag} number {w.done_units}"
                w.now(f"POST /api/memory #{w.done_units + 1}")
                r = c.post("/api/memory", json={"text": text, "importance": 2})
                assert r.status_code == 201, r.text
                with h.told.lock:
                    h.told.facts[r.json()["id"]] = text
                w.done_units += 1
    return body


def upload_work(h: Home, tid: str, rng: random.Random) -> Callable[[Worker], None]:
    def body(w: Worker) -> None:
        with h.client(timeout=300) as c:
            while not w.stop.is_set():
                mb = rng.choice(sorted(h.csv))
                path, rows = h.csv[mb]
                w.now(f"upload of {mb} MB ({rows:,} rows) #{w.done_units + 1}")
                with open(path, "rb") as fh:
                    r = c.post(f"/api/threads/{tid}/uploads", files={"file": (f"data{w.done_units}.csv", fh)})
                assert r.status_code == 201, r.text
                art = r.json()["artifact"]
                assert art["rows"] == rows, art
                with h.told.lock:
                    h.told.uploads[art["id"]] = (tid, art)
                w.done_units += 1
    return body


def workers_for(kind: str, h: Home, rng: random.Random, tag: str) -> tuple[list[Worker], list[str]]:
    tids: list[str] = []

    def thread(title: str) -> str:
        tids.append(h.new_thread(f"{title} {tag}"))
        return tids[-1]

    made: list[Worker] = []
    if kind in ("offload", "mix"):
        made.append(Worker("offload", offload_work(h, thread("offload"), rng, tag)))
    if kind in ("answer", "mix"):
        made.append(Worker("answer", answer_work(h, thread("answer"), tag)))
    if kind in ("memory", "mix"):
        made.append(Worker("remember", remember_work(h, thread("remember"), tag)))
        made.append(Worker("memory-api", panel_work(h, tag)))
    if kind in ("upload", "mix"):
        made.append(Worker("upload", upload_work(h, thread("upload"), rng)))
    return made, tids


def after_restart(h: Home, tids: list[str], trial: str) -> None:
    """A new turn answers on every touched thread, its request pairs every call, the app serves the
    thread, its artifacts and the memory panel."""
    with h.client() as c:
        for tid in tids:
            content = f"after the restart {trial} {tid}"
            events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": content}).text)
            assert events and events[-1][0] == "done" and events[-1][1]["status"] == "ok", (tid, events[-3:])
            done = [d for e, d in events if e == "message.completed"]
            assert done and done[0]["content"].startswith("fine:"), events[-3:]
            with h.told.lock:
                h.told.records[(tid, done[0]["seq"])] = {"role": "assistant", "content": done[0]["content"]}
            req = next(r for r in reversed(h.fake.requests) if _last_user(r.get("messages") or [])[1] == content)
            unpaired = pairs_every_call(req["messages"])
            assert not unpaired, f"thread {tid}: the request after the restart {unpaired}"
            assert c.get(f"/api/threads/{tid}").status_code == 200
            assert c.get(f"/api/threads/{tid}/context").status_code == 200
            arts = c.get(f"/api/threads/{tid}/artifacts")
            assert arts.status_code == 200, arts.text
            for art in arts.json():
                if art["status"] in ("ready", "partial") and art["format"] == "parquet":
                    rows = art["rows"]  # the app reads the file's last rows (its last row group)
                    r = c.get(f"/api/artifacts/{art['id']}/rows", params={"offset": max(0, rows - 5), "limit": 5})
                    assert r.status_code == 200 and r.json()["total_rows"] == rows, r.text[:300]
        assert c.get("/api/memory").status_code == 200


def make_csv(path: Path, mb: int) -> int:
    """A CSV of about `mb` MB (pyarrow writes it); returns its rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    rows = mb * 1024 * 1024 // 42
    ids = pa.array(range(rows), pa.int64())
    city = pc.binary_join_element_wise("city-", pc.cast(pc.modulo(ids, 97), pa.string()), "")
    table = pa.table({"id": ids, "city": city, "kwh": pc.multiply(pc.cast(ids, pa.float64()), 0.25),
                      "note": pc.binary_join_element_wise("reading ", pc.cast(ids, pa.string()), "")})
    pacsv.write_csv(table, path)
    return rows


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, int]]:
    folder = tmp_path_factory.mktemp("sigkill-csv")
    lo, hi = UPLOAD_MB
    return {mb: (folder / f"{mb}mb.csv", make_csv(folder / f"{mb}mb.csv", mb)) for mb in sorted({lo, hi})}


class Homes:
    """One home for the whole module: the kinds run one after the other on it (what the earlier
    kinds were told must still hold), the server restarted once per trial. A kind that fails
    leaves the next kind a fresh home."""

    def __init__(self, folder: Path, warehouse: Path, csv: dict[int, tuple[Path, int]]) -> None:
        self.folder, self.warehouse, self.csv = folder, warehouse, csv
        self.fake = FakeOpenAIServer().start()
        self.fake.responder = model_reply
        self.current: Home | None = None
        self.made = 0

    def get(self) -> Home:
        if self.current is None:
            self.made += 1
            home = self.folder / f"home{self.made}" / "var"
            layout = Layout(home)
            layout.workspace_data_dir("demo").mkdir(parents=True)
            shutil.copy(self.warehouse / "warehouse.duckdb", layout.workspace_data_dir("demo") / "warehouse.duckdb")
            ensure_demo_workspace(layout, memory=True)
            _, token = UserStore(layout).add("alice", ["demo"], ["code_execution", "memory"])
            (home.parent / "datadesk.toml").write_text(SETTINGS)
            self.current = Home(home, token, Told(), Server(home, self.fake), self.fake, self.csv)
        if self.current.server.proc is None or self.current.server.proc.poll() is not None:
            self.current.server.start()
        return self.current

    def discard(self) -> None:
        if self.current is not None:
            self.current.server.stop()
            self.current = None

    def close(self) -> None:
        self.discard()
        self.fake.stop()


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory, demo_warehouse_dir: Path, csv_files) -> Iterator[Homes]:
    made = Homes(tmp_path_factory.mktemp("sigkill"), demo_warehouse_dir, csv_files)
    try:
        yield made
    finally:
        made.close()


def report(line: dict[str, Any]) -> None:
    print(json.dumps(line))
    if REPORT:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps(line) + "\n")


@pytest.mark.timeout(max(300, 60 * TRIALS))  # DATADESK_FAULT_TRIALS=20 runs longer than the default 300 s
@pytest.mark.parametrize("kind", KINDS)
def test_sigkill_loses_nothing_acknowledged(homes: Homes, kind: str) -> None:
    h = homes.get()
    try:
        run_trials(h, kind)
    except BaseException:
        homes.discard()
        raise


def run_trials(h: Home, kind: str) -> None:
    rng = random.Random(f"{SEED}-{kind}")
    for trial in range(TRIALS):
        name = f"{kind}#{trial + 1} seed={SEED}"
        tag = f"t{trial}{rng.randrange(1 << 20):x}"
        workers, tids = workers_for(kind, h, rng, tag)
        kill_ms = rng.uniform(*KILL_MS[kind])
        t0 = time.monotonic()
        for w in workers:
            w.start()
        time.sleep(max(0.0, t0 + kill_ms / 1000 - time.monotonic()))
        at_kill = {w.name: f"{w.doing} for {1000 * (time.monotonic() - w.since):.0f} ms, {w.done_units} done"
                   for w in workers}
        killed_tag = h.server.pid_tag
        h.server.kill()
        for w in workers:
            w.stop.set()
            w.join(60)
            assert not w.is_alive(), f"{name}: client {w.name} hangs after the kill"
            assert w.error is None, f"{name}: client {w.name} failed: {w.error!r}"
        try:
            held = check_disk(h.home, h.told, verified=h.verified)
        except AssertionError as exc:
            raise AssertionError(f"{name}: killed at {kill_ms:.0f} ms ({at_kill}): {exc}") from None
        back_s = h.server.start()
        try:
            after_restart(h, tids, f"{kind}{trial}")
            deadline = time.monotonic() + BACK_WITHIN_S  # the sweep runs in the background at start
            while (left := temp_files_of(h.home, killed_tag)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not left, f"temp files of the killed process remain after the restart: {left}"
            after = check_disk(h.home, h.told, after_restart=True, verified=h.verified)
        except AssertionError as exc:
            raise AssertionError(f"{name}: killed at {kill_ms:.0f} ms ({at_kill}): {exc}\n"
                                 f"server log: {h.server.log.read_text()[-2000:]}") from None
        report({"kind": kind, "trial": trial + 1, "seed": SEED, "kill_ms": round(kill_ms), "at_kill": at_kill,
                "told": h.told.counts(), "held": held, "after_restart": after, "back_s": round(back_s, 2)})
