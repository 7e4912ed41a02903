"""The size bound of MCP results for servers over streamable HTTP (`limits.mcp_result_max_mb`,
at most `HTTP_HELD_MAX_BYTES`).

The SDK reads a JSON response whole (`response.aread()`) and bounds only SSE events (its
`max_sse_event_size`): an answer over HTTP is held in memory, unlike one over stdio (spooled
to disk past 8 MB, `spool.py`), so it stays bounded by the old 32 MB whatever the setting. `bounded_http_client` is the SDK's own client (`create_mcp_http_client`)
with a response hook that counts the body of every POST response as it streams and raises
`ResponseTooLarge` past the limit, before more is held. Requests ask for `Accept-Encoding:
identity`; a compressed body is refused (its inflated size could not be bounded this way).
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

import httpx2
from mcp.shared._httpx_utils import create_mcp_http_client

from datadesk.tools.mcp.framing import LIMIT_SETTING, too_large_text

HTTP_HELD_MAX_BYTES = 32 * 1024**2  # the most of one answer held in memory (streamable HTTP)


def http_too_large_text(limit_bytes: int) -> str:
    """'more than 32 MB (...)': the refusal of an HTTP answer past what is held in memory."""
    return (f"more than {limit_bytes / 2**20:g} MB (the most an MCP server over HTTP may send at once, held in "
            f"memory; {LIMIT_SETTING} applies to stdio servers, whose answers are spooled to disk)")


class ResponseTooLarge(httpx2.StreamError, httpx2.SSEError):
    """A response body past the limit (or compressed). Both bases on purpose: the SDK answers the
    request with a JSON-RPC error carrying this message for a StreamError while it reads a JSON
    body and for an SSEError while it reads an event stream (other errors would end the session)."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self._request = None


class _CountedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, encoding: str) -> None:
        self._inner = inner
        self._limit = limit
        self._encoding = encoding

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._encoding:
            raise ResponseTooLarge(f"the response is compressed ({self._encoding}) although an uncompressed one "
                                   "was asked for; refused, as its inflated size cannot be bounded")
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResponseTooLarge(f"the response was {too_large_text(self._limit)}")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _quiet_refusals(record: logging.LogRecord) -> bool:
    """The SDK logs a refused body with its traceback ("Error parsing JSON response"): one line instead."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, ResponseTooLarge):
        record.msg, record.args = "an MCP server's response was refused: %s", (exc,)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


logging.getLogger("mcp.client.streamable_http").addFilter(_quiet_refusals)


def bounded_http_client(headers: dict[str, str] | None, limit_bytes: int) -> httpx2.AsyncClient:
    """The SDK's MCP HTTP client; POST response bodies larger than `limit_bytes` fail while streaming."""
    sent = {k: v for k, v in (headers or {}).items() if k.lower() != "accept-encoding"}
    sent["Accept-Encoding"] = "identity"
    client = create_mcp_http_client(headers=sent)

    async def count(response: httpx2.Response) -> None:
        if response.request.method != "POST":
            return  # the GET event stream: its events are bounded by max_sse_event_size
        encodings = [e.strip().lower() for e in response.headers.get_list("content-encoding", split_commas=True)]
        encoding = ",".join(e for e in encodings if e and e != "identity")
        response.stream = _CountedStream(response.stream, limit_bytes, encoding)

    client.event_hooks["response"].append(count)
    return client
