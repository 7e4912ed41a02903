"""A small MCP server of our own, written with the official SDK (mcp 2.x `MCPServer`).

Run as `python tests/fakes/mcp_server.py` (stdio) or
`python tests/fakes/mcp_server.py --http PORT` (streamable HTTP on 127.0.0.1:PORT, path /mcp).

Tools:
- `echo(text)` (read-only hint): returns the text.
- `rows(n)` (read-only hint): a JSON array of n objects, as text.
- `slow(seconds)`: sleeps, then answers.
- `slow_mark(seconds, path)`: sleeps, then writes "done" to `path` (a cancelled call never does).
- `crash()`: the process exits with status 1 in the middle of the call.
- `image()`: a small PNG image content.
- `fail()`: an error result (isError).
- `env(name)` (read-only hint): the value of an environment variable ("<unset>" when unset).
- `pid()` (read-only hint): the server's process id.
- `header(name)` (read-only hint): a request header (streamable HTTP).
- `add_tool()`: adds `late()` and sends notifications/tools/list_changed.
- `secret_hint()`: no hint, used to test `read_only_tools`.
- `big_text(mb)` (read-only hint): a text of `mb` MiB (a 200 MB result: one 200 MB JSON-RPC line).
- `trickle(mb, seconds, finish)`: writes this call's response line itself (id first), `mb` MiB of
  text spread over `seconds`; with `finish` it ends the line, else the line never ends.

`python tests/fakes/mcp_server.py --raw-ts` is a hand-written stdio server that orders keys as
TypeScript's `JSON.stringify` does (`{"result": ..., "jsonrpc": "2.0", "id": 7}`: the id last),
with `echo(text)`, `big_text(mb)` and `hold(seconds)` (answered later, out of order).
`--http PORT --json` answers with JSON bodies instead of SSE streams.

At start it writes a line with a fake secret to stderr (to test log redaction).
With `FAKE_MCP_EXTRA_TOOL=1` in its environment it also exposes `extra()`;
a file named by `FAKE_MCP_TOOLS_FILE` holding "extra" switches it on at start too
(to test re-listing after a restart).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
import threading
import time
import zlib

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

RO = ToolAnnotations(read_only_hint=True)

server = MCPServer("datadesk-fake")
_WIRE = os.dup(1)  # the SDK diverts fd 1 to stderr while it serves; `trickle` writes to the real stdout


def _png(width: int = 4, height: int = 3) -> bytes:
    """A tiny valid RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes([255, 0, 0]) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@server.tool(annotations=RO, structured_output=False)
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool(annotations=RO, structured_output=False)
def rows(n: int) -> str:
    """A JSON array of n objects."""
    return json.dumps([{"id": i, "name": f"row {i}", "value": i * 1.5} for i in range(n)])


@server.tool(structured_output=False)
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds} s"


@server.tool(structured_output=False)
async def slow_mark(seconds: float, path: str) -> str:
    """Sleep, then leave a mark: tests see whether a cancelled call kept running in the server."""
    await asyncio.sleep(seconds)
    with open(path, "w") as fh:
        fh.write("done")
    return "marked"


@server.tool(structured_output=False)
def crash() -> str:
    """Exit the process mid-call."""
    sys.stderr.flush()
    os._exit(1)


@server.tool(structured_output=False)
def image() -> Image:
    """A small PNG image."""
    return Image(data=_png(), format="png")


@server.tool(structured_output=False)
def fail() -> str:
    """Always fails."""
    raise ToolError("the fake tool failed on purpose")


@server.tool(annotations=RO, structured_output=False)
def env(name: str) -> str:
    """The value of an environment variable of the server process."""
    return os.environ.get(name, "<unset>")


@server.tool(annotations=RO, structured_output=False)
def pid() -> str:
    """The server's process id (tests check that stopped servers are gone)."""
    return str(os.getpid())


@server.tool(structured_output=False)
def secret_hint() -> str:
    """No read-only hint: declared read-only by configuration in tests."""
    return "ok"


@server.tool(annotations=RO, structured_output=False)
def header(name: str, ctx: Context) -> str:
    """The value of a request header (streamable HTTP only; "<unset>" otherwise)."""
    headers = ctx.headers or {}
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "<unset>")


