"""The memory record (`Fact`), its document (`memory.json`) and the pure rules on facts.

Contradiction rule (deterministic, no model involved). Two facts contradict
when they have the same scope and the same *subject* but a different
*remainder*:

1. The text is normalised (`normalise`: casefold, whitespace collapsed,
   trailing punctuation stripped).
2. If it contains a linking verb as a whole word (`is`, `are`, `was`, `were`,
   `should`, `must`) or a `=` / `:`, the first such marker splits it: the
   subject is the text before it, the remainder the text after it. Both are
   reduced to their content words (articles, pronouns and prepositions such
   as "the", "my", "in" dropped), so "The reports are in English" has subject
   "reports" and remainder "english". A leading marker (empty subject) does
   not count.
3. Without a marker, a text of more than 4 content words has as subject its
   first 4 content words and as remainder the rest; a shorter text has no
   subject and never contradicts anything on its own.
4. Independently, `replaces=<fact id>` (or `contradicts=[ids]`) names the facts a
   new one contradicts. A named contradiction that is the user's own correction
   (said in this turn, no tool output in between: `MemoryStore.remember(...,
   user_correction=True)`) supersedes the named facts at once; the rule above is
   only the guard for what nobody named, and makes a conflict for the user.

So "Reports are in English" and "Reports should be in Chinese" contradict;
"Client A's reports are in English" and "Client B's reports are in Chinese"
do not (different subjects), and neither do facts in different scopes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable, Literal

import msgspec

Kind = Literal["preference", "fact", "instruction"]
Status = Literal["active", "candidate", "conflict", "superseded", "forgotten"]
Source = Literal["user", "panel", "extraction"]

KINDS: tuple[str, ...] = ("preference", "fact", "instruction")
STATUSES: tuple[str, ...] = ("active", "candidate", "conflict", "superseded", "forgotten")
SOURCES: tuple[str, ...] = ("user", "panel", "extraction")
PENDING = ("candidate", "conflict")  # waiting for the user; never injected
LIVE = ("active", "candidate", "conflict")  # not history: duplicates are checked against these

SCOPE_RE = re.compile(r"^(workspace|project:[A-Za-z0-9][A-Za-z0-9 _.-]{0,63})$")
RECENCY_HALF_LIFE_DAYS = 30.0


class Provenance(msgspec.Struct):
    """Where a fact came from: the user message it followed and whether tool output came between."""

    source: Source = "user"
    user_seq: int | None = None  # seq of the user message of the turn that made it
    after_tool_output: bool = False  # tool output came between that message and the write
    thread: str | None = None


class Fact(msgspec.Struct):
    """One remembered fact. Only `active` (and unexpired, in-scope) facts reach the model."""

    id: str
    text: str
    kind: Kind = "fact"
    importance: int = 3  # 1-5
    scope: str = "workspace"  # "workspace" or "project:<label>"
    status: Status = "active"
    provenance: Provenance = msgspec.field(default_factory=Provenance)
    created: float = 0.0
    updated: float = 0.0
    confirmed: float | None = None  # last time the user confirmed it (made, confirmed, edited)
    expires_at: float | None = None
    supersedes: list[str] = msgspec.field(default_factory=list)  # older facts this one replaced
    superseded_by: str | None = None
    conflicts_with: str | None = None  # the active fact this conflict contradicts
    replaces: str | None = None  # explicit `replaces=` of the call that made it
    named: list[str] = msgspec.field(default_factory=list)  # further facts the call named as contradicted
    reason: str = ""  # why it is a candidate / conflict / inactive, in words

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def in_scope(self, project: str | None) -> bool:
        return self.scope == "workspace" or (project is not None and self.scope == f"project:{project}")


class MemoryDoc(msgspec.Struct):
    """`memory.json` of one user in one workspace."""

    version: int = 1
    enabled: bool = True  # the user's own switch (the panel); acts only if workspace + permission allow
    facts: list[Fact] = msgspec.field(default_factory=list)
    deleted: list[str] = msgspec.field(default_factory=list)  # sha256 of hard-deleted normalised texts

    def get(self, fid: str) -> Fact | None:
        return next((f for f in self.facts if f.id == fid), None)


# -- normalisation and hashing -------------------------------------------------
_WS = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.!?;,:]+$")


def normalise(text: str) -> str:
    """Casefold, collapse whitespace, strip trailing punctuation (the duplicate key)."""
    return _TRAILING.sub("", _WS.sub(" ", text.casefold()).strip())


def text_hash(text: str) -> str:
    """The sha256 of the normalised text: remembered for hard deletes instead of the text."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()


