"""`OpenAIChatModel`: the real ChatModel, over any OpenAI-compatible endpoint.

It uses the official SDK (`AsyncOpenAI`) for the HTTP and SSE plumbing but
does its own retrying (the SDK's is switched off with `max_retries=0`): the
SDK can only retry the request, while we must also decide what happens when a
stream breaks halfway. The rule is simple: retry (429, 5xx, connection errors,
timeouts) only while nothing has been yielded to the caller; once a
`ModelDelta` went out, a failure raises `ModelStreamBroken`, because a retry
would show the user the same text twice.

Every SDK failure is translated into a `ModelError` subclass whose message
names what to fix (base URL, key, model). The API key never appears in a
message or a log line: server messages are redacted (`domain.redaction`) before use.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import msgspec
import openai
from openai import AsyncOpenAI

from datadesk.domain.records import ToolCall, Usage
from datadesk.domain.redaction import redact
from datadesk.llm.base import (
    ModelAuthError,
    ModelDelta,
    ModelError,
    ModelEvent,
    ModelNotFound,
    ModelProtocolError,
    ModelReply,
    ModelStreamBroken,
    ModelUnavailable,
)
from datadesk.settings import LLMSettings

log = logging.getLogger(__name__)
try:  # the SDK's request options and stream class, as `create` itself uses them
    import inspect as _inspect

    from openai import AsyncStream as _ASYNC_STREAM
    from openai._base_client import make_request_options as _MAKE_OPTIONS

    if "security" not in _inspect.signature(_MAKE_OPTIONS).parameters:
        raise ImportError("an SDK without per-request security options")
except ImportError:  # another SDK version: `create` as it is
    _MAKE_OPTIONS = _ASYNC_STREAM = None  # type: ignore[assignment]
# the SDK and its transport log request URLs (httpx: "HTTP Request: POST https://user:pass@...")
# (filters do not reach child loggers, so each is named; openai may bundle httpx as httpx2)
SDK_LOGGERS = ("openai", "openai._base_client", *(f"{core}{sub}" for core in ("httpcore", "httpcore2")
               for sub in ("", ".connection", ".http11", ".http2", ".proxy")), "httpx", "httpx2",
               "aiohttp.client", "aiohttp.internal")


def http_client(kind: str, base_url: str = "") -> Any | None:
    """The HTTP client under the SDK for `llm.http_client`: "aiohttp" (the SDK's own aiohttp
    transport, `openai[aiohttp]`), "httpx" (the SDK's default, None here), "auto": aiohttp where
    it is installed. Each streamed chunk arrives as its own read; aiohttp's C parser and its
    asyncio protocol cost about half the CPU per read of httpx's stack (anyio, httpcore, h11),
    which is most of what a streamed delta costs the app (docs/benchmarks.md, streaming).

    A base URL with credentials in it (`https://user:secret@host/v1`) is sent with httpx: httpx
    turns them into Basic auth (in place of the bearer key, as it always did here), while aiohttp
    refuses a request that has both an Authorization header and URL credentials."""
    if kind == "httpx":
        return None
    if urlsplit(base_url).username is not None:
        if kind == "aiohttp":
            raise ModelError("llm.http_client = \"aiohttp\" cannot send a base URL with credentials in it "
                             "(user:password@host): aiohttp will not combine them with the API key's "
                             "Authorization header. Use llm.http_client = \"auto\" or \"httpx\", which send "
                             "them as Basic auth.")
        return None
    try:
        return openai.DefaultAioHttpClient()
    except (AttributeError, RuntimeError) as exc:  # an SDK without it, or aiohttp missing
        if kind == "aiohttp":
            raise ModelError(f"llm.http_client = \"aiohttp\" needs the aiohttp extra of the openai "
                             f"package (pip install 'openai[aiohttp]'): {exc}") from None
        return None


class RedactURLSecrets(logging.Filter):
    """A filter on the SDK's loggers: credentials in the base URL (`user:secret@`, `?api-key=`)
    and the API key never reach a log line."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error path
            return True
        clean = redact(text, tuple(self.secrets))
        if clean != text:
            record.msg, record.args = clean, ()
        return True


URL_FILTER = RedactURLSecrets()


def guard_sdk_logs(*secrets: str) -> None:
    """Install the one URL filter on the SDK loggers (idempotent) and add `secrets` to it."""
    URL_FILTER.secrets.update(s for s in secrets if s and len(s) >= 4)
    for name in SDK_LOGGERS:
        logger = logging.getLogger(name)
        if URL_FILTER not in logger.filters:
            logger.addFilter(URL_FILTER)

# A Retry-After above this is not waited for (we would hold a user's turn for
# minutes); our own exponential backoff applies instead.
RETRY_AFTER_MAX_S = 60.0
_RETRY_STATUSES = {408, 429}  # plus every 5xx
_MODEL_MISSING = re.compile(r"model.*(not[ _]found|does not exist|not exist|unknown|invalid model)|invalid model", re.I)


class _Retriable(Exception):
    """Internal: a transient failure, carrying the user-facing error and a server hint."""

    def __init__(self, error: ModelError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class _Assembly:
    """Accumulates one streamed reply: text, tool calls by index, usage, raw extras."""

    def __init__(self) -> None:
        self.chunks = 0
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.extras: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None

    def feed(self, chunk: Any) -> str:
        """Take one chat-completion chunk (its JSON object, or the SDK's ChatCompletionChunk);
        return the text to forward (may be "")."""
        self.chunks += 1
        # Nothing validated the chunk (JSON as sent; the SDK builds its objects with pydantic
        # `construct`), so a wrong-shaped payload shows up as odd types here, checked below.
        self.model = _get(chunk, "model") or self.model
        usage = _get(chunk, "usage")
        if usage is not None:  # some servers send it on every chunk: last wins
            self.usage = _usage(usage)
        out = []
        for choice in _get(chunk, "choices") or []:
            if _get(choice, "index", 0) not in (0, None):
                continue  # n>1 is never requested; ignore stray choices
            if _get(choice, "finish_reason"):
                self.finish_reason = str(_get(choice, "finish_reason"))
            delta = _get(choice, "delta")
            if delta is None:
                continue
            for field in ("content", "refusal"):  # a refusal is the reply the user must see
                piece = _get(delta, field)
                if piece is not None and not isinstance(piece, str):
                    raise ModelProtocolError(f"the LLM endpoint sent a non-text `{field}` in a stream chunk")
                if piece:
                    out.append(piece)
            for tc in _get(delta, "tool_calls") or []:
                self._tool_delta(tc)
            extra = {k: v for k, v in delta.items() if k not in _DELTA_FIELDS} if isinstance(delta, dict) \
                else getattr(delta, "model_extra", None) or {}
            for key, value in extra.items():
                self._extra(key, value)
        text = "".join(out)
        if text:
            self.text.append(text)
        return text

    def _tool_delta(self, tc: Any) -> None:
        index, call_id = _get(tc, "index"), _get(tc, "id")
        if index is None:  # a few servers omit it: a new id opens a new call
            known = {c["id"] for c in self.calls.values()}
            index = len(self.calls) if (call_id and call_id not in known) or not self.calls else max(self.calls)
        slot = self.calls.setdefault(int(index), {"id": "", "name": "", "arguments": []})
        if call_id and not slot["id"]:
            slot["id"] = str(call_id)
        fn = _get(tc, "function")
        name = _get(fn, "name") if fn is not None else None
        args = _get(fn, "arguments") if fn is not None else None
        # OpenAI sends the whole name in the first chunk; some servers repeat it.
        if name and name != slot["name"]:
            slot["name"] += str(name)
        if args:
            if not isinstance(args, str):
                raise ModelProtocolError("the LLM endpoint sent non-text tool-call arguments")
            slot["arguments"].append(args)

    def _extra(self, key: str, value: Any) -> None:
        # Provider fields (reasoning_content, reasoning, reasoning_details...)
        # are kept raw: strings concatenate, lists extend, anything else wins.
        if value is None:
            return
        old = self.extras.get(key)
        if isinstance(value, str) and isinstance(old, str):
            self.extras[key] = old + value
        elif isinstance(value, list) and isinstance(old, list):
            old.extend(value)
        else:
            self.extras[key] = list(value) if isinstance(value, list) else value

    def reply(self, fallback_model: str) -> ModelReply:
        calls = []
        for i in sorted(self.calls):
            slot = self.calls[i]
            if not slot["name"]:
                raise ModelProtocolError(f"the LLM endpoint sent a tool call (index {i}) with no function name")
            # Arguments stay raw text (ToolCall contract): a malformed JSON is
            # the tool layer's to report back to the model, not a dead turn.
            calls.append(ToolCall(id=slot["id"] or f"call_{i}_{int(time.time() * 1000)}",
                                  name=slot["name"], arguments="".join(slot["arguments"]) or "{}"))
        return ModelReply(content="".join(self.text), tool_calls=calls, finish_reason=self.finish_reason,
                          usage=self.usage, model=self.model or fallback_model,
                          provider_fields=dict(self.extras) or None)


_DELTA_FIELDS = frozenset({"content", "refusal", "role", "tool_calls", "function_call"})  # others: provider fields
_decode_chunk = msgspec.json.Decoder().decode


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """A field of a chunk's part: a JSON object's key, or an SDK object's attribute."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


async def _chunks(sdk_stream: Any) -> AsyncIterator[Any]:
    """The chunks of the SDK's stream as their JSON objects. Building the SDK's pydantic object
    of every chunk cost more CPU than everything else on a chunk's way (bench/streaming.py);
    the SDK still reads the HTTP body, splits the server-sent events and maps transport errors
    (its event iterator). An SDK without that iterator gives its objects."""
    events = getattr(sdk_stream, "_iter_events", None)
    if events is None:
        async for chunk in sdk_stream:
            yield chunk
        return
    async for sse in events():
        data = sse.data
        if data.startswith("[DONE]"):
            continue  # the body ends right after it: read to its end, the connection is reused
        obj = _decode_chunk(data)  # a msgspec.DecodeError is a ValueError: _classify names it
        if isinstance(obj, dict) and obj.get("error"):  # an error event inside the stream
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise openai.APIError(message=message if isinstance(message, str) and message else
                                  "An error occurred during streaming", request=sdk_stream.response.request,
                                  body=error)
        yield obj


def _connection_lost(exc: BaseException) -> BaseException | None:
    """The aiohttp error under an SDK error when it is a lost or refused connection, not a timeout:
    the SDK's aiohttp adapter maps every `aiohttp.ClientConnectionError` (a refused connection, a
    server that hung up) to httpx's ConnectTimeout, which the SDK reports as a timeout."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain: SDK error <- httpx2 error <- aiohttp error
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if seen is None:
            return None
        if type(seen).__module__.startswith("aiohttp"):
            return None if isinstance(seen, TimeoutError) else seen
    return None


def _usage(u: Any) -> Usage:
    def num(v: Any) -> int:
        return v if isinstance(v, int) else 0

    details = _get(u, "prompt_tokens_details")
    cached = num(_get(details, "cached_tokens")) if details is not None else 0
    if not cached:  # DeepSeek reports its cache hits under its own name
        extra = u if isinstance(u, dict) else getattr(u, "model_extra", None) or {}
        cached = num(extra.get("prompt_cache_hit_tokens"))
    prompt, completion = num(_get(u, "prompt_tokens", 0)), num(_get(u, "completion_tokens", 0))
    total = num(_get(u, "total_tokens", 0)) or prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total, cached_tokens=cached)