@server.tool(structured_output=False)
async def add_tool(ctx: Context) -> str:
    """Add the tool `late()` and tell the client the tool list changed."""

    def late() -> str:
        """Added at run time."""
        return "late"

    server.add_tool(late, name="late", annotations=RO, structured_output=False)
    await ctx.session.send_tool_list_changed()
    return "added"


@server.tool(annotations=RO, structured_output=False)
def big_text(mb: float) -> str:
    """A text of `mb` MiB."""
    return "x" * int(mb * 1024 * 1024)


@server.tool(structured_output=False)
async def trickle(mb: float, seconds: float, ctx: Context, finish: bool = True) -> str:
    """Write this call's response line by hand, slowly; without `finish` it never ends."""
    rid = json.dumps(ctx.request_context.request_id)
    os.write(_WIRE, ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % rid).encode())
    steps = max(1, int(seconds * 20))
    piece = b"x" * max(1, int(mb * 1024 * 1024 / steps))
    for _ in range(steps):
        os.write(_WIRE, piece)
        await asyncio.sleep(seconds / steps)
    if finish:
        os.write(_WIRE, b'"}],"isError":false}}\n')
    await asyncio.Event().wait()  # never answers through the SDK (that would be a second response)
    return "unreachable"


def _maybe_extra() -> None:
    flag = os.environ.get("FAKE_MCP_EXTRA_TOOL") == "1"
    path = os.environ.get("FAKE_MCP_TOOLS_FILE")
    if path and os.path.exists(path):
        with open(path) as fh:
            flag = flag or "extra" in fh.read()
    if flag:
        @server.tool(annotations=RO, structured_output=False)
        def extra() -> str:
            """Only there when switched on."""
            return "extra"


# -- a TypeScript-style server: hand-written JSON-RPC, the id last -----------------------------
_TS_TOOLS = [
    {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "big_text", "inputSchema": {"type": "object", "properties": {"mb": {"type": "number"}}}},
    {"name": "hold", "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
]


def _ts_answer(lock: threading.Lock, rid: object, result: object) -> None:
    line = json.dumps({"result": result, "jsonrpc": "2.0", "id": rid}) + "\n"  # JSON.stringify's order
    with lock:
        sys.stdout.buffer.write(line.encode())
        sys.stdout.buffer.flush()


def _ts_call(lock: threading.Lock, rid: object, name: str, args: dict) -> None:
    if name == "echo":
        text = str(args.get("text", ""))
    elif name == "big_text":
        text = "x" * int(float(args.get("mb", 1)) * 1024 * 1024)
    else:  # hold: answered later, from a thread, while other calls go on
        def later() -> None:
            time.sleep(float(args.get("seconds", 1)))
            _ts_answer(lock, rid, {"content": [{"type": "text", "text": "held"}]})

        threading.Thread(target=later, daemon=True).start()
        return
    _ts_answer(lock, rid, {"content": [{"type": "text", "text": text}]})


def run_raw_ts() -> None:
    lock = threading.Lock()
    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        rid, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
        if rid is None:
            continue  # a notification
        if method == "initialize":
            _ts_answer(lock, rid, {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
                                   "serverInfo": {"name": "fake-ts", "version": "1.0.0"}})
        elif method == "tools/list":
            _ts_answer(lock, rid, {"tools": _TS_TOOLS})
        elif method == "tools/call":
            _ts_call(lock, rid, params.get("name"), params.get("arguments") or {})
        elif method == "ping":
            _ts_answer(lock, rid, {})
        else:
            with lock:
                err = {"error": {"code": -32601, "message": "Method not found"}, "jsonrpc": "2.0", "id": rid}
                sys.stdout.buffer.write((json.dumps(err) + "\n").encode())
                sys.stdout.buffer.flush()


def main() -> None:
    print("fake mcp server starting, token=sk-live-abcdef123456", file=sys.stderr, flush=True)
    if "--raw-ts" in sys.argv:
        run_raw_ts()
        return
    _maybe_extra()
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), json_response="--json" in sys.argv)
    else:
        server.run()


if __name__ == "__main__":
    main()
