"""`MemoryStore`: one memory document per workspace + user, and every rule of memory.

Storage (`store.interfaces.memory.MemoryDocs`, passed in; never shared across users or workspaces):

- the embedded default, `FileMemoryDocs`, in `Layout.user_dir(ws, uid)`: `memory.json`
  (the user's switch, the facts, and the sha256 of hard-deleted texts: `MemoryDoc`),
  written atomically under `memory.json.lock` (a cross-process `filelock`), so the
  server, background jobs and the CLI never lose each other's writes; and
  `memory.audit.jsonl`, the append-only audit;
- the cluster set, `cluster.memory.PgMemoryDocs`: one row per user updated under
  `SELECT ... FOR UPDATE`, the audit in a table, both in one transaction.

The audit holds events (created, confirmed, resolved, edited, superseded, forgotten,
deleted) with fact ids, status and times but never the text, so a hard delete leaves
nothing readable.

Rules (DESIGN section 8):

- Only `active` facts act. A `remember` after tool output in the same turn,
  every extracted fact, and an `instruction` the user did not ask for
  directly become `candidate` until the user confirms them.
- A fact that contradicts an active one (see `model.py` for the rule, or an
  explicit `replaces=`) becomes `conflict` until the user resolves it; it
  never overwrites silently. From the panel, an explicit `replaces=` is the
  user's own decision and supersedes directly.
- Caps: `max_chars` per fact; exact duplicates (normalised, same scope) are
  refused; over `max_active` / `max_total_chars` the active fact with the
  lowest importance-and-recency score becomes `superseded` (reason
  "capacity"); at most `max_inactive` inactive facts are kept (history
  first, oldest first).
- Secrets are refused in any fact, whatever its source.
- `forget` is soft (status `forgotten`); `delete` / `delete_all` are hard:
  the fact, its history and same-text copies go, only the ids reach the
  audit, the text hash is kept so a late job cannot bring it back, and the
  text is redacted from the user's thread summaries in that workspace.

Errors: `MemoryInputError` (bad text, kind, importance, scope, a secret, a
deleted text) with its subclasses `DuplicateFact` and `FactStateError` (an
operation the fact's status does not allow); `FactNotFound` for an unknown
id; `MemoryStoreError` for an unreadable stored document.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Iterator

import msgspec
from filelock import FileLock

from datadesk.domain.ids import new_id
from datadesk.domain.memory import (
    KINDS,
    LIVE,
    PENDING,
    SCOPE_RE,
    SOURCES,
    Fact,
    MemoryDoc,
    Provenance,
    contradicts,
    normalise,
    render_memory_block,
    injectable,
    score,
    text_hash,
)
from datadesk.memory.secrets import find_secrets
from datadesk.settings import MemorySettings
from datadesk.store.interfaces.memory import AuditEvent, MemoryDocs, MemoryStoreError
from datadesk.store.files import read_json, write_json
from datadesk.store.layout import Layout

log = logging.getLogger(__name__)

DELETED_HASHES_KEPT = 1_000  # hard-deleted text hashes remembered per user (oldest dropped)
REDACTED = "[deleted memory]"


class MemoryInputError(ValueError):
    """A fact or an operation memory refuses; the message says what was wrong."""


class DuplicateFact(MemoryInputError):
    def __init__(self, message: str, fact_id: str) -> None:
        super().__init__(message)
        self.fact_id = fact_id


class FactStateError(MemoryInputError):
    """The fact's status does not allow this operation (confirm a forgotten fact...)."""


class FactNotFound(LookupError):
    """No fact with this id in this user's memory of this workspace."""


def memory_access(workspace_on: bool, permissions: Iterable[str], workspace: str = "") -> tuple[bool, str]:
    """Whether the workspace flag and the user's permission allow memory (the panel's gate)."""
    if not workspace_on:
        where = f" in workspace {workspace!r}" if workspace else " in this workspace"
        return False, f"memory is off{where} (an admin enables it with `memory = true` in workspace.toml)"
    if "memory" not in set(permissions):
        return False, "you do not have the memory permission (an admin grants it with `--memory`)"
    return True, ""


