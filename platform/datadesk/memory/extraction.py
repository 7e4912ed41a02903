"""Background extraction: candidate facts from the user's own messages (off by default).

Runs after a turn when the workspace sets `memory_extraction = true` (and
memory itself is allowed). Every fact it finds is a `candidate`: nothing it
produces acts before the user confirms it in the memory panel.

What reaches the extraction model, and what comes back, is filtered by code:

- only `user` messages: assistant text and tool output (documents, query
  results, web pages, anything a prompt injection could hide in) are never
  sent;
- a message that asks for privacy ("don't remember", "keep this private",
  "off the record"...) is left out entirely;
- secret values are redacted before the model sees the text, and a returned
  fact that still contains a secret is dropped (`secrets.py`);
- one-off task details ("today", "this chart", "for this query"...) are
  dropped, as is anything over `extraction_max_candidates`;
- the model must answer `{"facts": [{"text", "kind", "importance"}]}`; any
  other output gives no candidates (logged, without the text).

Jobs are serialized per (workspace, user). Before asking the model and again
before each write, the job checks that the user still exists and that memory is
still on: the user's own switch (memory panel, read from the store) and
`memory_on(ws, uid)`, the workspace's `memory` / `memory_extraction` flags and the
user's `memory` permission as the composition root sees them at that moment. A
text the user hard-deleted meanwhile is refused by the store (its hash is kept),
so a late job never brings a deleted fact back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import msgspec

from datadesk.domain.records import Record
from datadesk.llm.base import ChatModel, ModelReply
from datadesk.llm.reply_json import unwrap_object
from datadesk.domain.memory import KINDS, Fact, Provenance
from datadesk.memory.secrets import PLACEHOLDER, contains_secret, redact_secrets
from datadesk.memory.store import FactNotFound, MemoryInputError, MemoryStore
from datadesk.settings import MemorySettings

log = logging.getLogger(__name__)

PRIVATE_RE = re.compile(
    r"(?i)\b(?:(?:don'?t|do not|never|please don'?t|no need to)\s+(?:remember|save|store|memori[sz]e|note)"
    r"|(?:keep|treat)\s+(?:this|that|it)\s+(?:private|secret|confidential|between us|to yourself)"
    r"|off[ -]the[ -]record|not for (?:your |the )?memory|forget (?:this|that|what i said))\b"
)
ONE_OFF_RE = re.compile(
    r"(?i)\b(?:today|tonight|tomorrow|yesterday|right now|just now|for now|at the moment"
    r"|this (?:time|once|query|chart|plot|table|answer|turn|session|conversation|request|question)"
    r"|for this (?:question|query|analysis|chart|plot|request|report))\b"
)
# a user record the server wrote on the user's behalf (a pasted table's preview): data, not words
_SYNTHETIC_RE = re.compile(r"^\[The user (?:pasted|uploaded)[^\]]*\]")

PROMPT = """You maintain a user's long-term memory for a data analysis assistant.
Read ONLY the user's messages below and list durable facts worth remembering across conversations:
stable preferences (formats, language, units, chart styles), facts about their work (teams, clients,
naming conventions, which columns or tables mean what), and standing instructions they gave.
Skip: one-off task details (this query, this chart, today's numbers), anything the user asked to keep
private or not to remember, credentials or personal secrets, and anything you are not sure of.
Write each fact as one short self-contained sentence in the user's language.
Answer with JSON only, exactly: {{"facts": [{{"text": "...", "kind": "preference|fact|instruction",
"importance": 1-5}}]}} with at most {limit} facts; {{"facts": []}} when there is nothing durable."""


class _ExtractedFact(msgspec.Struct):
    text: str
    kind: str = "fact"
    importance: int | float | str = 3


class _ExtractionOutput(msgspec.Struct):
    facts: list[_ExtractedFact]


_output_decoder = msgspec.json.Decoder(_ExtractionOutput)


@dataclass
class ExtractionResult:
    """What a job did: facts added (all candidates), and why others were skipped (reasons only)."""

    added: list[Fact] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str | None = None


def _role_content_seq(msg: Record | dict[str, Any]) -> tuple[str, str, int | None]:
    if isinstance(msg, Record):
        return msg.role, msg.content, msg.seq
    content = msg.get("content")
    return str(msg.get("role", "")), content if isinstance(content, str) else "", msg.get("seq")


def user_texts(messages: Iterable[Record | dict[str, Any]]) -> list[tuple[int | None, str]]:
    """(seq, text) of the user's own messages, private ones left out, secrets redacted."""
    out = []
    for msg in messages:
        role, text, seq = _role_content_seq(msg)
        if role != "user" or not text.strip() or _SYNTHETIC_RE.match(text) or PRIVATE_RE.search(text):
            continue
        out.append((seq, redact_secrets(text)))
    return out


def parse_output(content: str) -> list[_ExtractedFact]:
    """The facts of the model's answer; raises ValueError when it is not the expected JSON."""
    try:
        return unwrap_object(content, _output_decoder.decode).facts  # {"result": {"facts": ...}} too
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not {{'facts': [...]}} JSON: {str(exc)[:120]}") from None


def _importance(value: object) -> int:
    try:
        return min(5, max(1, int(float(value))))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 3


class MemoryExtractor:
    """Runs extraction jobs; one at a time per (workspace, user)."""

    def __init__(self, store: MemoryStore, model: ChatModel, settings: MemorySettings | None = None, *,
                 user_exists: Callable[[str], bool] = lambda uid: True,
                 memory_on: Callable[[str, str], bool] = lambda ws, uid: True, timeout_s: float = 120.0) -> None:
        """`user_exists(uid)`: the user is still there (not deleted or revoked); `memory_on(ws, uid)`:
        the workspace still has memory and extraction on and the user the `memory` permission."""
        self.store = store
        self.model = model
        self.settings = settings or store.settings
        self.user_exists = user_exists
        self.memory_on = memory_on
        self.timeout_s = timeout_s
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def _stopped(self, ws: str, uid: str) -> str:
        """Why this job must not write now ("" when it may): checked at the last moment."""
        if not self.user_exists(uid):
            return "the user no longer exists"
        if not self.store.user_enabled(ws, uid) or not self.memory_on(ws, uid):
            return "memory was turned off"
        return ""

    def _lock(self, ws: str, uid: str) -> asyncio.Lock:
        return self._locks.setdefault((ws, uid), asyncio.Lock())

    async def extract(self, ws: str, uid: str, messages: Iterable[Record | dict[str, Any]],
                      thread: str | None = None) -> ExtractionResult:
        """Find candidate facts in the user's messages of a turn and store them as candidates."""
        texts = user_texts(messages)
        result = ExtractionResult()
        if not texts or self._stopped(ws, uid):
            return result
        limit = self.settings.extraction_max_candidates
        async with self._lock(ws, uid):
            try:
                reply = await asyncio.wait_for(self._ask(texts, limit), self.timeout_s)
                facts = parse_output(reply)
            except Exception as exc:  # a broken or slow model costs nothing but the candidates
                log.warning("memory extraction for %s/%s gave no candidates: %s", ws, uid,
                            f"{type(exc).__name__}: {str(exc)[:200]}")
                result.error = str(exc) or type(exc).__name__
                return result
            seq = next((s for s, _ in reversed(texts) if s is not None), None)
            for item in facts:
                if len(result.added) >= limit:
                    result.skipped.append("over the per-turn limit")
                    continue
                why = self._refuse(item)
                if why:
                    result.skipped.append(why)
                    continue
                # the user may have been deleted, or memory turned off, while the model answered
                stopped = self._stopped(ws, uid)
                if stopped:
                    result.skipped.append(stopped)
                    break
                try:
                    fact = self.store.remember(
                        ws, uid, item.text.strip(), kind=item.kind if item.kind in KINDS else "fact",
                        importance=_importance(item.importance), source="extraction",
                        provenance=Provenance(source="extraction", user_seq=seq, thread=thread))
                except (MemoryInputError, FactNotFound) as exc:
                    result.skipped.append(str(exc))
                    continue
                result.added.append(fact)
        return result

    @staticmethod
    def _refuse(item: _ExtractedFact) -> str:
        text = item.text.strip()
        if not text:
            return "empty"
        if PLACEHOLDER in text or contains_secret(text):
            return "contains a secret"
        if PRIVATE_RE.search(text):
            return "the user asked to keep it private"
        if ONE_OFF_RE.search(text):
            return "a one-off task detail"
        return ""

    async def _ask(self, texts: list[tuple[int | None, str]], limit: int) -> str:
        listing = json.dumps([{"seq": s, "text": t} for s, t in texts], ensure_ascii=False, indent=1)
        messages = [
            {"role": "system", "content": PROMPT.format(limit=limit)},
            {"role": "user", "content": f"The user's messages:\n{listing}"},
        ]
        content = None
        async for event in self.model.stream(messages, []):
            if isinstance(event, ModelReply):
                content = event.content
        if content is None:
            raise ValueError("the model gave no reply")
        return content
