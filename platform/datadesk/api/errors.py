"""Errors as HTTP answers: one table from domain exception to status, and the handlers that
`api/app.py` registers with Litestar, so an error means the same status on every endpoint.

Every error body has one shape: `{"status_code", "error", "detail"}` (`error` and `detail` both
carry the message), plus `extra` when the error has more to say (the fact a duplicate repeats).
Controllers raise the domain's own exceptions (or Litestar's HTTP ones for HTTP-only problems);
anything not in the table is logged and answered as a 500 naming only its type.
"""

from __future__ import annotations

import logging
from typing import Any, Callable
from urllib.parse import unquote

from litestar import Request, Response
from litestar.exceptions import HTTPException

from datadesk.api.guards.security import APP_CSP, EXTRA_HEADERS
from datadesk.threads.attachments import MessageTooLong
from datadesk.chat.turns import TooManyTurns, TurnConflict
from datadesk.domain.ids import InvalidId
from datadesk.domain.credentials import without_known_secrets
from datadesk.domain.tools import ToolError
from datadesk.memory.store import DuplicateFact, FactNotFound, FactStateError, MemoryInputError
from datadesk.offload.artifacts.store import ArtifactNotFound
from datadesk.offload.uploads import UploadError, UploadTooLarge
from datadesk.store.interfaces.blobs import BlobUnavailable
from datadesk.store.interfaces.errors import ClusterUnavailable
from datadesk.store.admission import Busy
from datadesk.store.diskspace import DiskLow
from datadesk.store.files import StoreWriteError
from datadesk.store.threads import ThreadNotFound, TooManyThreads
from datadesk.store.users import UserError
from datadesk.store.workspaces import WorkspaceConfigError
from datadesk.threads.report.pins import PinNotFound, ReportError

log = logging.getLogger(__name__)
ID_RULE = "[A-Za-z0-9_-]{1,64}"  # domain/ids.py ID_PATTERN, as the error says it

# The most specific class of an exception decides (DuplicateFact is a MemoryInputError, but 409).
ERROR_STATUS: dict[type[Exception], int] = {
    InvalidId: 400,
    UserError: 400,
    MemoryInputError: 400,
    UploadError: 400,
    ReportError: 400,  # a pin, note, title or order the report page cannot take
    ToolError: 400,  # a re-query the UI asked for that cannot run: the reason, as the model would read it
    ThreadNotFound: 404,
    ArtifactNotFound: 404,
    FactNotFound: 404,
    PinNotFound: 404,
    DuplicateFact: 409,
    FactStateError: 409,
    TurnConflict: 409,
    MessageTooLong: 413,
    UploadTooLarge: 413,
    TooManyTurns: 429,
    TooManyThreads: 429,
    Busy: 503,  # the app's query slots or memory ceiling: try again shortly
    # the cluster set's shared services: the message names the object store or the database
    # (never a credential); nothing was half-written, so the same request can be sent again
    BlobUnavailable: 503,
    ClusterUnavailable: 503,
    DiskLow: 507,  # store.min_free_mb: too little room in the data directory for new work
    StoreWriteError: 507,  # a write to the data directory failed (full disk): nothing half-kept
    WorkspaceConfigError: 500,
}

# What an error adds to its body beside the message.
ERROR_EXTRA: dict[type[Exception], Callable[[Any], Any]] = {
    DuplicateFact: lambda exc: {"fact": exc.fact_id},
    ReportError: lambda exc: {"field": exc.field},
}


def error_status(exc: Exception) -> int:
    """The HTTP status of a domain exception (500 when the table does not name it)."""
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            return ERROR_STATUS[cls]
    return 500


def error_body(status: int, message: str, extra: Any = None) -> dict[str, Any]:
    """The one shape of every error answer."""
    body: dict[str, Any] = {"status_code": status, "error": message, "detail": message}
    if extra:
        body["extra"] = extra
    return body


