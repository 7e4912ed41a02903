"""The embedded kernel backend: an ipykernel subprocess on this host.

For a single trusted user on localhost. The kernel runs as the app's own user
with a clean environment (no app secrets), cwd = the thread's outputs dir, an
address-space limit and its own session/process group (so the whole tree can
be killed). It is NOT a security boundary: code can read and write anything
the app's user can. `serve` refuses this backend for anything but a single
trusted user unless told explicitly (see DESIGN.md section 7).

`/data` and `/outputs` do not exist here; `rewrite_paths` maps those string
literals in code to the placement's directories, as a convenience for code
written for the docker layout. Also a convenience, not isolation.

`LocalSandbox` is the backend the registry is given; `LocalKernel` one kernel.
With several app workers, another worker reaches a running kernel with
`LocalSandbox.attach` (a second client on the same ipc sockets; liveness from
/proc with the pid's start time, so a reused pid is never taken for the
kernel). The kernel leads its own session, so it outlives a crashed worker:
the registry's orphan rule then ends it by its process group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from datadesk.sandbox.backends.local import landlock

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
from datadesk.sandbox.messaging import (
    CONNECTION_FILE,
    IPYKERNEL_ARGS,
    KernelChannel,
    socket_prefix,
    write_connection_file,
)
from datadesk.sandbox.ownership import pid_alive, proc_start
from datadesk.settings import SandboxSettings

log = logging.getLogger(__name__)

WARNING_TEXT = "local sandbox: code runs as the app's user on this host; it is NOT a security boundary"
KERNEL_LOG = "kernel.log"
TERM_GRACE_S = 2.0
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# The inline backend is Agg-based (headless) and is what turns `plt.show()` and
# figures left open at the end of a cell into image/png display_data; plain
# "Agg" would make `plt.show()` a no-op and produce no images.
MPL_BACKEND = "module://matplotlib_inline.backend_inline"

_DATA_RE = re.compile(r"""(["'])/data(?=[/"'])""")
_OUTPUTS_RE = re.compile(r"""(["'])/outputs(?=[/"'])""")
_UNSAFE_IN_LITERAL = re.compile(r"""["'\\\n\r]""")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class LocalSandbox(SandboxBackend):
    """Kernels as ipykernel subprocesses of this host, under the address-space limit."""

    name = "local"

    def __init__(self, settings: SandboxSettings, home: Path | None = None) -> None:
        # RLIMIT_AS counts reserved address space: an idle kernel with pandas and pyarrow
        # already reserves ~1.1 GB, so the local limit is memory_mb on top of that.
        self.memory_bytes = (settings.memory_mb + 1536) << 20
        self.ready_timeout_s = settings.start_timeout_s
        self.allow_unsafe = settings.allow_unsafe_local
        self.home = home
        # Landlock: what the kernel may never touch (the app's home, and its config file)
        self.landlock_abi = landlock.abi_version()
        config = os.environ.get("DATADESK_CONFIG")
        self.hidden = [p for p in (home, Path(config) if config else None) if p is not None]

    def sharing_problem(self) -> str | None:
        """Why no local kernel may start now: more than one active user can execute code (read
        from users.json at every start, so a coder added while the server runs counts at once).
        A local kernel runs as the app's own uid: it could read the app's files and rewrite them."""
        if self.allow_unsafe or self.home is None:
            return None
        from datadesk.store.layout import Layout
        from datadesk.store.users import UserStore

        coders = [u.id for u in UserStore(Layout(self.home)).list()
                  if "code_execution" in u.permissions and not u.revoked]
        if len(coders) <= 1:
            return None
        return (f"the local sandbox is not a security boundary and {len(coders)} users can execute code "
                f"({', '.join(coders)}): use sandbox.backend = \"docker\", or set "
                "sandbox.allow_unsafe_local = true if every one of them may read and change this server")

    def confinement_problem(self) -> str | None:
        """Why no local kernel may start on this host: no Landlock to keep it out of the app's
        home (unless sandbox.allow_unsafe_local says every coder may change this server)."""
        if self.landlock_abi > 0 or self.allow_unsafe or self.home is None:
            return None
        return ("this host offers no Landlock (Linux 5.13 or later), so a local kernel could read and "
                "change the app's own files: use sandbox.backend = \"docker\", or set "
                "sandbox.allow_unsafe_local = true for a trusted single user")

    def handout_problem(self) -> str | None:
        """The start rules, asked again when a pre-started kernel leaves the pool: one started
        before a second coder was added must not serve anyone once there are two."""
        return self.sharing_problem() or self.confinement_problem()

    def _gate(self) -> None:
        problem = self.handout_problem()
        if problem:
            raise SandboxUnavailable(problem)

    def _confine(self) -> list[Path] | None:
        return self.hidden if self.landlock_abi > 0 and self.home is not None else None

    def kernel(self, placement: KernelPlacement) -> "LocalKernel":
        self._gate()
        return LocalKernel(placement, memory_bytes=self.memory_bytes, ready_timeout_s=self.ready_timeout_s,
                           hidden=self._confine())

    async def attach(self, placement: KernelPlacement, locator: KernelLocator,
                     connect: bool = True) -> "LocalKernel":
        """Another worker's kernel on this host, found by its pid and the pid's start time."""
        self._gate()
        return await LocalKernel.attach(placement, locator.pid, locator.pid_start, connect=connect,
                                        memory_bytes=self.memory_bytes, ready_timeout_s=self.ready_timeout_s)


class LocalKernel(ChannelProbe, Kernel):
    """One ipykernel subprocess: its own session and process group, a clean environment."""

    # How long to wait for idle after an interrupt before restarting the kernel.
    interrupt_grace_s: float = INTERRUPT_GRACE_S

    def __init__(
        self,
        placement: KernelPlacement,
        memory_bytes: int = 2 << 30,
        ready_timeout_s: float = 30,
        hidden: list[Path] | None = None,
    ):
        self.placement = placement
        self.memory_bytes = int(memory_bytes)
        self.hidden = hidden  # confined with Landlock (never inside these); None: unconfined
        self._landlock: landlock.Plan | None = None
        self.ready_timeout_s = ready_timeout_s
        self.started_at = 0.0
        self._proc: asyncio.subprocess.Process | None = None
        self._channel: KernelChannel | None = None
        self._shut_down = False
        # attached to a kernel another worker started: its pid and start time, no process handle
        self._pid: int | None = None
        self._pid_start: int | None = None

    @classmethod
    async def attach(cls, placement: KernelPlacement, pid: int | None, pid_start: int | None, *,
                     connect: bool = True, memory_bytes: int = 2 << 30,
                     ready_timeout_s: float = 30) -> "LocalKernel":
        """A client of a kernel started by another worker (its connection file and sockets in
        `placement.run_dir`). With `connect=False` it can only be stopped (orphan cleanup)."""
        self = cls(placement, memory_bytes=memory_bytes, ready_timeout_s=ready_timeout_s)
        self._pid, self._pid_start = pid, pid_start
        if connect:
            if not await self.is_alive():
                raise SandboxError("the kernel process is gone")
            info = json.loads((placement.run_dir / CONNECTION_FILE).read_text())
            self._channel = KernelChannel({**info, "ip": socket_prefix(placement.run_dir)}, placement.run_dir,
                                          self.is_alive, interrupt_grace_s=self.interrupt_grace_s)
            await self._connect_or_detach(self._channel.connect(min(self.ready_timeout_s, 10)))
        return self

    @property
    def attached(self) -> bool:
        return self._proc is None and self._pid is not None

    def locator(self) -> KernelLocator:
        """Its pid (= process group) and the pid's start time, for another worker to find it."""
        if self._proc is not None and self._pid_start is None:
            self._pid_start = proc_start(self._proc.pid)
        return KernelLocator(pid=self.pid, pid_start=self._pid_start)

    async def detach(self) -> None:
        """Close this client's connection; the kernel keeps running."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    # ------------------------------------------------------------------ helpers

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else self._pid

    def _env(self) -> dict[str, str]:
        run = self.placement.run_dir
        exe_dir = os.path.dirname(sys.executable)
        path = SAFE_PATH if exe_dir in SAFE_PATH.split(":") else f"{exe_dir}:{SAFE_PATH}"
        return {
            "PATH": path,
            "HOME": str(run / "home"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "MPLBACKEND": MPL_BACKEND,
            "MPLCONFIGDIR": str(run / "mpl"),
            "TMPDIR": str(run / "tmp"),
            "IPYTHONDIR": str(run / "ipython"),
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
        }

    def _preexec(self) -> None:  # runs in the child between fork and exec
        limit = self.memory_bytes
        if limit > 0:  # 0 or less: no address-space limit
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self._landlock is not None:
            landlock.apply(self._landlock)  # raises: the kernel does not start unconfined

    def _kernel_log_tail(self, lines: int = 8, chars: int = 1500) -> str:
        try:
            text = (self.placement.run_dir / KERNEL_LOG).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])[-chars:]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            return
        await self._stop()  # a previous, dead kernel: close its channel, reap stragglers
        self._proc = None
        self._pid = self._pid_start = None
        self._shut_down = False
        await self._launch()

    async def _launch(self) -> None:
        p = self.placement
        p.outputs_dir.mkdir(parents=True, exist_ok=True)
        p.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(p.run_dir, 0o700)
        for sub in ("home", "mpl", "ipython", "tmp"):
            (p.run_dir / sub).mkdir(exist_ok=True)
        if self.hidden is not None:
            self._landlock = landlock.plan(read=[p.data_dir], write=[p.outputs_dir, p.run_dir], hidden=self.hidden)
        _, host_info = write_connection_file(p.run_dir, socket_prefix(p.run_dir))
        log.warning(WARNING_TEXT + " (kernel %s)", p.kernel_id)
        t0 = time.monotonic()
        with open(p.run_dir / KERNEL_LOG, "ab") as klog:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    str(p.run_dir / CONNECTION_FILE),
                    *IPYKERNEL_ARGS,
                    cwd=str(p.outputs_dir),
                    env=self._env(),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=klog,
                    stderr=klog,
                    preexec_fn=self._preexec,
                    start_new_session=True,
                )
            except (OSError, subprocess.SubprocessError) as e:  # SubprocessError: the confinement failed
                raise SandboxError(f"cannot start the local kernel: {e}") from e
        self._channel = KernelChannel(
            host_info, p.run_dir, self.is_alive, interrupt_grace_s=self.interrupt_grace_s
        )
        try:
            await self._channel.connect(self.ready_timeout_s)
        except BaseException as e:
            detail = self._kernel_log_tail()
            exited = self._proc is not None and self._proc.returncode is not None
            await self._stop()
            if isinstance(e, SandboxError):
                msg = str(e)
                if exited:
                    msg += f" ({await self.death_reason()})"
                if detail:
                    msg += f"\nkernel log:\n{detail}"
                raise SandboxError(msg) from e
            raise
        self.started_at = time.time()
        log.info(
            "local kernel %s ready in %.2f s (pid %s)", p.kernel_id, time.monotonic() - t0, self._proc.pid
        )

    async def _stop(self) -> None:
        """Close the channel and kill the kernel's process group (TERM, then KILL)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        proc = self._proc
        if proc is None:
            await self._stop_attached()
            return
        pgid = proc.pid  # start_new_session: the kernel leads its own group
        if proc.returncode is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), TERM_GRACE_S)
            except asyncio.TimeoutError:
                pass
        # Anything left in the group (the kernel, or children it spawned), and children that
        # moved to a group of their own within the kernel's session: a cell's sleeping
        # children never outlive its kernel.
        _killpg(pgid, signal.SIGKILL)
        _kill_session(pgid)
        if proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except asyncio.TimeoutError:
                log.error("local kernel pid %s did not exit after SIGKILL", proc.pid)

    async def _stop_attached(self) -> None:
        """End a kernel this worker did not start (no process handle): its whole group, TERM then
        KILL, only while the pid is still that kernel."""
        pid, start = self._pid, self._pid_start
        if not pid_alive(pid, start):
            return
        _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while pid_alive(pid, start) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if pid_alive(pid, start):
            _killpg(pid, signal.SIGKILL)

    async def restart(self) -> None:
        await self._stop()
        self._proc = None
        self._pid = self._pid_start = None  # the new kernel is this worker's own
        self._shut_down = False
        await self._launch()

    async def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        await self._stop()
        self._clear_run_dir()

    def _clear_run_dir(self) -> None:
        p = self.placement
        run = p.run_dir
        if not run.is_dir():
            return
        keep = {p.outputs_dir.resolve(), p.data_dir.resolve()}
        run_resolved = run.resolve()
        if any(k == run_resolved or run_resolved in k.parents for k in keep):
            # outputs/data live inside run_dir: remove everything else only.
            for entry in run.iterdir():
                r = entry.resolve() if not entry.is_symlink() else entry
                if r in keep or any(r in k.parents for k in keep):
                    continue
                _remove(entry)
            return
        shutil.rmtree(run, ignore_errors=True)

    async def is_alive(self) -> bool:
        if self._proc is None:
            return self._pid is not None and pid_alive(self._pid, self._pid_start)
        return self._proc.returncode is None

    async def death_reason(self) -> str:
        proc = self._proc
        if proc is None:
            if self._pid is not None:  # another worker's kernel: no exit status to read
                return "the kernel is running" if pid_alive(self._pid, self._pid_start) else \
                    "the kernel process exited or was killed"
            return "the kernel is not running"
        rc = proc.returncode
        if rc is None:
            return "the kernel is running"
        if rc < 0:
            sig = -rc
            reason = f"killed by signal {sig} ({_signal_name(sig)})"
            if sig == signal.SIGKILL:
                reason += "; killed from outside or out of memory"
            return reason
        return f"exited with code {rc}"

    # ------------------------------------------------------------------ running code

    async def interrupt(self) -> None:
        if self._channel is not None:
            await self._channel.interrupt()
        elif await self.is_alive() and self.pid:
            _killpg(self.pid, signal.SIGINT)

    async def execute(self, code: str, timeout_s: float, *, on_output: OnOutput | None = None,
                      on_status: OnStatus | None = None) -> ExecutionResult:
        """Run `code` as given (callers apply `rewrite_paths` first)."""
        if self._channel is None or not await self.is_alive():
            reason = await self.death_reason()
            return ExecutionResult(status="died", note=f"the kernel is not running ({reason})")
        self._channel.interrupt_grace_s = self.interrupt_grace_s
        result = await self._channel.run(code, timeout_s, self.interrupt, on_output=on_output, on_status=on_status)
        if result.status == "died":
            # Let the child watcher record the exit status.
            if self._proc is not None:
                try:
                    await asyncio.wait_for(self._proc.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
            result.note = f"the kernel died ({await self.death_reason()})"
        elif result.status == "timeout" and not self._channel.settled:
            tell_status(on_status, "the code did not stop after the interrupt: restarting the kernel")
            await self.restart()
            result.note = "the kernel did not stop after the interrupt and was restarted; variables are gone"
        return result

    def rewrite_paths(self, code: str) -> str:
        """Map the string literals `"/data..."` and `"/outputs..."` (either quote) to
        the placement's directories. A convenience for a trusted user running
        code written for the docker layout; not isolation of any kind."""
        p = self.placement
        for pattern, target in ((_DATA_RE, p.data_dir), (_OUTPUTS_RE, p.outputs_dir)):
            t = str(target)
            if _UNSAFE_IN_LITERAL.search(t):
                log.warning("not rewriting paths to %r: it cannot sit inside a string literal", t)
                continue
            code = pattern.sub(lambda m, t=t: m.group(1) + t, code)
        return code


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (the kernel leads its own: start_new_session)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except OSError:
        pass
