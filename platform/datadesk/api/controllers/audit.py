"""The admin audit view: `GET /api/admin/audit` (a page of entries, newest first) and
`GET /api/admin/audit.csv` (every entry the same filters match, streamed as CSV). Admins only.

Filters: `user`, `source`, `action`, `outcome`, `workspace` (exact), `from` and `to` (a day
`YYYY-MM-DD`, both ends included, or an ISO 8601 time; UTC). Paging: `limit` (1-500, default 100)
and the `cursor` the previous page returned as `next_cursor` (null on the last page).
The CSV's text cells that a spreadsheet would run as a formula (= + - @, tab, CR first) get a
leading `'`, as the artifact CSV downloads do.

`client_of(request)` is the address the other controllers record with their entries (the
same one the login limiter counts: a trusted proxy's X-Forwarded-For, else the peer).
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import re
from typing import Any, Iterator

from litestar import Controller, Request, get
from litestar.exceptions import ClientException, PermissionDeniedException
from litestar.params import FromQuery
from litestar.response import Stream

from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.audit.event import ACTIONS, FIELDS, OUTCOMES, AuditFilter, iso
from datadesk.audit.trail import MAX_PAGE
from datadesk.domain.users import User
from datadesk.offload.grid.csv_download import FORMULA_START

CSV_COLUMNS = ("time", *(f for f in FIELDS if f != "ts"))
_FORMULA = re.compile(FORMULA_START)
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def client_of(request: Request) -> str | None:
    """The client address an audit entry records for `request`."""
    failures = request.app.state.get("login_failures")
    if failures is not None:
        return failures.address(request.scope)
    return request.client.host if request.client else None


def _time(value: str, name: str, end: bool) -> float:
    """`from`/`to` as seconds: a day is its start (from) or the start of the next day (to)."""
    try:
        if _DAY.match(value):
            day = dt.datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
            return (day + dt.timedelta(days=1 if end else 0)).timestamp()
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ClientException(f"{name}: {value!r} is not a day (YYYY-MM-DD) or an ISO 8601 time",
                              extra={"param": name}) from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _filter(user: str | None, source: str | None, action: str | None, outcome: str | None,
            workspace: str | None, since: str | None, until: str | None) -> AuditFilter:
    if action and action not in ACTIONS:
        raise ClientException(f"action: {action!r} is not one of {', '.join(ACTIONS)}", extra={"param": "action"})
    if outcome and outcome not in OUTCOMES:
        raise ClientException(f"outcome: {outcome!r} is not one of {', '.join(OUTCOMES)}",
                              extra={"param": "outcome"})
    return AuditFilter(user=user or None, source=source or None, action=action or None, outcome=outcome or None,
                       workspace=workspace or None, since=_time(since, "from", False) if since else None,
                       until=_time(until, "to", True) if until else None)


def _admin(user: User) -> None:
    if not user.can("admin"):
        raise PermissionDeniedException("the audit trail is for admins")


PAGE_PARAMS = ("user", "source", "action", "outcome", "workspace", "from", "to", "cursor", "limit")
CSV_PARAMS = ("user", "source", "action", "outcome", "workspace", "from", "to")


def _check_query(request: Request, allowed: tuple[str, ...]) -> None:
    """What the API guard checks for handlers that read no query themselves (these read `user`,
    `from` and `to`): an unknown or repeated parameter is a 400 naming it."""
    for key in request.query_params:
        if key not in allowed:
            raise ClientException(f"unknown query parameter {key[:40]!r}: this endpoint takes {', '.join(allowed)}")
        if len(request.query_params.getall(key)) > 1:
            raise ClientException(f"query parameter {key[:40]!r} is given more than once: give it once")


def csv_cell(value: Any) -> Any:
    """A CSV cell: text a spreadsheet would read as a formula gets a leading `'`."""
    if isinstance(value, str) and _FORMULA.match(value):
        return "'" + value
    return "" if value is None else value


def csv_lines(entries: Iterator[Any]) -> Iterator[bytes]:
    """The CSV of `entries` (a header first), a few hundred rows per chunk."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\r\n")
    out.writerow(CSV_COLUMNS)
    n = 0
    for ev in entries:
        row = ev.public()
        row["time"] = iso(ev.ts)
        out.writerow([csv_cell(row[c]) for c in CSV_COLUMNS])
        n += 1
        if n % 500 == 0:
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().encode()


class AuditController(Controller):
    path = "/api/admin"

    @get("/audit")
    async def audit(self, user: CurrentUser, rt: RuntimeDep, request: Request,
                    source: FromQuery[str | None] = None,
                    action: FromQuery[str | None] = None, outcome: FromQuery[str | None] = None,
                    workspace: FromQuery[str | None] = None, cursor: FromQuery[str | None] = None,
                    limit: FromQuery[int] = 100) -> dict[str, Any]:
        """A page of the audit trail, newest first (`user`, `from` and `to` are read from the query
        itself: `user` is the caller's dependency name, `from` a Python keyword)."""
        _admin(user)
        _check_query(request, PAGE_PARAMS)
        if not 1 <= limit <= MAX_PAGE:
            raise ClientException(f"limit: {limit} is not between 1 and {MAX_PAGE}", extra={"param": "limit"})
        q = request.query_params
        flt = _filter(q.get("user"), source, action, outcome, workspace, q.get("from"), q.get("to"))
        try:
            page = await asyncio.to_thread(rt.audit.page, flt, cursor or None, limit)
        except ValueError as exc:  # a cursor this log did not give
            raise ClientException(str(exc), extra={"param": "cursor"}) from None
        return {"entries": [e.public() for e in page.entries], "next_cursor": page.next_cursor, "limit": limit}

    @get("/audit.csv")
    async def audit_csv(self, user: CurrentUser, rt: RuntimeDep, request: Request,
                        source: FromQuery[str | None] = None, action: FromQuery[str | None] = None,
                        outcome: FromQuery[str | None] = None,
                        workspace: FromQuery[str | None] = None) -> Stream:
        """Every entry the filters match, newest first, as CSV (streamed)."""
        _admin(user)
        _check_query(request, CSV_PARAMS)
        q = request.query_params
        flt = _filter(q.get("user"), source, action, outcome, workspace, q.get("from"), q.get("to"))
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        return Stream(csv_lines(rt.audit.entries(flt)), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="datadesk-audit-{stamp}.csv"',
            "X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"})