# -- the contradiction rule ----------------------------------------------------
_MARKER = re.compile(r"(?:\b(?:is|are|was|were|should|must)\b|[=:])")
_WORD = re.compile(r"[\w'’-]+")
STOPWORDS = frozenset(
    "a an the this that these those my our your their his her its we i you they he she it "
    "in on at of for to by with from into as and or be been always never all any every "
    "please".split()
)


def content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.casefold()) if w not in STOPWORDS]


def subject_and_remainder(text: str) -> tuple[str, str] | None:
    """(subject, remainder) of a fact by the rule in the module docstring, or None."""
    norm = normalise(text)
    m = _MARKER.search(norm)
    if m is not None:
        subject = content_words(norm[: m.start()])
        if subject:
            return " ".join(subject), " ".join(content_words(norm[m.end():]))
    words = content_words(norm)
    if len(words) > 4:
        return " ".join(words[:4]), " ".join(words[4:])
    return None


def contradicts(a: Fact | str, b: Fact | str) -> bool:
    """True when `a` and `b` say different things about the same subject (same scope for facts)."""
    if isinstance(a, Fact) and isinstance(b, Fact) and a.scope != b.scope:
        return False
    ta = a.text if isinstance(a, Fact) else a
    tb = b.text if isinstance(b, Fact) else b
    sa, sb = subject_and_remainder(ta), subject_and_remainder(tb)
    return sa is not None and sb is not None and sa[0] == sb[0] and sa[1] != sb[1]


# -- capacity score ------------------------------------------------------------
def score(fact: Fact, now: float) -> float:
    """Importance weighted by recency (half-life 30 days since last confirmed); expired is -1."""
    if fact.expired(now):
        return -1.0
    since = fact.confirmed or fact.updated or fact.created
    age_days = max(0.0, now - since) / 86_400
    return fact.importance * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)


# -- injection -----------------------------------------------------------------
def injectable(facts: Iterable[Fact], project: str | None = None, now: float | None = None) -> list[Fact]:
    """Active, unexpired facts in scope (workspace facts + this project's), most important first."""
    import time

    now = time.time() if now is None else now
    chosen = [f for f in facts if f.status == "active" and not f.expired(now) and f.in_scope(project)]
    return sorted(chosen, key=lambda f: (-f.importance, f.created, f.id))


DISPUTES_SHOWN = 3  # newer conflicting texts quoted in one disputed fact's label


def disputes(facts: Iterable[Fact], project: str | None = None, now: float | None = None) -> dict[str, list[Fact]]:
    """For each fact id, the unresolved `conflict` facts that contradict it (in scope, unexpired),
    newest first: while the user has not resolved them, the older fact is disputed."""
    import time

    now = time.time() if now is None else now
    out: dict[str, list[Fact]] = {}
    for f in facts:
        if f.status == "conflict" and f.conflicts_with and not f.expired(now) and f.in_scope(project):
            out.setdefault(f.conflicts_with, []).append(f)
    for newer in out.values():
        newer.sort(key=lambda f: (-f.created, f.id))
    return out


def dispute_label(newer: list[Fact]) -> str:
    """The label a disputed fact carries in the memory block, so the model does not take it as
    settled: what the newer facts say, and that the user has not chosen."""
    quoted = " and ".join(f'"{_WS.sub(" ", f.text).strip()}"' for f in newer[:DISPUTES_SHOWN])
    more = f" (and {len(newer) - DISPUTES_SHOWN} more)" if len(newer) > DISPUTES_SHOWN else ""
    return (f"(disputed: a newer memory says {quoted}{more} and the user has not chosen which holds; "
            "ask them before relying on either; they resolve it in the memory panel)")


def render_memory_block(facts: Iterable[Fact], project: str | None = None, now: float | None = None) -> str:
    """One line per injectable fact, with its id so the model can `forget` it:
    `- [f1a2...] (preference) Reports in English`; project facts name their scope. A fact that
    an unresolved conflict contradicts is labelled disputed (`dispute_label`), quoting the newer
    text, which is never injected as a fact of its own. Empty string when nothing is injectable."""
    facts = list(facts)
    disputed = disputes(facts, project, now)
    lines = []
    for f in injectable(facts, project, now):
        scope = "" if f.scope == "workspace" else f" [{f.scope}]"
        label = f" {dispute_label(disputed[f.id])}" if f.id in disputed else ""
        lines.append(f"- [{f.id}] ({f.kind}){scope} {_WS.sub(' ', f.text).strip()}{label}")
    return "\n".join(lines)
