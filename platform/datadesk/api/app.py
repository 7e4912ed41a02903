"""The HTTP app: controllers, dependencies, middleware and error handlers over one `Runtime`
(the composition root of the services, in composition.py)."""

from __future__ import annotations

import asyncio
import gc

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from litestar import Litestar, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.static_files import create_static_files_router

from datadesk import __version__
from datadesk.api.controllers.artifacts import ArtifactController
from datadesk.api.controllers.audit import AuditController  # issue 30: audit
from datadesk.api.controllers.branches import BranchController  # issue 31: edit, regenerate
from datadesk.api.controllers.export import ExportController
from datadesk.api.controllers.grid.explore import GridExploreController  # issue 32: grid explorer
from datadesk.api.controllers.memory import MemoryController
from datadesk.api.controllers.oidc import OIDCController  # issue 30: single sign-on
from datadesk.api.controllers.people import people_router  # issue 30: people
from datadesk.api.controllers.refresh import RefreshController, ScheduleController  # issue 31: refresh
from datadesk.api.report.controller import ReportController  # issue 32: the report page
from datadesk.api.controllers.search import SearchController
from datadesk.api.controllers.session import SessionController
from datadesk.api.sharing.controller import ShareController  # issue 32: sharing in the workspace
from datadesk.api.controllers.steps import StepController  # issue 31: user steps
from datadesk.api.controllers.taskstate import TaskStateController
from datadesk.api.controllers.threads import ThreadController
from datadesk.api.usage import UsageController  # issue 32: tokens and cost per turn
from datadesk.api.controllers.workspace import WorkspaceController
from datadesk.api.errors import exception_handlers
from datadesk.api.guards.auth import guard_request, provide_runtime, provide_user
from datadesk.api.guards.ratelimit import Limits, Principals, RateLimiter, user_lookup
from datadesk.api.guards.security import LoginFailures, LoginLimiter, SecurityMiddleware, load_key
from datadesk.api.looplag import LoopLag
from datadesk.api.metrics import CountResponses, MetricsSampler, metrics
from datadesk.api.readiness import Readiness, ready
from datadesk.composition import Runtime

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


@get("/", include_in_schema=False)
async def index() -> Response[bytes]:
    return Response((WEB_DIR / "index.html").read_bytes(), media_type="text/html",
                    headers={"Cache-Control": "no-cache"})


_FROZEN = False


def freeze_startup_heap() -> None:
    """Once per process, after start-up: move what exists now (modules, settings, the runtime)
    out of the cyclic collector's reach (`gc.freeze`), so a full collection, triggered by a
    burst of allocations such as rendering a long answer, scans only what requests made and
    does not hold the interpreter for tens of milliseconds (other users' requests wait on it)."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()



IO_THREADS = 32


def roomy_default_threads() -> None:
    """The loop's default threads (`asyncio.to_thread`: file writes and fsyncs, statvfs, the
    ledger, exports) are 32, not Python's min(32, CPUs + 4) = 6 on a small host: short file
    work never queues behind a burst of it. Query slots and writers have threads of their own."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="datadesk-io"))


def create_app(rt: Runtime) -> Litestar:
    csrf_key = load_key(rt.layout.home, getattr(rt.settings.server, "secret_key", None))
    auth = rt.settings.auth
    counters = getattr(rt, "counters", None)  # the set's RateCounter; None: this process's memory
    login_failures = LoginFailures(auth.login_attempts_per_minute, auth.login_attempts_per_account,
                                   rt.settings.server.trusted_proxies, counters)
    # every user's share of this worker (api/guards/ratelimit.py): a request budget and in-flight caps
    limits = Limits(rt.settings.server, counters)
    principals = Principals(user_lookup(rt.users), rt.settings.server.trusted_proxies)
    loop_lag = LoopLag()
    sampler = MetricsSampler(rt)  # kernels and pool use for /metrics (api/metrics.py)
    app = Litestar(
        route_handlers=[
            SessionController,
            ThreadController,
            UsageController,  # issue 32: tokens and cost per turn and thread
            StepController,  # issue 31: edit and re-run a step, the SQL scratchpad
            BranchController,  # issue 31: edit a question, regenerate an answer, branches
            TaskStateController,
            ArtifactController,
            GridExploreController,  # issue 32: column profiles, group-by, chart this view
            MemoryController,
            SearchController,
            ExportController,
            WorkspaceController,
            OIDCController,  # issue 30: single sign-on (/auth/oidc/*, /api/auth/options)
            AuditController,  # issue 30: the admin audit view
            RefreshController,  # issue 31: refresh a thread's analysis
            ScheduleController,  # issue 31: scheduled refreshes
            ReportController,  # issue 32: pins and the report page
            people_router,  # issue 30: the admin people API and /join
            ShareController,  # issue 32: share a thread read-only with its workspace
            index,
            ready,  # readiness (api/readiness.py); /api/health is liveness
            metrics,
            create_static_files_router(path="/static", directories=[WEB_DIR], include_in_schema=False),
        ],
        dependencies={"user": Provide(provide_user), "rt": Provide(provide_runtime)},
        before_request=guard_request,  # auth, content type and a strict decode before the body is used
        exception_handlers=exception_handlers(),  # api/errors.py: one table, domain error -> status
        # outermost first: a request over its budget is refused before anything else runs
        middleware=[CountResponses,  # every status counted for /metrics, the limiters' 429s too
                    lambda app: RateLimiter(app, limits, principals),
                    lambda app: SecurityMiddleware(app, csrf_key),
                    lambda app: LoginLimiter(app, login_failures)],
        request_max_body_size=rt.settings.server.max_body_bytes,
        # JSON lines (api/logs.py): the root's handler writes every line; Litestar's default
        # config would replace it with its own text handler
        **({"logging_config": None} if rt.settings.server.log_format == "json" else {}),
        openapi_config=OpenAPIConfig(title="DataDesk", version=__version__, path="/schema",
                                     # JSON only: the UI plugins load their scripts from a CDN
                                     render_plugins=[JsonRenderPlugin()]),
        on_startup=[roomy_default_threads, rt.start, freeze_startup_heap, loop_lag.start, sampler.start],
        on_shutdown=[sampler.stop, loop_lag.stop, rt.stop],
        state=State({"runtime": rt, "csrf_key": csrf_key, "login_failures": login_failures,
                     "rate_limits": limits, "loop_lag": loop_lag, "readiness": Readiness(rt),
                     "metrics_sampler": sampler}),
    )
    return app
