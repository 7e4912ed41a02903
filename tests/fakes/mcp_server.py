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
- `table(n, seconds)` (read-only hint): n rows x 10 columns (`table_row`) as a JSON array of
  objects in one text content, the response line written by hand piece by piece (the server never
  holds it whole; spread over `seconds`); it says the line's size on stderr (`table: N bytes`).
- `error_text(text)`: an ordinary (not isError) text result, for servers that answer errors as text.

`python tests/fakes/mcp_server.py --raw-ts` is a hand-written stdio server that orders keys as
TypeScript's `JSON.stringify` does (`{"result": ..., "jsonrpc": "2.0", "id": 7}`: the id last),
with `echo(text)`, `big_text(mb)` and `hold(seconds)` (answered later, out of order).
`--http PORT --json` answers with JSON bodies instead of SSE streams; `--http-gzip PORT` is a
hand-written HTTP server (JSON bodies) that gzips tool results whatever the client asked.

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

import anyio
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


def table_row(i: int) -> str:
    """Row i of `table` as JSON: 10 columns (int, str, float, int, date, timestamp, bool, str,
    float, str); tests and bench/mcp_large.py compute its sums from the same formulas."""
    return ('{"id":%d,"name":"name %d","amount":%s,"qty":%d,"day":"2024-%02d-%02d",'
            '"ts":"2024-01-01T%02d:%02d:%02dZ","paid":%s,"region":"region %d","price":%d.5,"code":"C%07d"}'
            % (i, i, repr(i * 0.25), i % 7, 1 + i % 12, 1 + i % 28, i % 24, i % 60, (i * 7) % 60,
               "true" if i % 3 == 0 else "false", i % 11, i % 1000, i))


def _write_all(data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(_WIRE, view):]
    return len(data)


@server.tool(annotations=RO, structured_output=False)
async def table(n: int, ctx: Context, seconds: float = 0.0) -> str:
    """n rows x 10 columns as a JSON array of objects (one text content)."""
    rid = json.dumps(ctx.request_context.request_id)
    head = ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"[' % rid).encode()
    size = _write_all(head)
    step = 20_000
    pieces = max(1, -(-n // step))
    with anyio.CancelScope(shield=True):  # a cancelled call still ends its line, as an SDK server's would
        for start in range(0, n, step):
            text = ",".join(table_row(i) for i in range(start, min(n, start + step)))
            if start + step < n:
                text += ","
            data = json.dumps(text)[1:-1].encode()  # the text as a JSON string's inside
            size += _write_all(data)
            if seconds:
                await asyncio.sleep(seconds / pieces)
        size += _write_all(b']"}],"isError":false}}\n')
    print(f"table: {size} bytes", file=sys.stderr, flush=True)
    await asyncio.Event().wait()  # answered by hand above; never through the SDK
    return "unreachable"


@server.tool(structured_output=False)
def error_text(text: str) -> str:
    """An ordinary text result (isError false) that says whatever it is given."""
    return text


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


# -- hand-written servers: TypeScript-style key order (the id last), and gzip over HTTP ----------
_RAW_TOOLS = [
    {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "big_text", "inputSchema": {"type": "object", "properties": {"mb": {"type": "number"}}}},
    {"name": "hold", "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
]


def _raw_result(method: str | None, params: dict) -> dict | None:
    """The result of a request (None: method not found); `hold` is the stdio server's own."""
    if method == "initialize":
        return {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake-raw", "version": "1.0.0"}}
    if method == "tools/list":
        return {"tools": _RAW_TOOLS}
    if method == "ping":
        return {}
    if method == "tools/call":
        args = params.get("arguments") or {}
        if params.get("name") == "big_text":
            text = "x" * int(float(args.get("mb", 1)) * 1024 * 1024)
        else:
            text = str(args.get("text", ""))
        return {"content": [{"type": "text", "text": text}]}
    return None


def _ts_write(lock: threading.Lock, message: dict) -> None:
    with lock:
        sys.stdout.buffer.write((json.dumps(message) + "\n").encode())
        sys.stdout.buffer.flush()


def run_raw_ts() -> None:
    """stdio, keys in JSON.stringify's order: {"result": ..., "jsonrpc": "2.0", "id": 7}."""
    lock = threading.Lock()
    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        rid, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
        if rid is None:
            continue  # a notification
        if method == "tools/call" and params.get("name") == "hold":  # answered later, out of order
            seconds = float((params.get("arguments") or {}).get("seconds", 1))

            def later(rid: object = rid, seconds: float = seconds) -> None:
                time.sleep(seconds)
                held = {"content": [{"type": "text", "text": "held"}]}
                _ts_write(lock, {"result": held, "jsonrpc": "2.0", "id": rid})

            threading.Thread(target=later, daemon=True).start()
            continue
        result = _raw_result(method, params)
        if result is None:
            _ts_write(lock, {"error": {"code": -32601, "message": "Method not found"}, "jsonrpc": "2.0", "id": rid})
        else:
            _ts_write(lock, {"result": result, "jsonrpc": "2.0", "id": rid})


def run_gzip_http(port: int) -> None:
    """Streamable HTTP with JSON bodies; tool results gzip-compressed whatever the client asked
    (a 200 MB text is a 200 KB body: a decompression bomb)."""
    import gzip
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            rid, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
            if rid is None:
                self.send_response(202)
                self.end_headers()
                return
            result = _raw_result(method, params)
            body = json.dumps({"jsonrpc": "2.0", "id": rid, "result": result} if result is not None else
                              {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}}).encode()
            packed = method == "tools/call" and params.get("name") == "big_text"
            if packed:
                body = gzip.compress(body, 1)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if packed:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_DELETE = do_GET

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> None:
    print("fake mcp server starting, token=sk-live-abcdef123456", file=sys.stderr, flush=True)
    if "--raw-ts" in sys.argv:
        run_raw_ts()
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "--http-gzip":
        run_gzip_http(int(sys.argv[2]))
        return
    _maybe_extra()
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), json_response="--json" in sys.argv)
    else:
        server.run()


if __name__ == "__main__":
    main()