def _retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` / `Retry-After` (seconds or HTTP date), if any."""
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return float(value)
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(value)
            return parsed.timestamp() - time.time()
    except (TypeError, ValueError, OverflowError):
        return None


class OpenAIChatModel:
    """ChatModel over an OpenAI-compatible Chat Completions endpoint (streaming)."""

    is_demo = False

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings
        self.name = settings.model
        self._key = settings.api_key or ""
        self._client = AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key or "not-needed",  # local servers accept anything
            max_retries=0,
            timeout=settings.timeout_s,
            http_client=http_client(settings.http_client, settings.base_url),
        )
        self.base_url = self._safe_url(str(self._client.base_url))
        parts = urlsplit(settings.base_url or "")
        guard_sdk_logs(self._key, parts.password or "")
        self._stream_options = True  # dropped if an old server rejects it

    async def aclose(self) -> None:
        await self._client.close()

    # -- messages --------------------------------------------------------------
    @staticmethod
    def _safe_url(url: str) -> str:
        # Credentials can hide in a URL (user:pass@host, ?api-key=): strip both.
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))

    def _redact(self, text: str) -> str:
        # servers echo keys (ours, or one they expected): the API key and every key shape go
        return redact(text, (self._key,))

    def _detail(self, exc: openai.APIStatusError) -> str:
        body: Any = exc.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"]
        msg = body.get("message") if isinstance(body, dict) else None
        text = str(msg if msg else exc.message)
        return self._redact(" ".join(text.split()))[:300].rstrip(".")

    def _classify(self, exc: BaseException, started: bool) -> ModelError | _Retriable | None:
        """Map an SDK/transport failure to a ModelError (or a retriable wrapper).

        `started`: the response headers had arrived, so a connection error is a
        stream cut mid-body rather than an unreachable endpoint.
        """
        url, model = self.base_url, self.name
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = self._detail(exc)
            if status in (401, 403):
                return ModelAuthError(
                    f"The LLM endpoint rejected the API key ({status}) at {url}. "
                    "Check DATADESK_LLM_API_KEY (and that the key may use this model)."
                )
            code = str(getattr(exc, "code", "") or "")
            if status == 404 or (status in (400, 422) and (code == "model_not_found" or _MODEL_MISSING.search(detail))):
                return ModelNotFound(
                    f"The model '{model}' was not found at the LLM endpoint {url} ({status}: {detail}). "
                    "Check DATADESK_LLM_MODEL, and that DATADESK_LLM_BASE_URL is the API root (often ending in /v1)."
                )
            if status in _RETRY_STATUSES or status >= 500:
                what = "is rate limiting requests" if status == 429 else "failed"
                return _Retriable(
                    ModelUnavailable(f"The LLM endpoint {url} {what} ({status}: {detail})."),
                    _retry_after(exc.response.headers),
                )
            return ModelError(f"The LLM endpoint {url} rejected the request ({status}: {detail}).")
        if isinstance(exc, openai.APITimeoutError) and not _connection_lost(exc):
            return _Retriable(ModelUnavailable(
                f"The LLM endpoint {url} did not answer within {self.settings.timeout_s:g} s (timeout)."))
        if isinstance(exc, openai.APIConnectionError):
            cause = _connection_lost(exc) or exc.__cause__ or exc.__context__
            why = f": {self._redact(str(cause))[:200]}" if cause and str(cause) else ""
            if started:
                return _Retriable(ModelUnavailable(
                    f"The connection to the LLM endpoint {url} broke in the middle of the reply{why}."))
            return _Retriable(ModelUnavailable(
                f"Cannot reach the LLM endpoint at {url} (connection error{why}). "
                "Check DATADESK_LLM_BASE_URL and that the server is running."))
        if isinstance(exc, openai.APIResponseValidationError):
            return ModelProtocolError(f"The LLM endpoint {url} sent a response that is not a chat completion.")
        if isinstance(exc, openai.APIError):  # an `error` event inside the stream
            return _Retriable(ModelUnavailable(
                f"The LLM endpoint {url} reported an error mid-stream: {self._redact(exc.message)[:300]}"))
        if isinstance(exc, (ValueError, TypeError, AttributeError, KeyError)):
            # The SDK lets json.JSONDecodeError through for a garbled SSE event.
            return ModelProtocolError(
                f"The LLM endpoint {url} sent data that is not a valid chat-completions stream "
                f"({type(exc).__name__}). Is DATADESK_LLM_BASE_URL an OpenAI-compatible API?")
        return None

    # -- streaming -------------------------------------------------------------
    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 response_format: dict[str, Any] | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.name, "messages": messages, "stream": True}
        if tools:  # an empty `tools` list is rejected by OpenAI: omit it
            kwargs["tools"] = tools
        if response_format is not None:  # JSON mode or structured outputs (the summarizer)
            kwargs["response_format"] = response_format
        if self._stream_options:
            kwargs["stream_options"] = {"include_usage": True}
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        return kwargs

    async def _post_stream(self, body: dict[str, Any]) -> Any:
        """The streamed completion: the SDK's own POST of a body that is plain JSON already (our
        messages and tools are dicts in the wire format), without `create`'s walk that re-types
        every message against the SDK's parameter types (about 7% of the app's CPU at 30 users,
        growing with the context). Where the SDK lacks the pieces, `create` as before."""
        if _MAKE_OPTIONS is None or _ASYNC_STREAM is None:
            return await self._client.chat.completions.create(**body)
        return await self._client.post(
            "/chat/completions", body=body, cast_to=openai.types.chat.ChatCompletion,
            options=_MAKE_OPTIONS(security={"bearer_auth": True}), stream=True,
            stream_cls=_ASYNC_STREAM[openai.types.chat.ChatCompletionChunk])

    async def stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                     response_format: dict[str, Any] | None = None) -> AsyncIterator[ModelEvent]:
        """Stream one reply: ModelDelta pieces, then exactly one ModelReply. `response_format`
        (optional) is passed on as is: `{"type": "json_object"}` or a `json_schema` one."""
        attempt = 0
        while True:
            acc = _Assembly()
            yielded = started = False
            try:
                sdk_stream = await self._post_stream(self._request(messages, tools, response_format))
                started = True
                try:
                    async for chunk in _chunks(sdk_stream):
                        text = acc.feed(chunk)
                        if text:
                            yielded = True
                            yield ModelDelta(text=text)
                finally:
                    await sdk_stream.close()
                if acc.chunks == 0:
                    raise ModelProtocolError(
                        f"The LLM endpoint {self.base_url} answered without any chat-completion chunks. "
                        "Is DATADESK_LLM_BASE_URL an OpenAI-compatible API (often ending in /v1)?")
                yield acc.reply(self.name)
                return
            except ModelError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below, unknown ones re-raised
                mapped = self._classify(exc, started)
                if mapped is None:
                    raise
                error = mapped.error if isinstance(mapped, _Retriable) else mapped
                if yielded:
                    broken = ModelStreamBroken(
                        f"The LLM reply broke off after it had started, so it was not retried "
                        f"(a retry would repeat text). Cause: {error}")
                    broken.partial_text = "".join(acc.text)  # type: ignore[attr-defined]
                    raise broken from None
                if (self._stream_options and isinstance(exc, openai.BadRequestError | openai.UnprocessableEntityError)
                        and "stream_options" in str(error)):
                    self._stream_options = False  # an older server; usage will be missing
                    log.warning("LLM endpoint %s rejects stream_options; retrying without", self.base_url)
                    continue
                if not isinstance(mapped, _Retriable) or attempt >= self.settings.max_retries:
                    if isinstance(mapped, _Retriable) and attempt:
                        tries = f"{attempt} retr{'y' if attempt == 1 else 'ies'}"
                        raise ModelUnavailable(f"{error} Gave up after {tries}.") from None
                    # `from None`: the SDK exception may echo server text we did not redact
                    raise error from None
                delay = self.settings.retry_backoff_s * 2**attempt
                if mapped.retry_after is not None and 0 <= mapped.retry_after <= RETRY_AFTER_MAX_S:
                    delay = mapped.retry_after
                attempt += 1
                log.warning("LLM request failed (%s); retry %d/%d in %.2fs",
                            error, attempt, self.settings.max_retries, delay)
                await asyncio.sleep(delay)
