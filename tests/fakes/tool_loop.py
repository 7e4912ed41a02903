"""A fake OpenAI server whose replies follow the request, for many threads at once.

Replies cannot come from a FIFO when several threads (and several app workers)
call the model concurrently, so `ToolLoopServer` answers from the request:

- a summary request (the summarizer's system prompt) gets the deterministic fake
  summary of `tests.unit.test_summary.faithful`, and is kept in
  `summary_requests`;
- a chat request whose last message is the user's gets one `python` tool call
  (`code_for(user_text)`; by default a counter kept in the kernel, tagged with the
  user text, so the next turns show whether the kernel survived);
- a chat request whose last message is a tool result gets the final answer.

`delay_s` is slept before each streamed event (model latency). The server's own
time per request (from the request to the last byte) is added up per user text
in `model_seconds`, so a benchmark can subtract the model's time from a turn.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Any

from tests.fakes.openai_server import FakeOpenAIServer, FakeReply

SUMMARY_MARK = "running summary of a data-analysis chat thread"


def counter_code(user_text: str) -> str:
    return (f"# {user_text}\n"
            "try:\n    turns_seen += 1\nexcept NameError:\n    turns_seen = 1\n"
            f"print('count', turns_seen, {user_text!r})")


class ToolLoopServer(FakeOpenAIServer):
    def __init__(self, delay_s: float = 0.0, code_for=counter_code, **kw: Any) -> None:
        super().__init__(**kw)
        self.delay_s = delay_s
        self.code_for = code_for
        self.summary_requests: list[str] = []
        self.model_seconds: dict[str, float] = defaultdict(float)
        self.chat_calls = 0
        self._stats = threading.Lock()

    def respond(self, req: dict[str, Any]) -> tuple[FakeReply, str]:
        """The reply for a request, and the key its time is counted under."""
        messages = req.get("messages") or []
        system = str(messages[0].get("content", "")) if messages else ""
        if SUMMARY_MARK in system:
            from tests.unit.test_summary import faithful

            with self._stats:
                self.summary_requests.append(str(messages[1].get("content", "")))
            return FakeReply(text=faithful(messages, []), chunks=1), "(summary)"
        user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        with self._stats:
            self.chat_calls += 1
        if messages and messages[-1].get("role") == "tool":
            return FakeReply(text=f"Done: {user}", chunks=2, delay_s=self.delay_s), user
        call = {"name": "python", "arguments": json.dumps({"code": self.code_for(user)})}
        return FakeReply(tool_calls=[call], arg_chunks=2, delay_s=self.delay_s), user

    async def _answer(self, reply: FakeReply, req: dict[str, Any], w: Any) -> bool:
        if reply.text != self.default_text or reply.tool_calls or reply.status != 200:
            return await super()._answer(reply, req, w)  # a reply a test queued explicitly
        t0 = time.perf_counter()
        mine, key = self.respond(req)
        try:
            return await super()._answer(mine, req, w)
        finally:
            with self._stats:
                self.model_seconds[key] += time.perf_counter() - t0
