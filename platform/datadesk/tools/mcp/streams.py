"""Transport helpers of the MCP client: a server's stderr to the log (redacted), a read stream
wrapper that notices when the connection ends (the SDK does not say so), and the SDK's lazy
imports done off the event loop (`warm_sdk_imports`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable

import anyio

from datadesk.tools.mcp.config import _MAX_STDERR_LINE, redact


def warm_sdk_imports() -> None:
    """Import what the SDK's client imports lazily on the event loop at the first structured tool
    result (jsonschema, to check it against the tool's output schema: ~2.4 s, mostly rfc3987_syntax
    building its grammars). Run in a worker thread at connect time, the loop keeps answering
    meanwhile (measured: 91 ms at most) instead of stalling every user's requests once."""
    try:
        import jsonschema.validators  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency of mcp
        pass


class _StderrPipe:
    """An OS pipe for a server's stderr; a thread logs it line by line, redacted."""

    def __init__(self, logger: logging.Logger, secrets: list[str]) -> None:
        self.logger = logger
        self.secrets = secrets
        self.tail: deque[tuple[float, str]] = deque(maxlen=5)  # (monotonic time, line)
        r, w = os.pipe()
        self._reader = os.fdopen(r, "rb", buffering=0)
        self.writer = os.fdopen(w, "w")
        self._thread = threading.Thread(target=self._pump, name=f"{logger.name}-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self._reader.read(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._emit(line)
                if len(buf) > _MAX_STDERR_LINE * 4:
                    self._emit(buf)
                    buf = b""
            if buf:
                self._emit(buf)
        except (OSError, ValueError):
            pass
        finally:
            try:
                self._reader.close()
            except OSError:
                pass

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip():
            return
        if len(line) > _MAX_STDERR_LINE:
            line = line[:_MAX_STDERR_LINE] + " …"
        line = redact(line, self.secrets)
        self.tail.append((time.monotonic(), line.strip()))
        self.logger.info("%s", line)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close_writer(self) -> None:
        """Close our copy of the write end (the child keeps its own): EOF comes when it exits."""
        try:
            self.writer.close()
        except OSError:
            pass


class _WatchedStream:
    """Wraps the transport's read stream (the SDK's ReadStream protocol): notes when it ends."""

    def __init__(self, inner: Any, on_close: Callable[[], None]) -> None:
        self._inner = inner
        self._on_close = on_close

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_close()
            raise

    async def aclose(self) -> None:
        self._on_close()
        await self._inner.aclose()

    def __aiter__(self) -> "_WatchedStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> "_WatchedStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


# -- the manager ------------------------------------------------------------------------
