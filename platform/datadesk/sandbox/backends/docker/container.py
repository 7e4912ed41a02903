"""The production kernel backend: one locked-down container per kernel (docker SDK).

Each container: no network, read-only root, sized tmpfs for /tmp, HOME and
/outputs, all capabilities dropped, no-new-privileges, the seccomp profile its
image was built with, pids/memory/CPU limits, a uid of its own that no host
account has, an init process and a clean environment (no app secrets).
The kernel speaks ZMQ over `ipc` sockets in a bind-mounted per-kernel
directory that only the app and the kernel can enter, sealed once the kernel
is up (confinement.py): there is no TCP at all. The thread's data is a
read-only bind mount at /data (a slot directory of hard links, see files.py).

/outputs is a sized tmpfs inside the container, so code cannot fill the host
disk; after each execution its new regular files are read through the
container's mount namespace (`/proc/<pid>/root/outputs`), never following a
link, within the quota. (The engine's archive API cannot see tmpfs mounts.)
When the app cannot see that process (it runs in a container itself, as with
docker compose), a listing and a tar stream of /outputs are made inside the
kernel container by `docker exec` as the sandbox user and read in memory with
the same rules (files.plan_outputs, files.read_outputs_tar).

Paths handed to the engine (the /data slot, the socket dir) are resolved on
the engine's host. An app in a container sees the host's files only under the
data directory bind-mounted at the same path: `sandbox.shared_dir` names it,
and a kernel whose directories lie outside it is refused with the reason.

Containers carry labels (`datadesk.home`, `datadesk.kernel`, and the owner:
`datadesk.owner` = the worker id, `datadesk.owner_host`, `datadesk.owner_pid`).
The orphan sweep (at start and in every host-wide reaper round) removes only
containers of this data directory whose owner is gone: its heartbeat is stale
or, on this host, its pid is dead (ownership.owner_alive). A live worker's
kernels are never touched. Another worker reaches a running kernel with
`DockerSandbox.attach` (a second client on the bind-mounted ipc sockets).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from datadesk.sandbox.base import (
    ExecutionResult, Kernel, KernelLocator, KernelPlacement, OnOutput, OnStatus, SandboxBackend, SandboxError,
    SandboxUnavailable,
)
from datadesk.sandbox.backends.docker.confinement import UID_LABEL, ConfinementError, EngineConfinement, KernelDirs, container_uid
from datadesk.sandbox.execution import ChannelProbe, tell_status
from datadesk.sandbox.files import LISTING_FORMAT, OutputFile, plan_outputs, read_outputs_tar
from datadesk.sandbox.messaging import (
    CONNECTION_FILE, IPYKERNEL_ARGS, KernelChannel, socket_paths, write_connection_file,
)
from datadesk.sandbox.ownership import owner_alive, this_worker
from datadesk.settings import SandboxSettings
from datadesk.store.files import read_json

log = logging.getLogger(__name__)

LEGACY_UID = 1000  # the kernel user of containers started before kernels had uids of their own
KERNEL_DIR = "/run/kernel"
ALIVE_CACHE_S = 1.0
MAX_DEPTH = 8  # of /outputs, as files.read_new_outputs
LISTING_MAX_BYTES = 8 << 20  # of one /outputs listing (~250k entries)
EXEC_TIMEOUT_S = 60  # of the listing or the tar inside the kernel container
ENV = {
    "HOME": "/home/sandbox",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "MPLCONFIGDIR": "/tmp/mpl",
    "IPYTHONDIR": "/tmp/ipython",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "LANG": "C.UTF-8",
    "USER": "sandbox",  # the kernel uid has no passwd entry: getpass.getuser() reads these
    "LOGNAME": "sandbox",
}
# the kernel's sockets must be group-class writable (umask 007), or the ACL that lets the app
# connect is masked away (unix_bind applies the umask; see confinement.py)
LAUNCH = ["sh", "-c", 'umask 007 && exec "$@"', "sh"]
UID_ATTEMPTS = 5


class DockerSandbox(SandboxBackend):
    """Engine connection, image check, orphan cleanup; makes and reaches `DockerKernel`s."""

    name = "docker"

    def __init__(self, settings: SandboxSettings, home: Path) -> None:
        self.settings = settings
        self.home = Path(home)
        self.home_label = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:16]
        self._client: Any = None
        self._health: tuple[float, tuple[bool, str]] = (0.0, (False, "not checked yet"))
        self.confinement = EngineConfinement(lambda: self.client, settings)

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            try:
                self._client = docker.from_env(timeout=30)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(f"Docker engine not reachable: {exc}") from None
        return self._client

    def health(self) -> tuple[bool, str]:
        """Engine reachable and image present (cached for a few seconds)."""
        checked, result = self._health
        if time.monotonic() - checked < 10:
            return result
        try:
            self.client.ping()
            self.client.images.get(self.settings.image)
            result = (True, "")
        except SandboxUnavailable as exc:
            result = (False, str(exc))
        except Exception as exc:
            name = type(exc).__name__
            if name == "ImageNotFound":
                result = (False, f"the sandbox image {self.settings.image} is missing: run `datadesk sandbox build`")
            else:
                result = (False, f"Docker engine not reachable: {exc}")
        self._health = (time.monotonic(), result)
        return result

    @property
    def owner(self) -> str:
        return this_worker().id

    def labels(self, kernel_id: str) -> dict[str, str]:
        w = this_worker()
        return {"datadesk.sandbox": "1", "datadesk.home": self.home_label, "datadesk.kernel": kernel_id,
                "datadesk.owner": w.id, "datadesk.owner_host": w.host, "datadesk.owner_pid": str(w.pid)}

    def remove_orphans(self) -> int:
        """Remove this data directory's containers whose owner worker is gone (an earlier run, a
        crashed worker); containers of live workers are left alone. Returns how many went."""
        try:
            found = self.client.containers.list(all=True, filters={"label": f"datadesk.home={self.home_label}"})
        except Exception as exc:
            log.warning("orphan sweep skipped: %s", exc)
            return 0
        stale = self.settings.owner_stale_s
        gone = [c for c in found if not owner_alive(self.home, (c.labels or {}).get("datadesk.owner"), stale)]
        for c in gone:
            try:
                c.remove(force=True)
            except Exception as exc:
                if type(exc).__name__ != "NotFound":
                    log.warning("could not remove orphan container %s: %s", c.name, exc)
        if gone:
            log.info("removed %d orphan sandbox container(s) whose worker is gone", len(gone))
        return len(gone)

    def kernel(self, placement: KernelPlacement) -> "DockerKernel":
        return DockerKernel(placement, self)

    async def attach(self, placement: KernelPlacement, locator: KernelLocator,
                     connect: bool = True) -> "DockerKernel":
        """Another worker's kernel container, found by its id."""
        return await DockerKernel.attach(placement, self, locator.container, connect=connect)


