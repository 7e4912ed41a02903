"""Kernels on a Jupyter Kernel Gateway or Enterprise Gateway (e.g. kernel pods on Kubernetes).

The gateway protocol: REST to start (`POST /api/kernels` with the kernelspec
name and `KERNEL_*` variables), look up, interrupt, restart and stop
(`DELETE`) kernels, and the websocket `/api/kernels/{id}/channels` carrying
Jupyter messages as JSON with a `channel` field. Every request carries
`Authorization: token <t>`; the token is never put in a kernel's
environment, in a URL or in a log line (the websocket client's debug log,
which prints handshake headers, is kept off).

Files, one of two ways (`sandbox.gateway_files`):
- volume: the kernel's slot sits on a volume the app and the kernels both
  mount; the settings, the path mapping between the two sides and the probe
  that proves it at each start are in `config.py`. Outputs are read app-side
  from the slot, never following a link (files.py).
- presigned (the cluster default): no shared volume. Before each cell the
  kernel fetches the thread's artifacts into its own /data through presigned
  GET URLs, and new files under /outputs go back through presigned PUTs
  (`transfer.py`).
Code is rewritten so `/data/...` and `/outputs/...` literals name the
kernel-side paths (`rewrite_paths`), and the kernel's working directory is
its outputs dir.

The registry above is unchanged: caps, the reaper (15 min idle, 4 h total),
fresh-kernel notices. A kernel the gateway restarted on its own (it died) is
reported dead, so the registry starts a fresh one and says so. Messages travel
through `channel.GatewayChannel`.

The gateway's kernel id is kept in the kernel table (`KernelLocator.remote`),
so a worker of any host can `attach` to the kernel, or adopt it when its owner
is gone (sandbox/attach.py). On the embedded set it is also kept in
`<home>/sandbox/gateway-kernels/` (with the owning worker), where kernels whose
owner worker is gone are stopped (`GatewaySandbox.remove_orphans`); a cluster
keeps no such files (each host's home is its own), its reaper ends idle ones.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx

from datadesk.sandbox.base import (
    ExecutionResult,
    Kernel,
    KernelLocator,
    KernelPlacement,
    OnOutput,
    OnStatus,
    SandboxBackend,
    SandboxError,
    SandboxUnavailable,
)
from datadesk.sandbox.execution import INTERRUPT_GRACE_S, ChannelProbe, tell_status
from datadesk.sandbox.kernel_setup import setup_line
from datadesk.sandbox.backends.gateway import transfer
from datadesk.sandbox.backends.gateway.channel import GatewayChannel
from datadesk.sandbox.backends.gateway.config import GatewayConfig, http_problem, prove_mapping, status_problem
from datadesk.sandbox.ownership import owner_alive, this_worker
from datadesk.settings import SandboxSettings
from datadesk.sandbox.files import OutputFile
from datadesk.store.files import read_json_object, write_json
from datadesk.store.interfaces.kernelfiles import KernelFiles

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 15.0
HEALTH_TIMEOUT_S = 5.0
HEALTH_CACHE_S = 10.0
ALIVE_CACHE_S = 1.0
DELETE_RETRIES_S = (0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0)  # waits after a DELETE answered 5xx
RECORDS = ("sandbox", "gateway-kernels")  # under home: which gateway kernel each slot started

_KERNEL_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_PATH_LITERAL_RE = re.compile(r"""(["'])(/data|/outputs)(?=[/"'])""")


# --------------------------------------------------------------------------- the app's side


class GatewaySandbox(SandboxBackend):
    """Config, health check and orphan cleanup for one app process; makes and reaches `GatewayKernel`s."""

    name = "gateway"
    shared_across_hosts = True  # kernels live on the gateway: any app host reaches them

    def __init__(self, settings: SandboxSettings, home: Path, cluster: bool = False) -> None:
        """`cluster`: the app runs on the cluster set (the kernel table is shared by every host,
        and there is an object store for presigned files)."""
        self.settings = settings
        self.home = Path(home)
        self.config = GatewayConfig.from_settings(settings, self.home, cluster)
        self.records_in_home = not cluster
        self.kernels_outlive_workers = cluster  # a rollout leaves them to the other hosts to adopt
        self.records_dir = self.home.joinpath(*RECORDS)
        self.owner = this_worker().id  # the same owner ids (and heartbeats) as the kernel table
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
            return False, http_problem(cfg, exc)
        if response.status_code != 200:
            return False, status_problem(cfg, response, "GET /api/kernelspecs")
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
        if not self.records_in_home:
            return
        write_json(self.records_dir / f"{slot}.json",
                   {"kernel": kernel_id, "owner": self.owner, "gateway": self.config.url}, sync=False)

    def recorded(self, slot: str) -> str | None:
        """The gateway kernel id recorded for `slot` (None when there is none or it is unreadable)."""
        kid = (read_json_object(self.records_dir / f"{slot}.json") or {}).get("kernel")
        return kid if isinstance(kid, str) and _KERNEL_ID_RE.fullmatch(kid) else None

    def forget(self, slot: str) -> None:
        (self.records_dir / f"{slot}.json").unlink(missing_ok=True)

    def remove_orphans(self) -> int:
        """Stop gateway kernels whose owner worker is gone (an earlier run, a crashed worker), by
        the same rule as the docker sweep (`ownership.owner_alive`); live workers' kernels stay."""
        if not self.records_in_home or not self.records_dir.is_dir():
            return 0
        removed = 0
        for path in sorted(self.records_dir.glob("*.json")):
            data = read_json_object(path)
            if data is None:
                path.unlink(missing_ok=True)
                continue
            if owner_alive(self.home, data.get("owner"), self.settings.owner_stale_s):
                continue
            kernel_id = str(data.get("kernel", ""))
            if data.get("gateway") == self.config.url and _KERNEL_ID_RE.fullmatch(kernel_id):
                try:
                    with httpx.Client(headers=self.config.headers, timeout=HTTP_TIMEOUT_S) as client:
                        r = client.delete(f"{self.config.url}/api/kernels/{kernel_id}")
                    if r.status_code not in (204, 200, 404):
                        log.warning("orphan gateway kernel %s: %s", kernel_id,
                                    status_problem(self.config, r, "DELETE"))
                        continue
                    removed += r.status_code != 404
                except httpx.HTTPError as exc:
                    log.warning("orphan sweep of the gateway skipped: %s", http_problem(self.config, exc))
                    return removed
            path.unlink(missing_ok=True)
        if removed:
            log.info("stopped %d orphan gateway kernel(s)", removed)
        return removed

    def kernel(self, placement: KernelPlacement) -> "GatewayKernel":
        return GatewayKernel(placement, self)

    async def attach(self, placement: KernelPlacement, locator: KernelLocator,
                     connect: bool = True) -> "GatewayKernel":
        """Another worker's gateway kernel, found by the table's `locator.remote` (or its slot's
        record in gateway-kernels/)."""
        return await GatewayKernel.attach(placement, self, connect, locator.remote)


# --------------------------------------------------------------------------- one kernel


class GatewayKernel(ChannelProbe, Kernel):
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
    async def attach(cls, placement: KernelPlacement, sandbox: GatewaySandbox,
                     connect: bool = True, remote: str | None = None) -> "GatewayKernel":
        """A client of a gateway kernel another worker started (`remote`: its gateway id, else
        found by its slot's record). With `connect=False` it can only be stopped; raises
        SandboxError when it cannot be reached."""
        self = cls(placement, sandbox)
        self._attached = True
        valid = remote if remote and _KERNEL_ID_RE.fullmatch(remote) else None
        self.remote_id = valid or sandbox.recorded(placement.kernel_id)
        if self.remote_id is None:
            if connect:
                raise SandboxError("no gateway kernel is recorded for it")
            return self
        self.kernel_data, self.kernel_outputs = self._kernel_dirs()
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

    def _kernel_dirs(self) -> tuple[str, str]:
        """Where the kernel sees its data and outputs (its own folders, or the shared volume's)."""
        p, cfg = self.placement, self.config
        if cfg.presigned:
            return cfg.kernel_dirs(p.kernel_id)
        return cfg.kernel_path(p.data_dir), cfg.kernel_path(p.outputs_dir)

    def _env(self) -> dict[str, str]:
        """KERNEL_* variables for the kernel (and, on Enterprise Gateway, its pod template:
        `KERNEL_DATADESK_FILES` says whether it mounts the shared volume or keeps its own)."""
        p, cfg = self.placement, self.config
        env = {
            **cfg.kernel_env,
            "KERNEL_WORKING_DIR": self.kernel_outputs,
            "KERNEL_DATADESK_SLOT": p.kernel_id,
            "KERNEL_DATADESK_DATA_DIR": self.kernel_data,
            "KERNEL_DATADESK_OUTPUTS_DIR": self.kernel_outputs,
            "KERNEL_DATADESK_FILES": "presigned" if cfg.presigned else "volume",
        }
        if not cfg.presigned:
            env["KERNEL_DATADESK_DATA_SUBPATH"] = str(cfg.relative(p.data_dir))
            env["KERNEL_DATADESK_OUTPUTS_SUBPATH"] = str(cfg.relative(p.outputs_dir))
        return env

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._client().request(method, self._api(path), **kw)
        except httpx.HTTPError as exc:
            raise SandboxUnavailable(http_problem(self.config, exc)) from None

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        p, cfg = self.placement, self.config
        t0 = time.monotonic()
        self._attached = False  # a kernel this worker starts is its own
        self.kernel_data, self.kernel_outputs = self._kernel_dirs()
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
            raise SandboxUnavailable(status_problem(cfg, response, f"POST /api/kernels (kernelspec {cfg.kernel_name!r})"))
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
                           lambda r: status_problem(self.config, r, "the kernel websocket"))
        await channel.connect(self.settings.start_timeout_s)

    async def _setup(self) -> None:
        """Prove the path mapping, then cwd = outputs and plain tracebacks (`config.prove_mapping`);
        presigned: make the kernel's own folders and install its file helper (`transfer.set_up`)."""
        assert self._channel is not None
        if self.config.presigned:
            await transfer.set_up(self._channel, self.kernel_data, self.kernel_outputs,
                                  self.settings.start_timeout_s, self.interrupt)
        else:
            await prove_mapping(self._channel, self.config, self.placement.data_dir, self.kernel_data,
                                self.kernel_outputs, self.settings.start_timeout_s, self.interrupt)
        # the chart house style, which the other backends pass as a start-up line (kernel_setup.py)
        styled = await self._channel.run(setup_line(), self.settings.start_timeout_s, self.interrupt, silent=True)
        if styled.status != "ok":
            log.warning("gateway kernel %s: the chart house style was not applied (%s)", self.placement.kernel_id,
                        styled.error.evalue if styled.error else styled.status)

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
                problem = http_problem(self.config, exc)
                break
            if r.status_code in (200, 204, 404):
                return True
            problem = status_problem(self.config, r, "DELETE /api/kernels/{id}")
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
                raise SandboxError(status_problem(self.config, r, "POST /api/kernels/{id}/restart"))
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
            self._gone = http_problem(self.config, exc)
            alive = False
        else:
            if r.status_code == 404:
                self._gone = "the gateway no longer has this kernel (stopped or culled from outside)"
                alive = False
            elif r.status_code != 200:
                self._gone = status_problem(self.config, r, "GET /api/kernels/{id}")
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

    def locator(self) -> KernelLocator:
        return KernelLocator(remote=self.remote_id)

    def outputs_root(self) -> str | None:
        return None if self.config.presigned else super().outputs_root()

    # -- files without a shared volume ------------------------------------------------
    async def receive_files(self, files: KernelFiles) -> list[str]:
        if not self.config.presigned:
            return await super().receive_files(files)
        channel = await self._ready_channel()
        if channel is None:
            return []  # the cell that follows reports the dead kernel
        return await transfer.deliver(channel, files, self.kernel_data, self._transfer_timeout_s, self.interrupt)

    async def read_outputs(self, seen: dict[str, tuple[int, int]], max_bytes: int,
                           files: KernelFiles | None = None) -> tuple[list[OutputFile], list[str]] | None:
        if not self.config.presigned:
            return await super().read_outputs(seen, max_bytes)
        if files is None or (channel := await self._ready_channel()) is None:
            return None
        return await transfer.collect(channel, files, self.kernel_outputs, max_bytes,
                                      self._transfer_timeout_s, self.interrupt)

    @property
    def _transfer_timeout_s(self) -> float:
        return max(self.settings.start_timeout_s, self.settings.exec_timeout_s)

    async def _ready_channel(self) -> GatewayChannel | None:
        """The kernel's channel, reopened when the websocket dropped; None when the kernel is gone."""
        if self._channel is None or not await self.is_alive():
            return None
        if self._channel.closed:  # a proxy or a gateway restart dropped it: the kernel lives
            await self._channel.close()
            try:
                await self._open_channel()
            except SandboxError:
                return None
        return self._channel

    # -- running code ----------------------------------------------------------------
    async def interrupt(self) -> None:
        if self.remote_id is None:
            return
        r = await self._request("POST", f"/{self.remote_id}/interrupt")
        if r.status_code not in (200, 204):
            log.warning("interrupting gateway kernel %s: %s", self.remote_id,
                        status_problem(self.config, r, "POST /api/kernels/{id}/interrupt"))

    async def execute(self, code: str, timeout_s: float, *, on_output: OnOutput | None = None,
                      on_status: OnStatus | None = None) -> ExecutionResult:
        """Run `code` as given (callers apply `rewrite_paths` first)."""
        channel = await self._ready_channel()
        if channel is None:
            return ExecutionResult(status="died", note=f"the kernel is not running ({await self.death_reason()})")
        channel.interrupt_grace_s = self.interrupt_grace_s
        result = await channel.run(code, timeout_s, self.interrupt, on_output=on_output, on_status=on_status)
        if result.status == "died":
            self._alive = (time.monotonic(), False)
            result.note = f"the kernel died ({await self.death_reason()})"
        elif result.status == "timeout" and not channel.settled:
            tell_status(on_status, "the code did not stop after the interrupt: restarting the kernel")
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
