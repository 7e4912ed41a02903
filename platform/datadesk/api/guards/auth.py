"""Authentication: a Bearer API token, or the http-only session cookie set at login."""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Request
from litestar.di import NamedDependency
from litestar.exceptions import ClientException, HTTPException, NotAuthorizedException

from datadesk.composition import Runtime
from datadesk.domain.credentials import known_secrets
from datadesk.domain.redaction import redact
from datadesk.domain.users import User

SESSION_COOKIE = "datadesk_session"

# Explicit dependency markers (Litestar infers less every release).
CurrentUser = NamedDependency[User]
RuntimeDep = NamedDependency[Runtime]

class RedactSecrets(logging.Filter):
    """Logging filter: login codes, tokens and credential shapes never reach a log line, nor
    the process's own credentials (`known_secrets`: the cluster database's password, the object
    store's secret key), in the message, its arguments or a traceback's text."""

    def filter(self, record: logging.LogRecord) -> bool:
        known = known_secrets()
        if record.args:
            if isinstance(record.args, dict):
                record.args = {k: _clean(v, known) for k, v in record.args.items()}
            else:
                record.args = tuple(_clean(a, known) for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, known)
        if record.exc_info and not record.exc_text:  # formatted once here, so it can be cleaned
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, known)
        return True

    @classmethod
    def install(cls, logger: logging.Logger | None = None) -> None:
        """On every handler of `logger` (default: the root's): a filter on a logger sees only
        that logger's own records, one on a handler every record the handler writes."""
        for handler in (logger or logging.getLogger()).handlers:
            if not any(isinstance(f, cls) for f in handler.filters):
                handler.addFilter(cls())


def _clean(arg: Any, known: list[str]) -> Any:
    """A log argument with secrets removed (an exception or a URL object: as its text)."""
    if isinstance(arg, str):
        return redact(arg, known)
    if isinstance(arg, (int, float, bool)) or arg is None:
        return arg
    text = str(arg)
    cleaned = redact(text, known)
    return arg if cleaned == text else cleaned


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
    user = request.scope.get("state", {}).get("datadesk_user")
    return user if user is not None else authenticate(request, request.app.state.runtime)


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _json_type(request: Request) -> Any:
    """The msgspec Struct a handler's JSON `data` body decodes into (None: no JSON body)."""
    field = request.route_handler.parsed_data_field
    if field is None:
        return None
    kw = field.kwarg_definition
    media = getattr(kw, "media_type", None)
    if media is not None and getattr(media, "value", media) != "application/json":
        return None
    ann = field.annotation
    return ann if isinstance(ann, type) and issubclass(ann, msgspec.Struct) else None


_NOT_QUERY = ("user", "rt", "data", "request")  # dependencies and the body, never query parameters


def _check_query(request: Request) -> None:
    """API query parameters the handler declares, each once: an unknown or repeated one is a 400
    naming it (`format=md&format=zip` took the last, `?lmit=5` was ignored). A handler that reads
    more of the query itself (it takes `request`) checks the rest there: here only its declared
    parameters must come once, unless it says (`strict_query` opt) that it reads none itself."""
    handler = request.route_handler
    params = handler.parsed_fn_signature.parameters
    if not request.scope.get("path", "").startswith("/api/"):
        return
    known = sorted(k for k in params if k not in request.path_params and k not in _NOT_QUERY)
    own = "request" in params and not handler.opt.get("strict_query")  # reads some of the query itself
    for key in request.query_params:
        if key not in known and not own:
            raise ClientException(f"unknown query parameter {key[:40]!r}: this endpoint takes "
                                  f"{', '.join(known) or 'none'}")
        if (key in known or not own) and len(request.query_params.getall(key)) > 1:
            raise ClientException(f"query parameter {key[:40]!r} is given more than once: give it once")


async def guard_request(request: Request) -> None:
    """Before any body is read: authenticate (a 401 never waits for the body), require a JSON
    content type where the handler takes JSON (415), and decode the body strictly (`"false"` or
    `0` is not a boolean; a lone surrogate is refused by name), so a bad body is a 400 that says why."""
    if "user" in request.route_handler.parsed_fn_signature.parameters:
        user = authenticate(request, request.app.state.runtime)
        request.scope.setdefault("state", {})["datadesk_user"] = user
    _check_query(request)
    struct = _json_type(request)
    if struct is None or request.method in ("GET", "HEAD", "DELETE"):
        return
    body = await request.body()
    if not body:
        return  # the handler's own validation names what is missing
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise HTTPException(status_code=415, detail=f"unsupported Content-Type {ctype or '(none)'!r}: "
                                                   "this endpoint takes 'application/json'")
    try:
        msgspec.json.decode(body, type=struct, strict=True)
    except msgspec.ValidationError as exc:
        raise ClientException(f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        if _SURROGATE.search(body):
            raise ClientException("invalid request body: text may not contain lone UTF-16 surrogates "
                                  "(\\ud800-\\udfff escapes without their pair)") from None
        raise ClientException(f"request body is not valid JSON: {exc}") from None


async def provide_runtime(request: Request) -> Runtime:
    return request.app.state.runtime
