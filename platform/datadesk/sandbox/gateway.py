"""Kernels on a Jupyter Kernel Gateway or Enterprise Gateway (e.g. kernel pods on Kubernetes).

The gateway protocol: REST to start (`POST /api/kernels` with the kernelspec
name and `KERNEL_*` variables), look up, interrupt, restart and stop
(`DELETE`) kernels, and the websocket `/api/kernels/{id}/channels` carrying
Jupyter messages as JSON with a `channel` field. Every request carries
`Authorization: token <t>`; the token is never put in a kernel's
environment, in a URL or in a log line (the websocket client's debug log,
which prints handshake headers, is kept off).

Files: the kernel's slot (`/data` links and `/outputs`, under the app's
home, see `KernelRegistry._placement`) must sit on a volume the kernels
mount too (e.g. a ReadWriteMany volume in every kernel pod). The app sees it
at `sandbox.gateway_shared_dir`, kernels at `sandbox.gateway_kernel_shared_dir`;
a slot path maps by swapping that prefix. Code is rewritten so `/data/...`
and `/outputs/...` literals name the kernel-side paths, and the kernel's
working directory is its outputs dir. Each start proves the mapping: the app
writes a random probe file into the slot and the kernel must read it back
and be able to write its outputs dir, else the start fails saying which
setting to fix. Outputs are read app-side from the slot, never following a
link (files.py).

The registry above is unchanged: caps, the reaper (15 min idle, 4 h total),
fresh-kernel notices. A kernel the gateway restarted on its own (it died) is
reported dead, so the registry starts a fresh one and says so. Messages travel
through `gateway_channel.GatewayChannel`.

Which gateway kernel serves which slot is kept in `<home>/sandbox/gateway-kernels/`
(with the owning process): another worker can `attach` to it, and at start
kernels left by a crashed process of this host are stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from datadesk.sandbox.base import (
    ExecutionResult,
    KernelBackend,
    KernelPlacement,
    SandboxError,
    SandboxUnavailable,
)
from datadesk.sandbox.gateway_channel import GatewayChannel
from datadesk.sandbox.messaging import INTERRUPT_GRACE_S
from datadesk.settings import SandboxSettings, SettingsError

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 15.0
HEALTH_TIMEOUT_S = 5.0
HEALTH_CACHE_S = 10.0
ALIVE_CACHE_S = 1.0
DELETE_RETRIES_S = (0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0)  # waits after a DELETE answered 5xx
PROBE_FILE = ".datadesk-probe"
RECORDS = ("sandbox", "gateway-kernels")  # under home: which gateway kernel each slot started

_KERNEL_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_KERNEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENV_NAME_RE = re.compile(r"KERNEL_[A-Z0-9_]{1,64}")
# kernel-side paths go into Python string literals and pod templates: keep them plain
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._/@+-]*")
_RESERVED_ENV = ("KERNEL_DATADESK_", "KERNEL_WORKING_DIR")
_PATH_LITERAL_RE = re.compile(r"""(["'])(/data|/outputs)(?=[/"'])""")


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class GatewayConfig:
    """The `sandbox.gateway_*` settings, checked (`from_settings` names the bad one)."""

    url: str  # http(s)://host[:port][/base], no trailing slash
    token: str
    kernel_name: str
    shared_dir: Path  # app side, resolved
    kernel_shared_dir: PurePosixPath  # kernel side
    kernel_env: dict[str, str]

    @classmethod
    def from_settings(cls, sb: SandboxSettings, home: Path) -> "GatewayConfig":
        url = sb.gateway_url.strip().rstrip("/")
        if not url:
            raise SettingsError('sandbox.gateway_url is required with sandbox.backend = "gateway" '
                                "(e.g. http://enterprise-gateway.jupyter:8888)")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"sandbox.gateway_url must be an http:// or https:// URL with a host, not {url!r}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise SettingsError("sandbox.gateway_url must not carry credentials, a query or a fragment: "
                                "put the token in sandbox.gateway_token or DATADESK_GATEWAY_TOKEN")
        token = sb.gateway_token.strip()
        if any(c in token for c in "\r\n\0"):
            raise SettingsError("sandbox.gateway_token contains a line break or NUL character")
        if not _KERNEL_NAME_RE.fullmatch(sb.gateway_kernel_name):
            raise SettingsError(f"sandbox.gateway_kernel_name must be a kernelspec name (letters, digits, "
                                f"'.', '_', '-'), not {sb.gateway_kernel_name!r}")
        home = Path(home).resolve()
        shared = Path(sb.gateway_shared_dir).resolve() if sb.gateway_shared_dir else home
        slots = home / "sandbox" / "slots"
        if shared != slots and shared not in slots.parents:
            raise SettingsError(f"sandbox.gateway_shared_dir ({shared}) must contain the kernel slots "
                                f"directory {slots}: kernels reach /data and /outputs through it")
        kernel_side = sb.gateway_kernel_shared_dir or str(shared)
        if not _SAFE_PATH_RE.fullmatch(kernel_side) or ".." in kernel_side.split("/"):
            raise SettingsError(f"sandbox.gateway_kernel_shared_dir must be an absolute path of letters, "
                                f"digits and . _ - @ + / (no '..'), not {kernel_side!r}")
        env: dict[str, str] = {}
        for name, value in sb.gateway_kernel_env.items():
            if not _ENV_NAME_RE.fullmatch(name):
                raise SettingsError(f"sandbox.gateway_kernel_env: {name!r} is not a KERNEL_* variable name "
                                    "(gateways pass only KERNEL_* variables to kernels)")
            if name.startswith(_RESERVED_ENV):
                raise SettingsError(f"sandbox.gateway_kernel_env: {name} is set by DataDesk itself")
            if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
                raise SettingsError(f"sandbox.gateway_kernel_env: the value of {name} must be one line of text")
            if token and token in value:
                raise SettingsError(f"sandbox.gateway_kernel_env: {name} contains the gateway token; "
                                    "the token never goes to kernels")
            env[name] = value
        return cls(url=url, token=token, kernel_name=sb.gateway_kernel_name, shared_dir=shared,
                   kernel_shared_dir=PurePosixPath(kernel_side), kernel_env=env)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def ws_url(self, kernel_id: str) -> str:
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = f"{parts.path}/api/kernels/{kernel_id}/channels"
        return urlunsplit((scheme, parts.netloc, path, "", ""))

    def relative(self, app_path: Path) -> PurePosixPath:
        """`app_path` relative to the shared dir (SandboxUnavailable when it lies outside)."""
        resolved = Path(app_path).resolve()
        try:
            return PurePosixPath(resolved.relative_to(self.shared_dir).as_posix())
        except ValueError:
            raise SandboxUnavailable(
                f"{resolved} is outside sandbox.gateway_shared_dir ({self.shared_dir}): kernels on the "
                "gateway cannot see it") from None

    def kernel_path(self, app_path: Path) -> str:
        return str(self.kernel_shared_dir / self.relative(app_path))

    def scrub(self, text: str) -> str:
        """`text` with the token blanked (server replies and exception texts, before they are shown)."""
        return text.replace(self.token, "***") if len(self.token) >= 8 else text  # shorter: would mangle words


def _http_problem(cfg: GatewayConfig, exc: Exception) -> str:
    return cfg.scrub(f"the Jupyter gateway at {cfg.url} is not reachable: {type(exc).__name__}: {exc}")


def _status_problem(cfg: GatewayConfig, response: httpx.Response, what: str) -> str:
    code = response.status_code
    if code in (401, 403):
        if not cfg.token:
            return (f"the Jupyter gateway at {cfg.url} requires a token (HTTP {code} to {what}): set "
                    "sandbox.gateway_token or DATADESK_GATEWAY_TOKEN")
        return (f"the Jupyter gateway at {cfg.url} rejected the token (HTTP {code} to {what}): check "
                "sandbox.gateway_token / DATADESK_GATEWAY_TOKEN")
    try:
        body = response.json()
        detail = str(body.get("message") or body.get("reason") or "") if isinstance(body, dict) else ""
    except ValueError:
        detail = response.text
    detail = cfg.scrub(" ".join(detail.split()))[:300]
    return f"the Jupyter gateway at {cfg.url} answered HTTP {code} to {what}" + (f": {detail}" if detail else "")


# --------------------------------------------------------------------------- the app's side


class GatewaySandbox:
    """Config, health check and orphan cleanup for one app process; makes `GatewayKernel`s."""

    def __init__(self, settings: SandboxSettings, home: Path) -> None:
        self.settings = settings
        self.home = Path(home)
        self.config = GatewayConfig.from_settings(settings, self.home)
        self.records_dir = self.home.joinpath(*RECORDS)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._health: tuple[float, tuple[bool, str]] = (0.0, (False, "not checked yet"))
        if not self.config.token:
            log.warning("sandbox.gateway_token is empty: the gateway at %s must not be reachable by others",
                        self.config.url)

    def health(self) -> tuple[bool, str]:
        """Gateway reachable, token accepted, kernelspec present (cached for a few seconds)."""
        checked, result = self._health
        if time.monotonic() - checked < HEALTH_CACHE_S:
            return result
        result = self._check()
        self._health = (time.monotonic(), result)
        return result

    def _check(self) -> tuple[bool, str]:
        cfg = self.config
        try:
            with httpx.Client(headers=cfg.headers, timeout=HEALTH_TIMEOUT_S) as client:
                response = client.get(f"{cfg.url}/api/kernelspecs")
        except httpx.HTTPError as exc:
            return False, _http_problem(cfg, exc)
        if response.status_code != 200:
            return False, _status_problem(cfg, response, "GET /api/kernelspecs")
        try:
            specs = response.json().get("kernelspecs") or {}
        except (ValueError, AttributeError):
            return False, f"the Jupyter gateway at {cfg.url} sent an unreadable kernelspec list"
        if cfg.kernel_name not in specs:
            offered = ", ".join(sorted(str(k) for k in specs)[:20]) or "none"
            return False, (f"the Jupyter gateway at {cfg.url} has no kernelspec {cfg.kernel_name!r} (it offers: "
                           f"{offered}); set sandbox.gateway_kernel_name")
        return True, ""

    # -- kernels an earlier run of this host left on the gateway -----------------------------
    def record(self, slot: str, kernel_id: str) -> None:
        self.records_dir.mkdir(parents=True, exist_ok=True)
        data = {"kernel": kernel_id, "owner": self.owner, "gateway": self.config.url}
        tmp = self.records_dir / f".{slot}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.records_dir / f"{slot}.json")

    def recorded(self, slot: str) -> str | None:
        """The gateway kernel id recorded for `slot` (None when there is none or it is unreadable)."""
        try:
            kid = json.loads((self.records_dir / f"{slot}.json").read_text()).get("kernel")
        except (OSError, ValueError, AttributeError):
            return None
        return kid if isinstance(kid, str) and _KERNEL_ID_RE.fullmatch(kid) else None

    def forget(self, slot: str) -> None:
        (self.records_dir / f"{slot}.json").unlink(missing_ok=True)

    def remove_orphans(self) -> int:
        """Stop gateway kernels started by app processes of this host that are gone."""
        if not self.records_dir.is_dir():
            return 0
        host = socket.gethostname()
        removed = 0
        for path in sorted(self.records_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                owner_host, _, pid = str(data.get("owner", "")).rpartition(":")
                kernel_id = str(data.get("kernel", ""))
            except (OSError, ValueError, AttributeError):
                path.unlink(missing_ok=True)
                continue
            if owner_host != host or not pid.isdigit() or _process_alive(int(pid)):
                continue  # another host's, or a live worker's
            if data.get("gateway") == self.config.url and _KERNEL_ID_RE.fullmatch(kernel_id):
                try:
                    with httpx.Client(headers=self.config.headers, timeout=HTTP_TIMEOUT_S) as client:
                        r = client.delete(f"{self.config.url}/api/kernels/{kernel_id}")
                    if r.status_code not in (204, 200, 404):
                        log.warning("orphan gateway kernel %s: %s", kernel_id,
                                    _status_problem(self.config, r, "DELETE"))
                        continue
                    removed += r.status_code != 404
                except httpx.HTTPError as exc:
                    log.warning("orphan sweep of the gateway skipped: %s", _http_problem(self.config, exc))
                    return removed
            path.unlink(missing_ok=True)
        if removed:
            log.info("stopped %d orphan gateway kernel(s)", removed)
        return removed

    def kernel(self, placement: KernelPlacement) -> "GatewayKernel":
        return GatewayKernel(placement, self)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- one kernel

SETUP_CODE = """
def _datadesk_setup(data, outputs, probe, expected):
    import os
    try:
        with open(os.path.join(data, probe)) as f:
            seen = f.read()
    except OSError as e:
        raise RuntimeError("the kernel cannot read %s: %s" % (os.path.join(data, probe), e.strerror)) from None
    if seen != expected:
        raise RuntimeError("%s is not the app's slot directory (the probe file differs)" % data)
    if not os.path.isdir(outputs) or not os.access(outputs, os.W_OK):
        raise RuntimeError("the kernel cannot write to %s" % outputs)
    os.chdir(outputs)
    ip = get_ipython()
    for magic, arg in (("xmode", "Plain"), ("colors", "nocolor")):
        try:
            ip.run_line_magic(magic, arg)
        except Exception:
            pass
_datadesk_setup({data!r}, {outputs!r}, {probe!r}, {expected!r})
del _datadesk_setup
"""


class GatewayKernel(KernelBackend):
    """One kernel on the gateway: REST for its lifecycle, a `GatewayChannel` for its messages."""

    interrupt_grace_s: float = INTERRUPT_GRACE_S

    def __init__(self, placement: KernelPlacement, sandbox: GatewaySandbox) -> None:
        self.placement = placement
        self.sandbox = sandbox
        self.config = sandbox.config
        self.settings = sandbox.settings
        self.started_at = 0.0
        self.remote_id: str | None = None
        self._http: httpx.AsyncClient | None = None
        self._channel: GatewayChannel | None = None
        self._alive: tuple[float, bool] = (0.0, False)
        self._gone = ""
        self._attached = False
        self.kernel_data = self.kernel_outputs = ""

    # -- another worker's kernel --------------------------------------------------------
    @classmethod
    async def attach(cls, placement: KernelPlacement, sandbox: GatewaySandbox, connect: bool = True,
                     started_at: float = 0.0) -> "GatewayKernel":
        """A client of a gateway kernel another worker started (found by its slot's record). With
        `connect=False` it can only be stopped; raises SandboxError when it cannot be reached."""
        self = cls(placement, sandbox)
        self._attached = True
        self.started_at = started_at
        self.remote_id = sandbox.recorded(placement.kernel_id)
        if self.remote_id is None:
            if connect:
                raise SandboxError("no gateway kernel is recorded for it")
            return self
        self.kernel_data = self.config.kernel_path(placement.data_dir)
        self.kernel_outputs = self.config.kernel_path(placement.outputs_dir)
        if connect:
            await self._connect_or_detach(self._open_channel())
        return self

    async def detach(self) -> None:
        """Close this client's connection; the kernel keeps running on the gateway."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        await self._close_http()

    # -- helpers ---------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(headers=self.config.headers, timeout=HTTP_TIMEOUT_S)
        return self._http

    def _api(self, path: str = "") -> str:
        return f"{self.config.url}/api/kernels{path}"

    def _env(self) -> dict[str, str]:
        """KERNEL_* variables for the kernel (and, on Enterprise Gateway, its pod template)."""
        p, cfg = self.placement, self.config
        return {
            **cfg.kernel_env,
            "KERNEL_WORKING_DIR": self.kernel_outputs,
            "KERNEL_DATADESK_SLOT": p.kernel_id,
            "KERNEL_DATADESK_DATA_DIR": self.kernel_data,
            "KERNEL_DATADESK_OUTPUTS_DIR": self.kernel_outputs,
            "KERNEL_DATADESK_DATA_SUBPATH": str(cfg.relative(p.data_dir)),
            "KERNEL_DATADESK_OUTPUTS_SUBPATH": str(cfg.relative(p.outputs_dir)),
        }

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._client().request(method, self._api(path), **kw)
        except httpx.HTTPError as exc:
            raise SandboxUnavailable(_http_problem(self.config, exc)) from None

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        p, cfg = self.placement, self.config
        t0 = time.monotonic()
        self._attached = False  # a kernel this worker starts is its own
        self.kernel_data = cfg.kernel_path(p.data_dir)
        self.kernel_outputs = cfg.kernel_path(p.outputs_dir)
        p.data_dir.mkdir(parents=True, exist_ok=True)
        p.outputs_dir.mkdir(parents=True, exist_ok=True)
        body = {"name": cfg.kernel_name, "env": self._env()}
        creating = asyncio.ensure_future(self._request("POST", "", json=body,
                                                       timeout=max(HTTP_TIMEOUT_S, self.settings.start_timeout_s)))
        try:
            response = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # cancelled (app shutdown) while the gateway starts it: stop what it made, or it leaks
            try:
                made = await creating
                kid = (made.json() or {}).get("id") if made.status_code in (200, 201) else None
                if isinstance(kid, str) and _KERNEL_ID_RE.fullmatch(kid):
                    await self._client().delete(self._api(f"/{kid}"))
            except Exception:
                pass
            await self._close_http()
            raise
        except BaseException:
            await self._close_http()
            raise
        if response.status_code not in (200, 201):
            await self._close_http()
            raise SandboxUnavailable(_status_problem(cfg, response, f"POST /api/kernels (kernelspec {cfg.kernel_name!r})"))
        try:
            kid = response.json().get("id")
        except (ValueError, AttributeError):
            kid = None
        if not isinstance(kid, str) or not _KERNEL_ID_RE.fullmatch(kid):
            await self._close_http()
            raise SandboxError(f"the Jupyter gateway at {cfg.url} returned no valid kernel id")
        self.remote_id = kid
        self._gone = ""
        self.sandbox.record(p.kernel_id, kid)
        try:
            await self._open_channel()
            await self._setup()
        except BaseException:
            await self.shutdown()
            raise
        self.started_at = time.time()
        self._alive = (time.monotonic(), True)
        log.info("gateway kernel %s (%s) ready in %.2f s", p.kernel_id, kid, time.monotonic() - t0)

    async def _open_channel(self) -> None:
        assert self.remote_id is not None
        channel = GatewayChannel(self.config.ws_url(self.remote_id), self.config.headers, self.placement.run_dir,
                                 self.is_alive, interrupt_grace_s=self.interrupt_grace_s)
        self._channel = channel
        await channel.open(self.settings.start_timeout_s,
                           lambda r: _status_problem(self.config, r, "the kernel websocket"))
        await channel.connect(self.settings.start_timeout_s)

    async def _setup(self) -> None:
        """Prove the path mapping (the kernel reads the app's probe file, can write its outputs dir),
        then cwd = outputs and plain tracebacks. Raises SandboxUnavailable naming the settings."""
        assert self._channel is not None
        probe = self.placement.data_dir / PROBE_FILE
        expected = secrets.token_hex(16)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(expected)
        try:
            code = SETUP_CODE.format(data=self.kernel_data, outputs=self.kernel_outputs, probe=PROBE_FILE,
                                     expected=expected)
            result = await self._channel.run(code, self.settings.start_timeout_s, self.interrupt, silent=True)
        finally:
            probe.unlink(missing_ok=True)
        if result.status != "ok":
            why = f"{result.error.evalue}" if result.error else f"the setup code ended with status {result.status}"
            raise SandboxUnavailable(
                f"the gateway kernel does not see the app's files at the mapped path: {why}. The app's "
                f"{self.config.shared_dir} (sandbox.gateway_shared_dir) must be the same volume the kernel sees at "
                f"{self.config.kernel_shared_dir} (sandbox.gateway_kernel_shared_dir), writable for the kernel's user")

    async def _close_http(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def shutdown(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        kid, self.remote_id = self.remote_id, None
        if kid is not None:
            if await self._delete(kid):
                self.sandbox.forget(self.placement.kernel_id)
        await self._close_http()
        self._alive = (time.monotonic(), False)

    async def _delete(self, kid: str) -> bool:
        """DELETE the kernel; True when it is gone. A gateway that is restarting the kernel (it
        died) answers 5xx until the restart is over: retry for a few seconds."""
        problem = ""
        for wait in DELETE_RETRIES_S:
            try:
                r = await self._client().delete(self._api(f"/{kid}"))
            except httpx.HTTPError as exc:
                problem = _http_problem(self.config, exc)
                break
            if r.status_code in (200, 204, 404):
                return True
            problem = _status_problem(self.config, r, "DELETE /api/kernels/{id}")
            if r.status_code < 500:
                break
            await asyncio.sleep(wait)
        log.warning("stopping gateway kernel %s: %s", kid, problem)
        return False

    async def restart(self) -> None:
        """A fresh interpreter: the gateway's restart (same kernel id, same websocket), else a new kernel."""
        channel, kid = self._channel, self.remote_id
        if channel is None or kid is None or channel.closed:
            await self.shutdown()
            await self.start()
            return
        channel.expect_restart = True
        try:
            r = await self._request("POST", f"/{kid}/restart",
                                    timeout=max(HTTP_TIMEOUT_S, self.settings.start_timeout_s))
            if r.status_code == 404:
                await self.shutdown()
                await self.start()
                return
            if r.status_code != 200:
                raise SandboxError(_status_problem(self.config, r, "POST /api/kernels/{id}/restart"))
            await channel.connect(self.settings.start_timeout_s)
            channel.lost = ""
            await self._setup()
        finally:
            channel.expect_restart = False
        self._gone = ""
        self._alive = (time.monotonic(), True)

    async def is_alive(self) -> bool:
        if self.remote_id is None or self._channel is None or self._channel.lost:
            return False
        checked, alive = self._alive
        if time.monotonic() - checked < ALIVE_CACHE_S:
            return alive
        try:
            r = await self._client().get(self._api(f"/{self.remote_id}"), timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as exc:
            self._gone = _http_problem(self.config, exc)
            alive = False
        else:
            if r.status_code == 404:
                self._gone = "the gateway no longer has this kernel (stopped or culled from outside)"
                alive = False
            elif r.status_code != 200:
                self._gone = _status_problem(self.config, r, "GET /api/kernels/{id}")
                alive = False
            else:
                state = _json_field(r, "execution_state")
                alive = state != "dead"
                if not alive:
                    self._gone = "the gateway reports the kernel dead"
        self._alive = (time.monotonic(), alive)
        return alive

    async def death_reason(self) -> str:
        if self._channel is not None and self._channel.lost:
            return self._channel.lost
        if self.remote_id is None:
            return "the kernel is not running"
        return self._gone or "the kernel stopped answering"

    # -- running code ----------------------------------------------------------------
    async def interrupt(self) -> None:
        if self.remote_id is None:
            return
        r = await self._request("POST", f"/{self.remote_id}/interrupt")
        if r.status_code not in (200, 204):
            log.warning("interrupting gateway kernel %s: %s", self.remote_id,
                        _status_problem(self.config, r, "POST /api/kernels/{id}/interrupt"))

    async def execute(self, code: str, timeout_s: float) -> ExecutionResult:
        """Run `code` as given (callers apply `rewrite_paths` first)."""
        if self._channel is None or not await self.is_alive():
            return ExecutionResult(status="died", note=f"the kernel is not running ({await self.death_reason()})")
        if self._channel.closed:  # the websocket dropped (a proxy, a gateway restart): the kernel lives
            await self._channel.close()
            try:
                await self._open_channel()
            except SandboxError as exc:
                return ExecutionResult(status="died", note=f"cannot reconnect to the kernel: {exc}")
        channel = self._channel
        assert channel is not None
        channel.interrupt_grace_s = self.interrupt_grace_s
        result = await channel.run(code, timeout_s, self.interrupt)
        if result.status == "died":
            self._alive = (time.monotonic(), False)
            result.note = f"the kernel died ({await self.death_reason()})"
        elif result.status == "timeout" and not channel.settled:
            await self.restart()
            result.note = "the kernel did not stop after the interrupt and was restarted; variables are gone"
        else:
            self._alive = (time.monotonic(), True)
        return result

    def rewrite_paths(self, code: str) -> str:
        """`"/data..."` and `"/outputs..."` string literals -> where this kernel sees its slot."""
        targets = {"/data": self.kernel_data, "/outputs": self.kernel_outputs}
        if not self.kernel_data or all(k == v for k, v in targets.items()):
            return code
        return _PATH_LITERAL_RE.sub(lambda m: m.group(1) + targets[m.group(2)], code)


def _json_field(response: httpx.Response, name: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None
