"""A real, scriptable OpenAI-compatible HTTP server for tests and benchmarks.

It speaks plain HTTP/1.1 on 127.0.0.1 (a raw asyncio server in a background
thread, so tests can drop connections mid-body, send garbage, or stall), and
answers `POST /v1/chat/completions` (also `/chat/completions`) in OpenAI's
format: SSE chunks (`data: {json}\\n\\n` ... `data: [DONE]`) when
`stream=true`, a plain completion JSON otherwise. `GET /v1/models` lists the
known models.

Replies are taken from a FIFO queue filled by `add_text`, `add_tool_calls`,
`add_error`, `add_garbage`, `add_drop_after` (or `enqueue(FakeReply(...))`);
when the queue is empty a `responder(request)` set by the test answers (a
function of the request: e.g. prose unless `response_format` asks for a
schema), else the server answers `default_text`. A request for a
model not in `models` is answered 404 `model_not_found` without consuming the
queue. Every request body is kept in `requests` (parsed JSON) and its headers
in `request_headers`.

    with FakeOpenAIServer() as server:
        server.add_text("Hello there", chunks=3)
        settings = LLMSettings(base_url=server.base_url, api_key="k", model="fake-model")
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODELS = ("fake-model", "gpt-4o-mini")
_ids = itertools.count(1)


@dataclass
class FakeReply:
    """One scripted answer. `status != 200` makes it an error reply.

    - text / reasoning: streamed in `chunks` pieces (reasoning as
      `reasoning_field` deltas, before the text).
    - tool_calls: dicts `{"name", "arguments" (str or dict), "id"?}`; each
      call's arguments are split into `arg_chunks` pieces; `interleave` mixes
      the pieces of parallel calls like some providers do.
    - usage: sent as a final chunk with empty `choices` when the request asked
      for `stream_options.include_usage`; `cached_tokens` goes into
      `prompt_tokens_details`.
    - raw_body: sent verbatim with status 200 (garbage tests).
    - drop_after: abort the TCP connection after that many SSE events.
    - delay_s: sleep before each SSE event (slow stream / timeouts).
    """

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    reasoning_field: str = "reasoning_content"  # OpenRouter/Ollama use "reasoning"
    chunks: int = 3
    arg_chunks: int = 3
    interleave: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    status: int = 200
    error_message: str | None = None
    error_code: str | None = None
    error_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    content_type: str = "text/event-stream"
    drop_after: int | None = None
    delay_s: float = 0.0


def split_text(text: str, n: int) -> list[str]:
    """Split `text` into at most `n` non-empty, order-preserving pieces."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class FakeOpenAIServer:
    """Scriptable OpenAI-compatible server; use as a context manager or start()/stop()."""

    def __init__(
        self,
        models: tuple[str, ...] | list[str] | None = DEFAULT_MODELS,
        api_key: str | None = None,
        default_text: str = "This is the fake server's default reply.",
    ) -> None:
        self.models = set(models) if models is not None else None  # None: accept any model
        self.api_key = api_key  # when set, other bearer tokens get 401
        self.default_text = default_text
        self.requests: list[dict[str, Any]] = []
        self.usage_fn: Any = None  # optional (request body) -> prompt_tokens
        self.responder: Any = None  # optional (request body) -> FakeReply | None, when the queue is empty
        self.request_headers: list[dict[str, str]] = []
        self._queue: list[FakeReply] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    # -- lifecycle ---------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, sock=sock))
            ready.set()
            self._loop.run_forever()
            # Let cancelled handlers unwind before the loop goes away.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ---------------------------------------------------------
    def enqueue(self, reply: FakeReply) -> FakeReply:
        with self._lock:
            self._queue.append(reply)
        return reply

    def add_text(self, text: str, **kw: Any) -> FakeReply:
        return self.enqueue(FakeReply(text=text, **kw))

    def add_tool_calls(self, calls: list[dict[str, Any]], text: str = "", **kw: Any) -> FakeReply:
        return self.enqueue(FakeReply(text=text, tool_calls=list(calls), **kw))

    def add_error(
        self,
        status: int,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> FakeReply:
        headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
        return self.enqueue(
            FakeReply(status=status, error_message=message, error_code=code, error_type=type_, headers=headers)
        )

    def add_garbage(self, body: bytes = b"data: {this is not json\n\n", content_type: str = "text/event-stream") -> FakeReply:
        return self.enqueue(FakeReply(raw_body=body, content_type=content_type))

    def add_drop_after(self, n: int, text: str = "partial answer that never ends", **kw: Any) -> FakeReply:
        return self.enqueue(FakeReply(text=text, drop_after=n, **kw))

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.request_headers.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- HTTP --------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:  # keep-alive: the SDK reuses pooled connections
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await self._read_body(reader, headers)
                keep = await self._dispatch(method, path.split("?")[0], headers, body, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    return out
                out += data[:-2]
        return await reader.readexactly(int(headers.get("content-length", "0")))

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, extra: dict[str, str]) -> None:
        head = [f"HTTP/1.1 {status} X", f"content-type: {ctype}", f"content-length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in extra.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes, w: asyncio.StreamWriter) -> bool:
        if method == "GET" and path.rstrip("/") in ("/v1/models", "/models"):
            data = [{"id": m, "object": "model", "owned_by": "fake"} for m in sorted(self.models or DEFAULT_MODELS)]
            await self._send(w, 200, json.dumps({"object": "list", "data": data}).encode(), "application/json", {})
            return True
        if method != "POST" or path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            await self._send(w, 404, _error_body(f"Unknown path {path}", "invalid_request_error", None), "application/json", {})
            return True
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = {"_unparseable": raw.decode("utf-8", "replace")}
        with self._lock:
            self.requests.append(req)
            self.request_headers.append(dict(headers))
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            body = _error_body("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            await self._send(w, 401, body, "application/json", {})
            return True
        model = str(req.get("model", ""))
        if self.models is not None and model not in self.models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            await self._send(w, 404, _error_body(msg, "invalid_request_error", "model_not_found"), "application/json", {})
            return True
        with self._lock:
            reply = self._queue.pop(0) if self._queue else None
        if reply is None and self.responder is not None:  # a test's function of the request
            reply = self.responder(req)
        return await self._answer(reply or FakeReply(text=self.default_text), req, w)

    async def _answer(self, reply: FakeReply, req: dict[str, Any], w: asyncio.StreamWriter) -> bool:
        if reply.status != 200:
            msg = reply.error_message or {
                401: "Incorrect API key provided.", 429: "Rate limit reached for requests.",
            }.get(reply.status, f"The server had an error while processing your request ({reply.status}).")
            type_ = reply.error_type or ("invalid_request_error" if reply.status < 500 else "server_error")
            await self._send(w, reply.status, _error_body(msg, type_, reply.error_code), "application/json", reply.headers)
            return True
        if reply.raw_body is not None:
            await self._send(w, 200, reply.raw_body, reply.content_type, reply.headers)
            return True
        model = str(req.get("model", "fake-model"))
        if not req.get("stream"):
            body = json.dumps(self._completion(reply, req, model)).encode()
            await self._send(w, 200, body, "application/json", reply.headers)
            return True
        head = ["HTTP/1.1 200 OK", "content-type: text/event-stream", "transfer-encoding: chunked"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        w.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await w.drain()
        events = [json.dumps(e) for e in self._chunks(reply, req, model)] + ["[DONE]"]
        for i, event in enumerate(events):
            if reply.drop_after is not None and i >= reply.drop_after:
                # Abort without the terminating zero-size chunk: the client sees
                # an incomplete chunked body, like a proxy cutting the line.
                w.transport.abort()
                return False
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            data = f"data: {event}\n\n".encode()
            w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    # -- payloads ----------------------------------------------------------
    @staticmethod
    def _args(call: dict[str, Any]) -> str:
        args = call.get("arguments", "{}")
        return args if isinstance(args, str) else json.dumps(args)

    def _usage(self, reply: FakeReply, req: dict[str, Any]) -> dict[str, Any]:
        prompt = reply.prompt_tokens
        if prompt is None and self.usage_fn is not None:  # a test's own tokenizer model
            prompt = self.usage_fn(req)
        if prompt is None:  # a rough size-based figure, enough for budget tests
            prompt = max(1, len(json.dumps(req.get("messages", []))) // 4)
        completion = reply.completion_tokens
        if completion is None:
            completion = max(1, (len(reply.text) + sum(len(self._args(c)) for c in reply.tool_calls)) // 4)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def _finish(self, reply: FakeReply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    def _chunks(self, reply: FakeReply, req: dict[str, Any], model: str) -> list[dict[str, Any]]:
        cid, created = f"chatcmpl-fake-{next(_ids)}", int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [choice]}

        out = [chunk({"role": "assistant", "content": ""})]
        for piece in split_text(reply.reasoning or "", reply.chunks):
            out.append(chunk({reply.reasoning_field: piece}))
        for piece in split_text(reply.text, reply.chunks):
            out.append(chunk({"content": piece}))
        per_call: list[list[dict[str, Any]]] = []
        for i, call in enumerate(reply.tool_calls):
            first = {"index": i, "id": call.get("id", f"call_fake_{next(_ids)}"), "type": "function",
                     "function": {"name": call.get("name"), "arguments": ""}}
            rest = [{"index": i, "function": {"arguments": p}} for p in split_text(self._args(call), reply.arg_chunks)]
            per_call.append([first, *rest])
        if reply.interleave:
            ordered = [tc for group in itertools.zip_longest(*per_call) for tc in group if tc is not None]
        else:
            ordered = [tc for group in per_call for tc in group]
        out += [chunk({"tool_calls": [tc]}) for tc in ordered]
        out.append(chunk({}, self._finish(reply)))
        if (req.get("stream_options") or {}).get("include_usage"):
            out.append({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": self._usage(reply, req)})
        return out

    def _completion(self, reply: FakeReply, req: dict[str, Any], model: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.reasoning:
            message[reply.reasoning_field] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.get("id", f"call_fake_{next(_ids)}"), "type": "function",
                 "function": {"name": c.get("name"), "arguments": self._args(c)}}
                for c in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-fake-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "usage": self._usage(reply, req),
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(reply), "logprobs": None}],
        }