class FileMemoryDocs:
    """`MemoryDocs` of the embedded set: `memory.json` (written atomically under
    `memory.json.lock`, a cross-process `filelock`) and `memory.audit.jsonl`, in
    `Layout.user_dir(ws, uid)`."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def path(self, ws: str, uid: str) -> Path:
        return self.layout.user_dir(ws, uid) / "memory.json"

    def audit_path(self, ws: str, uid: str) -> Path:
        return self.layout.user_dir(ws, uid) / "memory.audit.jsonl"

    def read(self, ws: str, uid: str) -> MemoryDoc:
        path = self.path(ws, uid)
        try:
            return msgspec.convert(read_json(path, {}), MemoryDoc)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MemoryStoreError(f"{path}: unreadable memory file: {exc}") from exc

    @contextlib.contextmanager
    def update(self, ws: str, uid: str) -> Iterator[tuple[MemoryDoc, list[AuditEvent]]]:
        """Load, change and save `memory.json` under its file lock; then append the audit events."""
        path = self.path(ws, uid)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            doc = self.read(ws, uid)
            events: list[AuditEvent] = []
            yield doc, events
            write_json(path, doc, mode=0o600)
            if events:
                with open(self.audit_path(ws, uid), "ab") as fh:
                    fh.write(b"".join(msgspec.json.encode(e) + b"\n" for e in events))

    def audit(self, ws: str, uid: str) -> list[AuditEvent]:
        try:
            raw = self.audit_path(ws, uid).read_bytes()
        except FileNotFoundError:
            return []
        events = []
        for line in raw.splitlines():
            try:
                events.append(msgspec.json.decode(line, type=AuditEvent))
            except (msgspec.DecodeError, msgspec.ValidationError):  # a torn last line
                log.warning("%s: skipping an unreadable audit line", self.audit_path(ws, uid))
        return events


class MemoryStore:
    """Facts of one user in one workspace, with the rules of the module docstring.

    `docs` is where the documents live (`store.interfaces.memory.MemoryDocs`): by default the files of
    `FileMemoryDocs`, in the cluster set `cluster.memory.PgMemoryDocs`. `threads` is the
    thread store whose summaries a hard delete redacts (by default the files' `ThreadStore`)."""

    def __init__(self, layout: Layout, settings: MemorySettings | None = None,
                 clock: Callable[[], float] = time.time, docs: MemoryDocs | None = None,
                 threads: Any = None) -> None:
        self.layout = layout
        self.settings = settings or MemorySettings()
        self.clock = clock
        self.docs: MemoryDocs = docs if docs is not None else FileMemoryDocs(layout)
        self.threads = threads

    # -- storage -----------------------------------------------------------------
    def path(self, ws: str, uid: str) -> Path:
        """Where the embedded set keeps `memory.json` (the files' layout, whatever `docs` is)."""
        return FileMemoryDocs(self.layout).path(ws, uid)

    def audit_path(self, ws: str, uid: str) -> Path:
        return FileMemoryDocs(self.layout).audit_path(ws, uid)

    def _load(self, ws: str, uid: str) -> MemoryDoc:
        return self.docs.read(ws, uid)

    def _update(self, ws: str, uid: str) -> ContextManager[tuple[MemoryDoc, list[AuditEvent]]]:
        """The user's document locked for a change, saved with its audit events on a normal exit."""
        return self.docs.update(ws, uid)

    def audit(self, ws: str, uid: str) -> list[AuditEvent]:
        """The user's audit events, oldest first (never a fact's text)."""
        return self.docs.audit(ws, uid)

    # -- reading ---------------------------------------------------------------
    def facts(self, ws: str, uid: str) -> list[Fact]:
        """Every stored fact of this user in this workspace (all statuses)."""
        return self._load(ws, uid).facts

    def get(self, ws: str, uid: str, fid: str) -> Fact:
        return _need(self._load(ws, uid), fid)

    def active(self, ws: str, uid: str, project: str | None = None, now: float | None = None) -> list[Fact]:
        """The facts that act: active, unexpired, workspace-scoped or of `project`."""
        return injectable(self.facts(ws, uid), project, self.clock() if now is None else now)

    def block(self, ws: str, uid: str, project: str | None = None, now: float | None = None) -> str:
        """The memory block for the model ("" when there is nothing to inject)."""
        return render_memory_block(self.facts(ws, uid), project, self.clock() if now is None else now)

    def user_enabled(self, ws: str, uid: str) -> bool:
        return self._load(ws, uid).enabled

    def set_user_enabled(self, ws: str, uid: str, enabled: bool) -> None:
        with self._update(ws, uid) as (doc, _):
            doc.enabled = bool(enabled)

    def allowed(self, ws: str, uid: str, workspace_on: bool, permissions: Iterable[str]) -> tuple[bool, str]:
        """All three switches: workspace flag, permission, the user's own switch."""
        ok, why = memory_access(workspace_on, permissions, ws)
        if not ok:
            return ok, why
        if not self.user_enabled(ws, uid):
            return False, "you turned memory off in the memory panel"
        return True, ""

    def is_deleted_text(self, ws: str, uid: str, text: str) -> bool:
        return text_hash(text) in self._load(ws, uid).deleted

    # -- validation --------------------------------------------------------------
    def _check_text(self, text: object) -> str:
        if not isinstance(text, str) or not text.strip():
            raise MemoryInputError("the fact text is empty")
        text = text.strip()
        if len(text) > self.settings.max_chars:
            raise MemoryInputError(f"the fact is {len(text)} characters; the limit is {self.settings.max_chars}")
        secrets = find_secrets(text)
        if secrets:
            raise MemoryInputError(f"memory never keeps secrets: the text contains a {secrets[0]}")
        return text

    @staticmethod
    def _check_fields(kind: object, importance: object, scope: object) -> None:
        if kind not in KINDS:
            raise MemoryInputError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if isinstance(importance, bool) or not isinstance(importance, int) or not 1 <= importance <= 5:
            raise MemoryInputError(f"importance must be an integer from 1 to 5, not {importance!r}")
        if not isinstance(scope, str) or not SCOPE_RE.fullmatch(scope):
            raise MemoryInputError(f"scope must be 'workspace' or 'project:<label>', not {scope!r}")

    @staticmethod
    def _duplicate(doc: MemoryDoc, text: str, scope: str, other_than: str | None = None) -> Fact | None:
        key = normalise(text)
        return next((f for f in doc.facts if f.status in LIVE and f.scope == scope and f.id != other_than
                     and normalise(f.text) == key), None)

    # -- the rules ---------------------------------------------------------------
    def remember(self, ws: str, uid: str, text: str, kind: str = "fact", importance: int = 3,
                 scope: str = "workspace", provenance: Provenance | None = None, source: str = "user",
                 replaces: str | None = None, user_asked: bool = False,
                 expires_at: float | None = None, contradicts: Iterable[str] = (),
                 user_correction: bool = False) -> Fact:
        """Store a fact; its status follows the rules (active, candidate or conflict).

        `replaces` / `contradicts` name the facts it corrects. With `user_correction` (the
        caller checked that the user said it in this turn, with no tool output in between)
        the named facts are superseded at once (kept as `superseded` for the audit);
        otherwise a named active fact makes this one a conflict for the user to resolve."""
        text = self._check_text(text)
        self._check_fields(kind, importance, scope)
        if source not in SOURCES:
            raise MemoryInputError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
        prov = msgspec.structs.replace(provenance or Provenance(), source=source)  # type: ignore[arg-type]
        with self._update(ws, uid) as (doc, events):
            now = self.clock()
            dup = self._duplicate(doc, text, scope)
            if dup is not None:
                raise DuplicateFact(f"already remembered as {dup.id} ({dup.status}): an exact duplicate is "
                                    "not stored twice", dup.id)
            digest = text_hash(text)
            if digest in doc.deleted:
                if source != "panel":
                    raise MemoryInputError("the user deleted this fact from memory; only they can add it "
                                           "again, in the memory panel")
                doc.deleted.remove(digest)
            if replaces is not None and doc.get(replaces) is None:
                raise FactNotFound(f"no fact {replaces!r} to replace")
            named = [x for x in dict.fromkeys(contradicts) if x != replaces]
            missing = [x for x in named if not isinstance(x, str) or doc.get(x) is None]
            if missing:
                raise FactNotFound(f"no fact {missing[0]!r} to contradict")
            fact = Fact(id=new_id("f"), text=text, kind=kind, importance=importance,  # type: ignore[arg-type]
                        scope=scope, status="candidate", provenance=prov, created=now, updated=now,
                        expires_at=expires_at, replaces=replaces, named=named)
            # an identical fact forgotten or superseded earlier is history of this one: drop the copy
            copies = {f.id for f in doc.facts if f.status not in LIVE and f.scope == scope
                      and normalise(f.text) == normalise(text)}
            _unlink(doc, copies)
            events.extend(AuditEvent(ts=now, event="deleted", fact=c, reason="same text remembered again")
                          for c in sorted(copies))
            why = _pending_reason(source, prov.after_tool_output, kind, user_asked)
            doc.facts.append(fact)
            if why:
                fact.reason = why
            else:
                fact.confirmed = now
                self._place(doc, fact, now, events, explicit_replace=source == "panel" or user_correction)
            events.insert(0, AuditEvent(ts=now, event="created", fact=fact.id, status=fact.status, kind=kind,
                                        source=source))
            self._bound_history(doc, now, events)
        return fact

    def confirm(self, ws: str, uid: str, fid: str) -> Fact:
        """The user confirms a candidate (it becomes active, or a conflict); an active fact is refreshed."""
        with self._update(ws, uid) as (doc, events):
            now = self.clock()
            fact = _need(doc, fid)
            if fact.status == "conflict":
                raise FactStateError(f"fact {fid} is a conflict: resolve it (keep the new or the old fact)")
            if fact.status not in ("candidate", "active"):
                raise FactStateError(f"fact {fid} is {fact.status}; only candidates can be confirmed")
            fact.confirmed = fact.updated = now
            if fact.status == "candidate":
                fact.reason = ""
                self._place(doc, fact, now, events)
            events.insert(0, AuditEvent(ts=now, event="confirmed", fact=fid, status=fact.status))
            self._bound_history(doc, now, events)
        return fact

    def resolve(self, ws: str, uid: str, fid: str, keep: str) -> Fact:
        """Resolve conflict `fid`: keep "new" (it replaces the old fact), "old" (it is dropped) or
        "both" (the user says they do not contradict: both act)."""
        if keep not in ("new", "old", "both"):
            raise MemoryInputError(f"keep must be 'new', 'old' or 'both', not {keep!r}")
        with self._update(ws, uid) as (doc, events):
            now = self.clock()
            fact = _need(doc, fid)
            if fact.status != "conflict":
                raise FactStateError(f"fact {fid} is {fact.status}, not a conflict")
            old = doc.get(fact.conflicts_with) if fact.conflicts_with else None
            fact.conflicts_with, fact.reason, fact.updated = None, "", now
            if keep == "new":
                if old is not None:
                    if old.status == "active":
                        _supersede(old, fact, now, events, "resolved")
                    if old.id not in fact.supersedes:
                        fact.supersedes.append(old.id)
                fact.confirmed = now
                self._place(doc, fact, now, events, explicit_replace=True)
            elif keep == "both":  # the user's decision: no rule turns it back into a conflict
                fact.status, fact.confirmed, fact.replaces, fact.named = "active", now, None, []
                self._enforce_caps(doc, now, {fact.id}, events)
            else:
                fact.status = "superseded"
                fact.reason = f"conflict resolved: the user kept {old.id}" if old else "conflict resolved"
                fact.superseded_by = old.id if old else None
                if old is not None and old.status == "active":
                    old.confirmed = now
            events.insert(0, AuditEvent(ts=now, event="resolved", fact=fid, status=fact.status,
                                        reason=f"keep-{keep}"))
            self._bound_history(doc, now, events)
        return fact

    def edit(self, ws: str, uid: str, fid: str, text: str) -> Fact:
        """The user rewrites a fact's text (active, candidate or conflict); the id stays."""
        text = self._check_text(text)
        with self._update(ws, uid) as (doc, events):
            now = self.clock()
            fact = _need(doc, fid)
            if fact.status not in LIVE:
                raise FactStateError(f"fact {fid} is {fact.status}; add it again instead of editing it")
            dup = self._duplicate(doc, text, fact.scope, other_than=fid)
            if dup is not None:
                raise DuplicateFact(f"already remembered as {dup.id} ({dup.status})", dup.id)
            fact.text, fact.updated = text, now
            if fact.status == "active":
                fact.confirmed = now
                other = next((a for a in doc.facts if a.status == "active" and a.id != fid
                              and contradicts(fact, a)), None)
                if other is not None:
                    fact.status, fact.conflicts_with = "conflict", other.id
                    fact.reason = f"contradicts {other.id}: the user resolves it"
                else:
                    self._enforce_caps(doc, now, {fid}, events)
            events.insert(0, AuditEvent(ts=now, event="edited", fact=fid, status=fact.status))
            self._bound_history(doc, now, events)
        return fact

    def forget(self, ws: str, uid: str, fid: str, reason: str = "") -> Fact:
        """Soft delete: the fact stops acting but stays in the history (status `forgotten`)."""
        with self._update(ws, uid) as (doc, events):
            now = self.clock()
            fact = _need(doc, fid)
            if fact.status == "forgotten":
                return fact
            if fact.status == "superseded":
                raise FactStateError(f"fact {fid} is already inactive (superseded)")
            fact.status, fact.updated = "forgotten", now
            fact.reason = (reason or "").strip()[:200] or "forgotten"
            events.append(AuditEvent(ts=now, event="forgotten", fact=fid, status="forgotten"))
            self._bound_history(doc, now, events)
        return fact

    def delete(self, ws: str, uid: str, fid: str) -> list[str]:
        """Hard delete of one fact, its history and same-text copies; returns the ids removed."""
        with self._update(ws, uid) as (doc, events):
            target = _need(doc, fid)
            by_id = {f.id: f for f in doc.facts}
            gone = {fid}
            todo = list(target.supersedes)
            while todo:  # older versions this fact replaced are its history
                old = by_id.get(todo.pop())
                if old is not None and old.id not in gone and old.status not in LIVE:
                    gone.add(old.id)
                    todo.extend(old.supersedes)
            key = normalise(target.text)
            gone |= {f.id for f in doc.facts if normalise(f.text) == key}
            texts = self._drop(doc, gone, events)
        self.redact_summaries(ws, uid, texts)
        return sorted(gone)

    def delete_all(self, ws: str, uid: str) -> list[str]:
        """Hard delete of every fact of this user in this workspace (the switch stays)."""
        with self._update(ws, uid) as (doc, events):
            gone = {f.id for f in doc.facts}
            texts = self._drop(doc, gone, events)
        self.redact_summaries(ws, uid, texts)
        return sorted(gone)

    # -- internals ---------------------------------------------------------------
    def _drop(self, doc: MemoryDoc, gone: set[str], events: list[AuditEvent]) -> list[str]:
        now = self.clock()
        texts = [f.text for f in doc.facts if f.id in gone]
        _unlink(doc, gone)
        for digest in dict.fromkeys(text_hash(t) for t in texts):
            if digest in doc.deleted:
                doc.deleted.remove(digest)
            doc.deleted.append(digest)
        del doc.deleted[:-DELETED_HASHES_KEPT]
        events.extend(AuditEvent(ts=now, event="deleted", fact=fid) for fid in sorted(gone))
        return texts

    def _place(self, doc: MemoryDoc, fact: Fact, now: float, events: list[AuditEvent],
               explicit_replace: bool = False) -> None:
        """A fact the user stands behind: active, unless it contradicts an active fact (conflict).
        `explicit_replace` (the panel, the user's own correction, a resolved conflict): the
        facts it names (`replaces`, `named`) are superseded at once; otherwise a named active
        fact makes it a conflict. The deterministic rule guards what nobody named."""
        targets = [t for t in (doc.get(x) for x in [fact.replaces, *fact.named] if x)
                   if t is not None and t.id != fact.id]
        named = {t.id for t in targets}
        other = next((t for t in targets if t.status == "active"), None) if not explicit_replace else None
        if other is None:
            other = next((a for a in doc.facts if a.status == "active" and a.id != fact.id
                          and a.id not in named and contradicts(fact, a)), None)
        if other is not None:
            fact.status, fact.conflicts_with = "conflict", other.id
            fact.reason = f"contradicts {other.id}: the user resolves it"
            return
        for target in targets:
            if target.status in ("active", *PENDING):
                _supersede(target, fact, now, events, "replaced")
            if target.id not in fact.supersedes:
                fact.supersedes.append(target.id)
        fact.status = "active"
        self._enforce_caps(doc, now, {fact.id}, events)

    def _enforce_caps(self, doc: MemoryDoc, now: float, keep: set[str], events: list[AuditEvent]) -> None:
        """Over `max_active` or `max_total_chars`, the lowest score goes inactive (never `keep`
        while another fact can go instead)."""
        s = self.settings
        active = [f for f in doc.facts if f.status == "active"]
        while active and (len(active) > s.max_active or sum(len(f.text) for f in active) > s.max_total_chars):
            pool = [f for f in active if f.id not in keep] or active
            victim = min(pool, key=lambda f: (score(f, now), f.confirmed or f.updated, f.id))
            victim.status, victim.updated, victim.reason = "superseded", now, "capacity"
            events.append(AuditEvent(ts=now, event="superseded", fact=victim.id, status="superseded",
                                     reason="capacity"))
            active.remove(victim)

    def _bound_history(self, doc: MemoryDoc, now: float, events: list[AuditEvent]) -> None:
        """At most `max_inactive` inactive facts: history (superseded, forgotten) goes first, oldest first."""
        inactive = [f for f in doc.facts if f.status != "active"]
        excess = len(inactive) - self.settings.max_inactive
        if excess <= 0:
            return
        drop = {f.id for f in sorted(inactive, key=lambda f: (f.status in PENDING, f.updated, f.id))[:excess]}
        _unlink(doc, drop)
        events.extend(AuditEvent(ts=now, event="deleted", fact=fid, reason="history limit") for fid in sorted(drop))

    # -- summary redaction -------------------------------------------------------
    def redact_summaries(self, ws: str, uid: str, texts: Iterable[str]) -> int:
        """Replace `texts` (case and spacing insensitive) with "[deleted memory]" in this user's thread
        summaries of this workspace (the current one and its revisions). Returns documents changed."""
        patterns = [p for p in (_text_pattern(t) for t in texts) if p is not None]
        if not patterns:
            return 0
        threads = self.threads
        if threads is None:
            from datadesk.store.threads import ThreadStore

            threads = ThreadStore(self.layout)
        return sum(thread.rewrite_summaries(lambda value: _redact(value, patterns))
                   for thread in threads.folders(ws, uid))


def _need(doc: MemoryDoc, fid: str) -> Fact:
    fact = doc.get(fid) if isinstance(fid, str) else None
    if fact is None:
        raise FactNotFound(f"no fact {fid!r} in memory")
    return fact


def _unlink(doc: MemoryDoc, gone: set[str]) -> None:
    """Remove facts `gone`; no link of the others may point at them."""
    doc.facts = [f for f in doc.facts if f.id not in gone]
    for f in doc.facts:
        f.supersedes = [x for x in f.supersedes if x not in gone]
        if f.superseded_by in gone:
            f.superseded_by = None
        if f.replaces in gone:
            f.replaces = None
        if f.conflicts_with in gone:
            f.status, f.conflicts_with = "candidate", None
            f.reason = "the fact it contradicted is gone: confirm it or forget it"


def _pending_reason(source: str, after_tool_output: bool, kind: str, user_asked: bool) -> str:
    """Why a new fact waits for the user's confirmation ("" when it can act at once)."""
    if source == "extraction":
        return "extracted in the background: the user confirms it"
    if source == "panel":
        return ""
    if after_tool_output:
        return "saved after tool output in the same turn: the user confirms it"
    if kind == "instruction" and not user_asked:
        return "an instruction the user did not ask for directly: the user confirms it"
    return ""


def _supersede(old: Fact, new: Fact, now: float, events: list[AuditEvent], code: str) -> None:
    old.status, old.superseded_by, old.updated = "superseded", new.id, now
    old.reason = f"replaced by {new.id}"
    events.append(AuditEvent(ts=now, event="superseded", fact=old.id, status="superseded", reason=code))


def _text_pattern(text: str) -> re.Pattern[str] | None:
    words = text.split()
    if not words:
        return None
    words[-1] = words[-1].rstrip(".!?;,:") or words[-1]
    return re.compile(r"\s+".join(re.escape(w) for w in words) + r"[.!?;,:]*", re.IGNORECASE)


def _redact(value: Any, patterns: list[re.Pattern[str]]) -> Any:
    if isinstance(value, str):
        for p in patterns:
            value = p.sub(REDACTED, value)
        return value
    if isinstance(value, list):
        return [_redact(v, patterns) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v, patterns) for k, v in value.items()}
    return value
