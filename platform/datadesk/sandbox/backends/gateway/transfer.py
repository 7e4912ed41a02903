"""Files of a gateway kernel that shares no volume with the app (`sandbox.gateway_files =
"presigned"`, SCALE.md 5.4): /data in by presigned GETs, /outputs back by presigned PUTs.

At each start (and restart) `SETUP_CODE` makes the kernel's data and outputs folders, enters
the outputs folder and installs a small helper module, `_datadesk_files`, in the kernel:

- `sync(data, wanted, timeout)`: before each cell, `wanted` lists the thread's available
  artifacts (name, size, sha256, a presigned GET URL valid for minutes, one object each). A
  file already there and verified stays; a missing or different one is downloaded to a
  temporary name, checked (size never above the expected one, then the sha256), set read-only
  and renamed into place; anything else in the folder goes. It prints one JSON line: what it
  fetched and what failed, in words.
- `scan(outputs, limit)`: after the cell, the regular files (and links, pipes, sockets, to be
  reported) under /outputs that it has not sent yet, without following links, as JSON.
- `put(items, marks, timeout)`: each item is a file the app chose (within `sandbox.outputs_mb`)
  with a presigned PUT URL whose key and content length the app fixed; the file is opened
  without following a link, must still have that size, and is sent with `If-None-Match: *`.
  `marks` are files the app will not take (over the quota): marked seen, as sent ones are.

The kernel keeps what it sent (`SEEN`), so a worker of another host that attaches later does not
collect the same file twice. The kernel is untrusted: everything it prints is parsed as data,
names are checked again by the app (`files.plan_outputs`), and what it put is read back from
the store with its signed length (`KernelFiles.take`). It never holds store credentials.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from datadesk.sandbox.backends.gateway.config import ENTER_OUTPUTS
from datadesk.sandbox.base import SandboxUnavailable
from datadesk.sandbox.files import OutputFile, plan_outputs
from datadesk.store.interfaces.kernelfiles import KernelFiles, KernelFilesUnavailable, KernelUpload

if TYPE_CHECKING:
    from datadesk.sandbox.backends.gateway.channel import GatewayChannel
    from datadesk.sandbox.execution import OnTimeout

MAX_LISTED = 1000  # entries of /outputs one scan reports (the app takes at most 200 files)
FETCH_TIMEOUT_S = 60.0  # one download or upload, socket-level

HELPER_SOURCE = r'''
import hashlib, json, os, stat, urllib.request
SEEN = {}
VERIFIED = {}
CHUNK = 1 << 20

def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()

def _drop(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.chmod(path, 0o600) if stat.S_ISREG(st.st_mode) else None
        os.unlink(path)

def _fetch(url, dest, size, sha, timeout):
    tmp = os.path.join(os.path.dirname(dest), ".part-" + os.path.basename(dest))
    _drop(tmp)
    h, got = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "xb") as f:
            while True:
                chunk = r.read(CHUNK)
                if not chunk:
                    break
                got += len(chunk)
                if got > size:
                    raise ValueError("the store sent more than the %d bytes expected" % size)
                h.update(chunk)
                f.write(chunk)
        if got != size:
            raise ValueError("the store sent %d bytes, not %d" % (got, size))
        if sha and h.hexdigest() != sha:
            raise ValueError("its sha256 differs from the artifact's")
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    finally:
        _drop(tmp)

def _current(dest, size, sha):
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    if VERIFIED.get(dest) == (stamp, sha):
        return True
    if sha and _digest(dest) != sha:
        return False
    VERIFIED[dest] = (stamp, sha)
    return True

def sync(data, wanted, timeout):
    names, fetched, failed = set(), 0, []
    for w in wanted:
        name, size, sha = w["name"], int(w["size"]), w["sha256"]
        if not name or "/" in name or name.startswith("."):
            continue
        names.add(name)
        dest = os.path.join(data, name)
        if _current(dest, size, sha):
            continue
        _drop(dest)
        try:
            _fetch(w["url"], dest, size, sha, timeout)
            st = os.lstat(dest)
            VERIFIED[dest] = ((st.st_size, st.st_mtime_ns, st.st_ino), sha)
            fetched += 1
        except Exception as e:
            failed.append([name, "%s: %s" % (type(e).__name__, e)])
    for entry in os.listdir(data):
        if entry not in names:
            _drop(os.path.join(data, entry))
    print(json.dumps({"fetched": fetched, "failed": failed}))

def scan(outputs, limit):
    out = []
    def walk(folder, prefix, depth):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if len(out) >= limit:
                return
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth < 8:
                    walk(entry.path, rel + "/", depth + 1)
                continue
            kind = "f" if stat.S_ISREG(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else \
                "p" if stat.S_ISFIFO(st.st_mode) else "s" if stat.S_ISSOCK(st.st_mode) else "o"
            if SEEN.get(rel) == [st.st_size, st.st_mtime_ns]:
                continue
            out.append([kind, st.st_size, st.st_mtime_ns, rel])
    walk(outputs, "", 0)
    print(json.dumps(out))

def put(outputs, items, marks, timeout):
    for rel, size, mtime_ns in marks:
        SEEN[rel] = [size, mtime_ns]
    results = []
    for rel, url, size, mtime_ns in items:
        try:
            fd = os.open(os.path.join(outputs, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                    raise ValueError("it changed while being collected")
                req = urllib.request.Request(url, data=f, method="PUT", headers={
                    "Content-Length": str(size), "If-None-Match": "*",
                    "Content-Type": "application/octet-stream"})
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    r.read()
            SEEN[rel] = [size, mtime_ns]
            results.append([rel, ""])
        except Exception as e:
            results.append([rel, "%s: %s" % (type(e).__name__, e)])
    print(json.dumps(results))
'''

SETUP_CODE = """
def _datadesk_setup(data, outputs, source):
    import os, sys, types
    for folder in (data, outputs):
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise RuntimeError("the kernel cannot write to %s" % folder)
    module = types.ModuleType("_datadesk_files")
    exec(compile(source, "<datadesk files>", "exec"), module.__dict__)
    sys.modules["_datadesk_files"] = module
