"""`MemoryDocs`: where `memory.store.MemoryStore` keeps each user's memory, and its value types.

`MemoryStore` holds every rule of memory; a `MemoryDocs` only stores, per (workspace, user):

- one `MemoryDoc` (the user's switch, the facts, the hashes of hard-deleted texts);
- its audit: append-only `AuditEvent`s that never hold a fact's text.

`update` is a read-modify-write under a lock that spans processes and hosts: the document
is read, the caller changes it in place and lists the audit events of that change, and on
a normal exit the new document and those events are stored together (one transaction, or
under one file lock). An exception inside leaves both unchanged. So two writers never lose
each other's change, and an audit event exists exactly when its change does.

Implementations: `memory.store.FileMemoryDocs` (embedded: `memory.json`,
`memory.json.lock`, `memory.audit.jsonl`) and `cluster.memory.PgMemoryDocs` (a row per
user under `SELECT ... FOR UPDATE`, an audit table).

Errors: `MemoryStoreError` when a stored document cannot be read.
"""

from __future__ import annotations

from typing import ContextManager, Protocol

import msgspec

from datadesk.domain.memory import MemoryDoc


class MemoryStoreError(RuntimeError):
    """The stored memory document exists but cannot be read."""


class AuditEvent(msgspec.Struct, omit_defaults=True):
    """One event of a user's memory audit (a line of `memory.audit.jsonl`). Never the fact text."""

    ts: float
    event: str  # created | confirmed | resolved | edited | superseded | forgotten | deleted
    fact: str
    status: str | None = None
    kind: str | None = None
    source: str | None = None
    reason: str | None = None  # a fixed code ("capacity", "history limit", ...), never user text


class MemoryDocs(Protocol):
    """The storage of memory documents and their audit, per (workspace, user)."""

    def read(self, workspace: str, user_id: str) -> MemoryDoc:
        """The user's document; an empty `MemoryDoc()` when none was stored. Stores nothing."""
        ...

    def update(self, workspace: str, user_id: str) -> ContextManager[tuple[MemoryDoc, list[AuditEvent]]]:
        """Lock the user's document and yield it with an empty event list; on a normal exit store
        the (changed) document and append the events atomically with it; on an exception store
        nothing."""
        ...

    def audit(self, workspace: str, user_id: str) -> list[AuditEvent]:
        """Every audit event of the user, oldest first."""
        ...