def domain_error(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    """A domain exception from the table, answered with its status and its own message."""
    status = error_status(exc)
    extra = next((make(exc) for cls, make in ERROR_EXTRA.items() if isinstance(exc, cls)), None)
    if isinstance(exc, (BlobUnavailable, ClusterUnavailable)):
        log.warning("%s %s: %s", request.method, request.scope.get("path"), exc)
        return _answer(status, str(exc), extra, {"retry-after": "5"})
    return _answer(status, str(exc), extra)


# Unmatched routes are answered by the router, outside the app's middleware: the headers go here.
SECURITY_HEADERS = {"content-security-policy": APP_CSP,
                    **{k.decode(): v.decode() for k, v in EXTRA_HEADERS}}


def _answer(status: int, message: str, extra: Any = None,
            headers: dict[str, str] | None = None) -> Response[dict[str, Any]]:
    # the process's own credentials (the database password, the store's secret key) never
    # leave in an answer, whatever an error message carried
    message = without_known_secrets(message) if isinstance(message, str) else message
    return Response(error_body(status, message, extra), status_code=status,
                    headers={**SECURITY_HEADERS, **(headers or {})})


ID_KINDS = {"threads": "thread", "artifacts": "artifact", "memory": "fact", "workspaces": "workspace"}


def _encoded_slash_id(raw_path: bytes) -> tuple[str, str] | None:
    """(kind, id) of a path segment holding an encoded '/' or '\\' (no route can match it)."""
    parts = raw_path.decode("latin-1").split("/")
    for before, seg in zip(parts, parts[1:]):
        if "%2f" in seg.lower() or "%5c" in seg.lower():
            return ID_KINDS.get(before, "resource"), unquote(seg)
    return None


def _route_error(request: Request, exc: HTTPException) -> tuple[int, str] | None:
    """The router's bare 404/405, said with the path (an encoded '/' in an id: a 400 with the rule)."""
    path = request.scope.get("path", "")
    if exc.status_code == 404 and exc.detail == "Not Found":
        bad = _encoded_slash_id(request.scope.get("raw_path") or b"")
        if bad:
            return 400, f"invalid {bad[0]} id {bad[1]!r}: ids must match {ID_RULE}"
        return 404, f"no such route: {path!r} (the API is described at /schema)"
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        return 405, f"method {request.method} is not allowed on {path!r}"
    if exc.status_code == 400 and str(exc.detail).startswith("Validation failed for") and isinstance(exc.extra, list):
        named = [f"{getattr(e.get('source'), 'value', e.get('source')) or 'request'} parameter {str(e['key'])[:40]!r}: {e.get('message')}"
                 for e in exc.extra if isinstance(e, dict) and e.get("key")]
        if named:  # Litestar's message names only the URL: say which parameter and why
            return 400, "invalid " + "; ".join(named)
    if exc.status_code == 413 and exc.detail == "Request Entity Too Large":
        handler = request.scope.get("route_handler")
        limit = handler.resolve_request_max_body_size() if handler is not None else None
        return 413, (f"the request body is larger than this endpoint's limit of {limit:,} bytes"
                     if limit else "the request body is too large for this endpoint")
    return None


def http_error(request: Request, exc: HTTPException) -> Response[dict[str, Any]]:
    """Litestar's own HTTP exceptions (401, 403, 404, 410, ...), in the same body shape."""
    status, message = _route_error(request, exc) or (exc.status_code, exc.detail)
    if status == 500:
        return internal_error(request, exc)
    return _answer(status, message, exc.extra, exc.headers)


def internal_error(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    """Anything else: logged with its traceback; the answer names only the exception type. A
    client that left while its body was read is no server error: one INFO line, no traceback."""
    if isinstance(exc, HTTPException) and "disconnected" in str(exc.detail):
        log.info("client left during %s %s: %s", request.method, request.scope.get("path"), exc.detail)
        return _answer(400, "client disconnected before the request body was complete")
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _answer(500, f"internal error ({type(exc).__name__})")


def exception_handlers() -> dict[Any, Any]:
    """The handlers to register on the app: each table entry, HTTP exceptions, and the rest."""
    handlers: dict[Any, Any] = {t: domain_error for t in ERROR_STATUS}
    handlers[HTTPException] = http_error
    handlers[500] = internal_error
    return handlers