""" + ENTER_OUTPUTS + """_datadesk_setup({data!r}, {outputs!r}, {source!r})
del _datadesk_setup
"""


async def set_up(channel: GatewayChannel, data: str, outputs: str, timeout_s: float,
                 interrupt: OnTimeout) -> None:
    """Make the kernel's folders, install the helper, cwd = outputs, plain tracebacks."""
    code = SETUP_CODE.format(data=data, outputs=outputs, source=HELPER_SOURCE)
    result = await channel.run(code, timeout_s, interrupt, silent=True)
    if result.status != "ok":
        why = result.error.evalue if result.error else f"the setup code ended with status {result.status}"
        raise SandboxUnavailable(f"the gateway kernel cannot keep its files at {data} and {outputs}: {why} "
                                 "(set sandbox.gateway_kernel_files_dir to a folder it may write)")


def _call(function: str, *args: Any) -> str:
    """A cell calling the helper; every argument goes in as a JSON text literal."""
    return f"import json as _j, _datadesk_files as _f; _f.{function}(" + \
        ", ".join(f"_j.loads({json.dumps(a)!r})" for a in args) + "); del _j, _f"


async def _helper(channel: GatewayChannel, timeout_s: float, interrupt: OnTimeout, function: str,
                  *args: Any) -> Any:
    """Run one helper call silently; its JSON answer (None when the cell failed or lied)."""
    result = await channel.run(_call(function, *args), timeout_s, interrupt, silent=True)
    if result.status != "ok":
        return None
    last = (result.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last)
    except ValueError:
        return None