class DockerKernel(ChannelProbe, Kernel):
    """One kernel container and the ZMQ channel to it over the bind-mounted ipc sockets."""

    def __init__(self, placement: KernelPlacement, sandbox: DockerSandbox) -> None:
        self.placement = placement
        self.sandbox = sandbox
        self.settings = sandbox.settings
        self.started_at = 0.0
        self._container: Any = None
        self._channel: KernelChannel | None = None
        self._alive: tuple[float, bool] = (0.0, False)
        self._pid = 0
        self._pid_visible = False
        self._attached = False
        self.uid: int | None = None  # the kernel's uid = gid on the host
        self._dirs: KernelDirs | None = None

    # -- ownership -----------------------------------------------------------------
    @classmethod
    async def attach(cls, placement: KernelPlacement, sandbox: DockerSandbox, container_id: str | None,
                     connect: bool = True) -> "DockerKernel":
        """A client of a kernel container another worker started. With `connect=False` it can only
        be stopped (orphan cleanup); raises SandboxError when the container cannot be reached."""
        self = cls(placement, sandbox)
        self._attached = True
        if not container_id:
            if connect:
                raise SandboxError("the kernel has no container")
            return self
        try:
            self._container = await asyncio.to_thread(sandbox.client.containers.get, container_id)
            state = await asyncio.to_thread(self._state)
        except Exception as exc:
            self._container = None
            if connect:
                raise SandboxError(f"its container cannot be reached ({type(exc).__name__})") from None
            return self
        self._pid = int(state.get("Pid") or 0)
        self._pid_visible = _is_container_process(self._pid, self._container.id)
        self.uid = container_uid(self._container.attrs) or LEGACY_UID
        if not connect:
            return self
        if not state.get("Running"):
            raise SandboxError("its container is not running")
        self._alive = (time.monotonic(), True)
        host_info = {**read_json(placement.run_dir / CONNECTION_FILE), "ip": str(placement.run_dir / "k")}
        self._channel = KernelChannel(host_info, placement.run_dir, self.is_alive)
        await self._connect_or_detach(self._channel.connect(min(self.settings.start_timeout_s, 10)))
        return self

    def locator(self) -> KernelLocator:
        """Its container, for another worker to find it."""
        return KernelLocator(container=self._container.id if self._container is not None else None)

    async def detach(self) -> None:
        """Close this client's connection; the container keeps running."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    # -- lifecycle ---------------------------------------------------------------
    def _check_shared(self) -> None:
        """With `sandbox.shared_dir` set (the app runs in a container), the directories handed
        to the engine must lie under it: the engine resolves them on its own host."""
        shared = self.settings.shared_dir
        if not shared:
            return
        root = Path(shared).resolve()
        for what, path in (("data slot", self.placement.data_dir), ("socket directory", self.placement.run_dir)):
            if not path.resolve().is_relative_to(root):
                raise SandboxUnavailable(
                    f"the kernel's {what} {path} is outside sandbox.shared_dir {root}, the directory the "
                    "Docker engine sees at the same path; set sandbox.run_dir to a directory under it "
                    "(socket paths must stay under ~100 characters, so keep the data directory path short)")

    def _run_container(self) -> Any:
        """Create and start the kernel's container as a uid of its own, with its socket dir, key
        and /data slot opened to that uid (and the app) only. Another kernel may draw the same
        uid at the same moment: the younger container then gives it up and draws again."""
        self._check_shared()
        sandbox = self.sandbox
        try:
            confinement = sandbox.confinement
            profile = confinement.seccomp_profile()
            for _ in range(UID_ATTEMPTS):
                uid = confinement.draw_uid()
                self._prepare_dirs(uid)
                container = sandbox.client.containers.create(**self._container_options(uid, profile))
                if confinement.uid_clash(container, uid):
                    container.remove(force=True)
                    continue
                self.uid = uid
                try:
                    container.start()
                except BaseException:
                    container.remove(force=True)
                    raise
                return container
        except ConfinementError as exc:
            raise SandboxUnavailable(str(exc)) from None
        raise SandboxUnavailable(f"no free kernel uid after {UID_ATTEMPTS} draws (sandbox.docker_uid_count)")

    def _prepare_dirs(self, uid: int) -> None:
        """A fresh connection file (HMAC key) in a socket dir that only the app and `uid` can enter."""
        p = self.placement
        self._dirs = KernelDirs(p.run_dir, p.data_dir, uid)
        self._dirs.prepare_run_dir()
        write_connection_file(p.run_dir, f"{KERNEL_DIR}/k")
        self._dirs.grant_files(p.run_dir / CONNECTION_FILE)

    def _container_options(self, uid: int, seccomp: str) -> dict[str, Any]:
        s, p = self.settings, self.placement
        return dict(
            image=s.image,
            command=[*LAUNCH, "python", "-m", "ipykernel_launcher", "-f", f"{KERNEL_DIR}/{CONNECTION_FILE}",
                     *IPYKERNEL_ARGS],
            name=f"datadesk-{p.kernel_id}",
            labels={**self.sandbox.labels(p.kernel_id), UID_LABEL: str(uid)},
            network_mode="none",
            read_only=True,
            tmpfs={
                "/tmp": f"size={s.tmp_mb}m,mode=1777",
                "/home/sandbox": f"size=64m,uid={uid},gid={uid},mode=0700",
                "/outputs": f"size={s.outputs_mb}m,uid={uid},gid={uid},mode=0755",
            },
            volumes={str(p.data_dir): {"bind": "/data", "mode": "ro"},
                     str(p.run_dir): {"bind": KERNEL_DIR, "mode": "rw"}},
            working_dir="/outputs",
            user=f"{uid}:{uid}",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", f"seccomp={seccomp}"],
            pids_limit=s.pids_limit,
            mem_limit=f"{s.memory_mb}m",
            memswap_limit=f"{s.memory_mb}m",
            nano_cpus=int(s.cpus * 1e9),
            init=True,
            environment=dict(ENV),
            ipc_mode="private",
            stdin_open=False,
        )

    def _seal(self) -> None:
        """The kernel answered: once its sockets are bound it may create nothing more in its socket
        dir (so code cannot write to the host disk there)."""
        deadline = time.monotonic() + 2.0
        while not all(os.path.exists(s) for s in socket_paths(self.placement.run_dir)):
            if time.monotonic() > deadline:
                break  # the channels in use answered; a late heartbeat socket is not needed
            time.sleep(0.005)
        if self._dirs is not None:
            self._dirs.seal()

    async def start(self) -> None:
        t0 = time.monotonic()
        self._attached = False  # a container this worker starts is its own
        creating = asyncio.ensure_future(asyncio.to_thread(self._run_container))
        try:
            self._container = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # cancelled (e.g. app shutdown) while the engine creates the container: the thread
            # still finishes; remove what it made, or the container would leak
            try:
                made = await creating
                await asyncio.to_thread(made.remove, force=True)
            except Exception:
                pass
            raise
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxUnavailable(f"could not start a sandbox container: {exc}") from None
        host_info = {**read_json(self.placement.run_dir / CONNECTION_FILE), "ip": str(self.placement.run_dir / "k")}
        self._alive = (0.0, True)
        try:
            self._pid = int((await asyncio.to_thread(self._state)).get("Pid") or 0)
        except Exception:
            self._pid = 0
        self._pid_visible = _is_container_process(self._pid, self._container.id)
        self._channel = KernelChannel(host_info, self.placement.run_dir, self.is_alive)
        try:
            await self._channel.connect(self.settings.start_timeout_s)
            await asyncio.to_thread(self._seal)
        except BaseException as exc:
            logs = await asyncio.to_thread(self._logs)
            await self.shutdown()
            if isinstance(exc, SandboxError):
                raise SandboxError(f"{exc}" + (f"\nkernel log:\n{logs}" if logs else "")) from None
            raise
        self.started_at = time.time()
        log.info("docker kernel %s ready in %.2f s", self.placement.kernel_id, time.monotonic() - t0)

    def _logs(self) -> str:
        try:
            return self._container.logs(tail=10).decode("utf-8", "replace")[-1500:]
        except Exception:
            return ""

    async def shutdown(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
        container, self._container = self._container, None
        if container is not None:
            try:
                await asyncio.to_thread(container.remove, force=True)
            except Exception as exc:
                if type(exc).__name__ != "NotFound":
                    log.warning("could not remove container of kernel %s: %s", self.placement.kernel_id, exc)
        self._alive = (time.monotonic(), False)
        self._pid_visible = False

    async def restart(self) -> None:
        await self.shutdown()
        shutil.rmtree(self.placement.outputs_dir, ignore_errors=True)
        self.placement.outputs_dir.mkdir(parents=True, exist_ok=True)
        await self.start()

    def _state(self) -> dict[str, Any]:
        self._container.reload()
        return self._container.attrs.get("State", {})

    async def is_alive(self) -> bool:
        if self._container is None:
            return False
        if self._pid_visible:
            # same host: the container's init (which exits with the kernel) is a process we
            # can see; a stat instead of an engine call on every execution
            return os.path.exists(f"/proc/{self._pid}")
        checked, alive = self._alive
        if time.monotonic() - checked < ALIVE_CACHE_S:
            return alive
        try:
            state = await asyncio.to_thread(self._state)
            alive = bool(state.get("Running")) and not state.get("Paused")
        except Exception:
            alive = False
        self._alive = (time.monotonic(), alive)
        return alive

    async def death_reason(self) -> str:
        if self._container is None:
            return "the kernel is not running"
        try:
            state = await asyncio.to_thread(self._state)
        except Exception:
            return "its container is gone (removed from outside)"
        if state.get("OOMKilled"):
            return f"killed: out of memory (the limit is {self.settings.memory_mb} MB)"
        if state.get("Running"):
            return "the kernel process stopped answering"
        code = state.get("ExitCode")
        if code == 137:
            return "killed (SIGKILL) from outside the kernel"
        return f"the kernel process exited with code {code}"

    # -- running code ----------------------------------------------------------------
    async def interrupt(self) -> None:
        if self._channel is not None:
            await self._channel.interrupt()

    async def execute(self, code: str, timeout_s: float, *, on_output: OnOutput | None = None,
                      on_status: OnStatus | None = None) -> ExecutionResult:
        if self._channel is None or not await self.is_alive():
            return ExecutionResult(status="died", note=f"the kernel is not running ({await self.death_reason()})")
        self._alive = (time.monotonic(), True)
        result = await self._channel.run(code, timeout_s, self.interrupt, on_output=on_output, on_status=on_status)
        if result.status == "died":
            self._alive = (0.0, False)
            result.note = f"the kernel died ({await self.death_reason()})"
        elif result.status == "timeout" and not self._channel.settled:
            tell_status(on_status, "the code did not stop after the interrupt: restarting the kernel")
            await self.restart()
            result.note = "the kernel did not stop after the interrupt and was restarted; variables are gone"
        return result

    def outputs_root(self) -> str | None:
        """/outputs is a tmpfs inside the container: reachable through the container's mount
        namespace (/proc/<pid>/root) when the app runs on the same host with the rights to
        see it. Read with files.read_new_outputs, which never follows a link."""
        pid = self._pid
        if not pid:
            return None
        root = f"/proc/{pid}/root/outputs"
        return root if self._pid_visible and os.access(root, os.R_OK | os.X_OK) else None

    async def read_outputs(self, seen: dict[str, tuple[int, int]], max_bytes: int,
                           files: Any = None) -> tuple[list[OutputFile], list[str]] | None:
        root = self.outputs_root()
        if root is not None:
            return await super().read_outputs(seen, max_bytes)
        if self._container is None:
            return None
        # no lock of its own: the registry reads outputs while the execution holds the kernel
        return await asyncio.to_thread(self._read_outputs_exec, seen, max_bytes)

    def _read_outputs_exec(self, seen: dict[str, tuple[int, int]],
                           max_bytes: int) -> tuple[list[OutputFile], list[str]]:
        """/outputs through `docker exec` in the kernel container, as the sandbox user: a `find`
        listing, then a tar of only the new or changed regular files; both are untrusted."""
        listing, cut = self._exec_bytes(["find", "/outputs", "-mindepth", "1", "-maxdepth", str(MAX_DEPTH + 1),
                                         "-printf", LISTING_FORMAT], LISTING_MAX_BYTES)
        if cut:  # drop the entry the cap split
            listing = listing.rpartition(b"\0")[0]
        wanted, problems = plan_outputs(listing, seen, max_bytes, max_depth=MAX_DEPTH)
        if cut:
            problems.append(f"/outputs holds too many entries: only the first {LISTING_MAX_BYTES >> 20} MB "
                            "of its listing were looked at")
        if not wanted:
            return [], problems
        names = ["./" + w.relpath for w in wanted]
        chunks = self._exec_stream(["tar", "-C", "/outputs", "--no-recursion", "--hard-dereference",
                                    "-b", "128", "-cf", "-", "--", *names])
        found, more = read_outputs_tar(chunks, wanted, seen, max_bytes)
        return found, problems + more

    def _exec_stream(self, cmd: list[str]):
        """stdout of `cmd` run in the kernel container as the sandbox user, in chunks (stderr is
        logged at debug level); bounded in time by coreutils' `timeout`."""
        api = self.sandbox.client.api
        uid = self.uid or LEGACY_UID
        exec_id = api.exec_create(self._container.id, ["timeout", str(EXEC_TIMEOUT_S), *cmd],
                                  user=f"{uid}:{uid}", stdout=True, stderr=True)["Id"]
        stream = api.exec_start(exec_id, stream=True, demux=True)
        err = b""
        try:
            for out, errchunk in stream:
                if errchunk and len(err) < 4096:
                    err += errchunk
                if out:
                    yield out
        finally:
            stream.close()
            if err:
                log.debug("kernel %s: %s: %s", self.placement.kernel_id, cmd[0], err[:4096].decode("utf-8", "replace"))

    def _exec_bytes(self, cmd: list[str], limit: int) -> tuple[bytes, bool]:
        """At most `limit` bytes of the stdout of `cmd`; True when there was more."""
        buf = bytearray()
        for chunk in self._exec_stream(cmd):
            buf += chunk
            if len(buf) > limit:
                return bytes(buf[:limit]), True
        return bytes(buf), False


def _is_container_process(pid: int, container_id: str) -> bool:
    """Whether `pid` (the engine's view) is that container's process in our own view too. An
    app in a container has its own pid namespace, where the number may be another process."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            return container_id.encode() in f.read(65536)
    except OSError:
        return False


