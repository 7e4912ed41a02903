"""`Shares`: where the shares of threads are kept (issue 32, part 3; `domain/shares.py`).

A `Shares` only stores; the rules (who may share, who may open, the audit) live in
`sharing/service.py`. Every read takes the workspaces of the reader, so a share of a
workspace the reader is not a member of is not found at all, in either set:

- `add(share)` stores a new share (its id is fresh and random; a clash is an error);
- `get(sid, workspaces)` the share `sid` when its workspace is one of `workspaces`, revoked
  or not (the caller decides what a revoked one means), else None;
- `of_owner(owner, workspaces, thread=None)` the owner's shares, newest first (of one thread);
- `revoke(sid, owner, at)` marks the owner's share revoked at `at` (kept: the list and the
  audit still name it) and returns it; None when the owner has no such share. Revoking
  twice keeps the first time.

Implementations: `store/shares.py FileShares` (embedded: `workspaces/<ws>/shares/<sid>.json`,
written atomically, revoked under a file lock) and `cluster/shares.py PgShares` (a `shares`
table, migration 0011_shares.sql).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from datadesk.domain.shares import Share


class ShareStoreError(RuntimeError):
    """A stored share exists but cannot be read, or a new one could not be stored."""


@runtime_checkable
class Shares(Protocol):
    """The storage of shares (module doc)."""

    def add(self, share: Share) -> None: ...

    def get(self, sid: str, workspaces: list[str]) -> Share | None: ...

    def of_owner(self, owner: str, workspaces: list[str], thread: str | None = None) -> list[Share]: ...

    def revoke(self, sid: str, owner: str, at: float) -> Share | None: ...