async def deliver(channel: GatewayChannel, files: KernelFiles, data: str, timeout_s: float,
                  interrupt: OnTimeout) -> list[str]:
    """Bring the kernel's /data in line with the thread's artifacts; problems in words."""
    try:
        wanted = await asyncio.to_thread(files.downloads)
    except KernelFilesUnavailable as exc:
        return [f"(the thread's data files could not be handed to the kernel: {exc})"]
    listing = [{"name": d.name, "size": d.size, "sha256": d.sha256, "url": d.url} for d in wanted]
    got = await _helper(channel, timeout_s, interrupt, "sync", data, listing, FETCH_TIMEOUT_S)
    if not isinstance(got, dict):
        return ["(the kernel did not confirm its /data: files of this thread may be missing there)"]
    failed = got.get("failed") if isinstance(got.get("failed"), list) else []
    return [f"(/data/{str(f[0])[:200]} could not be fetched from the object store: {str(f[1])[:300]})"
            for f in failed if isinstance(f, list) and len(f) == 2]


async def collect(channel: GatewayChannel, files: KernelFiles, outputs: str, max_bytes: int,
                  timeout_s: float, interrupt: OnTimeout) -> tuple[list[OutputFile], list[str]]:
    """The new or changed files under the kernel's /outputs, sent through presigned PUTs."""
    listed = await _helper(channel, timeout_s, interrupt, "scan", outputs, MAX_LISTED)
    if not isinstance(listed, list):
        return [], ["(files under /outputs could not be listed by the kernel)"]
    raw, stamps = _listing(listed)
    seen: dict[str, tuple[int, int]] = {}
    wanted, problems = plan_outputs(raw, seen, max_bytes)
    marks = [[rel, size, mtime] for rel, (size, mtime) in seen.items()]  # over the quota: not again
    try:
        uploads = [await asyncio.to_thread(files.upload, w.relpath, w.size) for w in wanted]
    except KernelFilesUnavailable as exc:
        return [], problems + [f"(files under /outputs could not be collected: {exc})"]
    items = [[u.relpath, u.url, u.size, stamps[u.relpath]] for u in uploads]
    if not items and not marks:
        return [], problems
    sent = await _helper(channel, timeout_s, interrupt, "put", outputs, items, marks, FETCH_TIMEOUT_S)
    answers = {r[0]: r[1] for r in sent if isinstance(r, list) and len(r) == 2} if isinstance(sent, list) else {}
    found: list[OutputFile] = []
    for u in uploads:
        found_one, problem = await _take(files, u, answers.get(u.relpath), stamps[u.relpath])
        if found_one is not None:
            found.append(found_one)
        if problem:
            problems.append(problem)
    return found, problems


async def _take(files: KernelFiles, upload: KernelUpload, answer: Any,
                mtime_ns: int) -> tuple[OutputFile | None, str]:
    if answer != "":
        await asyncio.to_thread(files.discard, upload)
        why = str(answer)[:300] if answer else "the kernel did not send it"
        return None, f"/outputs/{upload.relpath} could not be collected: {why}"
    try:
        data = await asyncio.to_thread(files.take, upload)
    except KernelFilesUnavailable as exc:
        return None, f"/outputs/{upload.relpath} could not be collected: {exc}"
    return OutputFile(upload.relpath, len(data), mtime_ns, data), ""


def _listing(entries: list[Any]) -> tuple[bytes, dict[str, int]]:
    """The kernel's scan (untrusted JSON) as a `files.LISTING_FORMAT` listing, and each name's mtime."""
    parts: list[bytes] = []
    stamps: dict[str, int] = {}
    for e in entries[:MAX_LISTED]:
        if not (isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) and isinstance(e[3], str)
                and isinstance(e[1], int) and isinstance(e[2], int) and e[1] >= 0 and e[2] >= 0):
            continue
        kind, size, mtime_ns, rel = e
        if "\0" in rel or len(kind) != 1:
            continue
        stamps[rel] = mtime_ns
        parts.append(f"{kind} {size} {mtime_ns // 10**9}.{mtime_ns % 10**9:09d} {rel}".encode() + b"\0")
    return b"".join(parts), stamps
