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
import zlib

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

RO = ToolAnnotations(read_only_hint=True)

server = MCPServer("datadesk-fake")


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


def main() -> None:
    print("fake mcp server starting, token=sk-live-abcdef123456", file=sys.stderr, flush=True)
    _maybe_extra()
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
