"""Sharing a thread read-only with the members of its workspace (issue 32, part 3).

The rules, in one place (the storage is `store.interfaces.shares.Shares`):

- only a thread's owner shares it, lists their shares and revokes them;
- a share opens for a signed-in member of the share's workspace, while it is not revoked, the
  thread still exists and its owner is still an active member there; for anyone else it is `ShareNotFound` (the API's 404, the same as an
  id that never existed: a share is not revealed to those it is not for);
- what opens is the owner's thread to read (its records and artifacts): never a turn, a kernel,
  the owner's memory, summary, task state or manifests, and never a write;
- "Copy into my chats" (`fork`) makes a new thread of the reader's own (`sharing/fork.py`);
- every create, open, revoke and fork, and every refused open, goes to the audit trail
  (action `share`, `detail` create | open | revoke | fork, `target` the share id).
"""

from __future__ import annotations

import time
from typing import Any

from datadesk.domain.ids import check_id
from datadesk.domain.shares import Share, new_share_id
from datadesk.store.interfaces.threads import ThreadNotFound
from datadesk.sharing.fork import ThreadFork

MAX_SHARES_PER_THREAD = 20  # live links of one thread: more is a mistake, not a need


class ShareNotFound(LookupError):
    """No share of that id for this user: none, another workspace's, revoked, or its thread gone."""


class TooManyShares(ValueError):
    """The thread has MAX_SHARES_PER_THREAD live shares already (revoke one first)."""


class Sharing:
    """Creates, opens, lists, revokes and forks shares; writes each to the audit trail."""

    def __init__(self, shares: Any, threads: Any, artifacts: Any, audit: Any, users: Any = None,
                 clock: Any = time.time) -> None:
        self.shares = shares
        self.users = users  # the owner must still be active and a member (None: not checked)
        self.threads = threads
        self.fork_service = ThreadFork(threads, artifacts)
        self.audit = audit
        self.clock = clock

    def create(self, thread: Any, user: Any, client: str | None = None) -> Share:
        """A new share of `thread` (the caller found it as `user`'s own)."""
        live = [s for s in self.shares.of_owner(user.id, [thread.workspace], thread.id) if s.active]
        if len(live) >= MAX_SHARES_PER_THREAD:
            raise TooManyShares(f"thread {thread.id} has {len(live)} live share links (limit "
                                f"{MAX_SHARES_PER_THREAD}): revoke one first")
        title = thread.meta.title if thread.meta is not None else ""
        share = Share(id=new_share_id(), workspace=thread.workspace, owner=user.id, thread=thread.id,
                      created=self.clock(), title=title)
        self.shares.add(share)
        self._audit("create", user, share, client)
        return share

    def mine(self, user: Any, thread_id: str | None = None) -> list[Share]:
        """The user's shares in their workspaces, newest first (of one thread of theirs)."""
        if thread_id is not None:
            check_id(thread_id, "thread")
        return self.shares.of_owner(user.id, list(user.workspaces), thread_id)

    def revoke(self, sid: str, user: Any, client: str | None = None) -> Share:
        """Revoke the user's share `sid`; ShareNotFound when it is not theirs."""
        check_id(sid, "share")
        share = self.shares.revoke(sid, user.id, self.clock())
        if share is None or share.workspace not in user.workspaces:
            self._refused("revoke", user, sid, client)
            raise ShareNotFound(f"share {sid} not found")
        self._audit("revoke", user, share, client)
        return share

    def find(self, sid: str, user: Any) -> tuple[Share, Any]:
        """The share `sid` as `user` may read it, and the owner's thread (ShareNotFound otherwise).
        Not audited: the artifact reads of an opened share (images, grid pages) come here."""
        check_id(sid, "share")
        share = self.shares.get(sid, list(user.workspaces))
        if share is None or not share.active or not self._owner_member(share):
            raise ShareNotFound(f"share {sid} not found")
        try:
            thread = self.threads.get(share.thread, share.owner, [share.workspace])
        except ThreadNotFound:
            raise ShareNotFound(f"share {sid} not found") from None
        return share, thread

    def open(self, sid: str, user: Any, client: str | None = None) -> tuple[Share, Any]:
        """`find`, audited as an open (or a refused open)."""
        try:
            share, thread = self.find(sid, user)
        except ShareNotFound:
            self._refused("open", user, sid, client)
            raise
        self._audit("open", user, share, client)
        return share, thread

    def fork(self, sid: str, user: Any, client: str | None = None) -> Any:
        """A copy of the shared thread in the user's own chats (sharing/fork.py); the new thread."""
        try:
            share, thread = self.find(sid, user)
        except ShareNotFound:
            self._refused("fork", user, sid, client)
            raise
        title = thread.meta.title if thread.meta is not None else share.title
        copy = self.fork_service.copy(thread, share.workspace, user.id, f"{title} (copy)")
        self._audit("fork", user, share, client, detail=f"fork into {copy.id}")
        return copy

    def _owner_member(self, share: Share) -> bool:
        """Whether the owner is still an active member of the share's workspace: the shares of
        someone revoked or moved out of the workspace stop opening with them."""
        if self.users is None:
            return True
        owner = self.users.get(share.owner)
        return owner is not None and not owner.revoked and share.workspace in owner.workspaces

    def _audit(self, what: str, user: Any, share: Share, client: str | None, detail: str | None = None) -> None:
        self.audit.record("share", user=user.id, workspace=share.workspace, thread=share.thread, target=share.id,
                          detail=detail or (what if user.id == share.owner else f"{what} (shared by {share.owner})"),
                          client=client)

    def _refused(self, what: str, user: Any, sid: str, client: str | None) -> None:
        self.audit.record("share", user=user.id, outcome="refused", target=sid,
                          detail=f"{what}: not found, revoked or not in the reader's workspaces", client=client)
