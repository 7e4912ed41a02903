"""One audit entry, the filter the admin view applies, and a page of entries."""

from __future__ import annotations

import datetime as dt

import msgspec

# what is audited: data queries, artifact downloads, thread exports, sign-in and -out, admin changes,
# shares of threads (create, open, revoke, fork: `detail`)
ACTIONS = ("query", "download", "export", "sign_in", "sign_out", "sign_in_failed", "admin", "share")
# "cancelled": a query stopped before its end (Stop, a tool timeout, a memory guard)
OUTCOMES = ("ok", "error", "refused", "cancelled")

SQL_MAX_CHARS = 20_000  # a longer statement is kept to this many characters (and says so)
DETAIL_MAX_CHARS = 500


class AuditEvent(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One audited action. `ts` is seconds since the epoch (UTC); `id` is the cluster row's id
    (0 in the embedded set, whose entries are found by their place in the day's file)."""

    ts: float
    action: str
    outcome: str  # always written (no default): the view's raw-line filter looks for it
    user: str | None = None
    workspace: str | None = None
    thread: str | None = None
    source: str | None = None
    sql: str | None = None
    rows: int | None = None
    bytes: int | None = None
    duration_ms: float | None = None
    target: str | None = None
    detail: str | None = None
    client: str | None = None
    host: str | None = None
    id: int = 0

    def day(self) -> str:
        return day_of(self.ts)

    def public(self) -> dict[str, object]:
        """The entry as the admin API shows it: every field, and the time in ISO 8601 (UTC)."""
        out = {f: getattr(self, f) for f in FIELDS}
        out["time"] = iso(self.ts)
        return out


FIELDS = ("ts", "action", "user", "outcome", "workspace", "thread", "source", "sql", "rows", "bytes",
          "duration_ms", "target", "detail", "client", "host")


def day_of(ts: float) -> str:
    """The UTC day of `ts`, as YYYY-MM-DD."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What the admin view asks for: every field set must match exactly; `since`/`until` bound
    `ts` (since <= ts < until)."""

    user: str | None = None
    source: str | None = None
    action: str | None = None
    outcome: str | None = None
    workspace: str | None = None
    since: float | None = None
    until: float | None = None

    def exact(self) -> dict[str, str]:
        """The exact-match fields that are set."""
        return {k: v for k in ("user", "source", "action", "outcome", "workspace")
                if (v := getattr(self, k)) is not None}

    def matches(self, ev: AuditEvent) -> bool:
        if self.since is not None and ev.ts < self.since:
            return False
        if self.until is not None and ev.ts >= self.until:
            return False
        return all(getattr(ev, k) == v for k, v in self.exact().items())


class AuditPage(msgspec.Struct):
    """Entries newest first, and the cursor of the next (older) page, None at the end."""

    entries: list[AuditEvent]
    next_cursor: str | None = None
