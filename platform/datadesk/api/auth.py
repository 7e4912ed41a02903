"""Authentication: a Bearer API token, or the http-only session cookie set at login."""

from __future__ import annotations

import logging

from litestar import Request
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException

from datadesk.chat.runtime import Runtime
from datadesk.domain.redaction import redact
from datadesk.domain.users import User

SESSION_COOKIE = "datadesk_session"

# Explicit dependency markers (Litestar infers less every release).
CurrentUser = NamedDependency[User]
RuntimeDep = NamedDependency[Runtime]

class RedactSecrets(logging.Filter):
    """Logging filter for access logs: login codes and tokens never reach a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def authenticate(request: Request, rt: Runtime) -> User:
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthorizedException("malformed Authorization header: use 'Bearer <token>'")
        user = rt.users.by_token(token.strip())
        if user is None:
            raise NotAuthorizedException("invalid or revoked token")
        return user
    sid = request.cookies.get(SESSION_COOKIE)
    if sid:
        user = rt.users.by_session(sid)
        if user is None:
            raise NotAuthorizedException("session expired or revoked: log in again")
        return user
    raise NotAuthorizedException("authentication required: send 'Authorization: Bearer <token>' or log in")


async def provide_user(request: Request) -> User:
    return authenticate(request, request.app.state.runtime)


async def provide_runtime(request: Request) -> Runtime:
    return request.app.state.runtime
