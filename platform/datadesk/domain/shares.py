"""A share: one thread, read-only, for the members of its workspace (issue 32, part 3).

A share names the thread by (workspace, owner, thread); its id is the link's secret part:
`SHARE_ID_BYTES` random bytes, URL-safe, so it is valid under `ids.ID_PATTERN` and checked
with `check_id(sid, "share")` like every other id before it touches a path or a query. The
link still needs sign-in: a share only ever opens for a signed-in member of its workspace,
and a revoked one opens for nobody (both: 404, as a share that never existed).

A share of a thread also covers the thread's report page (`kind` is "thread"; the report
view reads the same share), so there is one link to give and one to revoke.
"""

from __future__ import annotations

import secrets

import msgspec

from datadesk.domain.ids import check_id

SHARE_ID_BYTES = 24  # 192 bits: 32 URL-safe characters, not guessable and not enumerable
SHARE_KINDS = ("thread",)


class Share(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One shared thread. `revoked` is when the owner revoked it (None: it opens)."""

    id: str
    workspace: str
    owner: str
    thread: str
    created: float
    kind: str = "thread"
    title: str = ""  # the thread's title when shared (the view shows the current one)
    revoked: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None


def new_share_id() -> str:
    """A fresh share id: random, URL-safe, valid under ID_PATTERN (checked)."""
    return check_id(secrets.token_urlsafe(SHARE_ID_BYTES), "share")
