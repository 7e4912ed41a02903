"""The composition root: one place registers controllers, dependencies and error handlers."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.middleware.rate_limit import RateLimitConfig
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.static_files import create_static_files_router

from datadesk import __version__
from datadesk.api.artifacts import ArtifactController
from datadesk.api.auth import provide_runtime, provide_user
from datadesk.api.memory import MemoryController
from datadesk.api.workspace import WorkspaceController
from datadesk.api.security import SecurityMiddleware, load_key
from datadesk.api.session import SessionController
from datadesk.api.threads import ThreadController
from datadesk.chat.runtime import Runtime
from datadesk.chat.turns import TooManyTurns, TurnConflict
from datadesk.domain.ids import InvalidId
from datadesk.offload.store import ArtifactNotFound
from datadesk.store.threads import ThreadNotFound
from datadesk.store.users import UserError
from datadesk.store.workspaces import WorkspaceConfigError

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"

_STATUS: dict[type[Exception], int] = {
    InvalidId: 400,
    UserError: 400,
    ThreadNotFound: 404,
    ArtifactNotFound: 404,
    TurnConflict: 409,
    TooManyTurns: 429,
    WorkspaceConfigError: 500,
}


def _error_body(status: int, message: str, extra: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status_code": status, "error": message, "detail": message}
    if extra:
        body["extra"] = extra
    return body


def domain_error(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    status = next((code for typ, code in _STATUS.items() if isinstance(exc, typ)), 500)
    return Response(_error_body(status, str(exc)), status_code=status)


def http_error(request: Request, exc: HTTPException) -> Response[dict[str, Any]]:
    return Response(_error_body(exc.status_code, exc.detail, exc.extra), status_code=exc.status_code,
                    headers=exc.headers)


def internal_error(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return Response(_error_body(500, f"internal error ({type(exc).__name__})"), status_code=500)


@get("/", include_in_schema=False)
async def index() -> Response[bytes]:
    return Response((WEB_DIR / "index.html").read_bytes(), media_type="text/html",
                    headers={"Cache-Control": "no-cache"})


def create_app(rt: Runtime) -> Litestar:
    login_limit = RateLimitConfig(
        rate_limit=("minute", rt.settings.auth.login_attempts_per_minute),
        check_throttle_handler=lambda request: bool(request.route_handler.opt.get("login")),
    )

    sweeper: list[asyncio.Task[None]] = []

    async def sweep_forever() -> None:
        """The cache sweeper: TTL and quotas, enforced while the app runs."""
        while True:
            await asyncio.sleep(rt.settings.offload.sweep_interval_s)
            try:
                await asyncio.to_thread(rt.quota.sweep_round, rt.settings.offload.sweep_interval_s)
            except Exception:
                log.exception("artifact sweep failed")

    async def on_startup() -> None:
        sweeper.append(asyncio.create_task(sweep_forever(), name="artifact-sweeper"))
        await rt.start()

    async def on_shutdown() -> None:
        for task in sweeper:
            task.cancel()
        await rt.stop()

    csrf_key = load_key(rt.layout.home)
    exception_handlers: dict[Any, Any] = {t: domain_error for t in _STATUS}
    exception_handlers[HTTPException] = http_error
    exception_handlers[500] = internal_error
    app = Litestar(
        route_handlers=[
            SessionController,
            ThreadController,
            ArtifactController,
            MemoryController,
            WorkspaceController,
            index,
            create_static_files_router(path="/static", directories=[WEB_DIR], include_in_schema=False),
        ],
        dependencies={"user": Provide(provide_user), "rt": Provide(provide_runtime)},
        exception_handlers=exception_handlers,
        middleware=[lambda app: SecurityMiddleware(app, csrf_key), login_limit.middleware],
        request_max_body_size=rt.settings.server.max_body_bytes,
        openapi_config=OpenAPIConfig(title="DataDesk", version=__version__, path="/schema",
                                     render_plugins=[SwaggerRenderPlugin()]),
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        state=State({"runtime": rt, "csrf_key": csrf_key}),
    )
    return app
