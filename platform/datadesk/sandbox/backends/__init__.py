"""The sandbox backends, one sub-package each, and the factory that picks one.

- `local/`: an ipykernel subprocess on this host, confined with Landlock
  (`process.py`, `landlock.py`); for a single trusted user.
- `docker/`: one locked-down container per kernel (`container.py`), who may
  reach it and its seccomp profile (`confinement.py`), and the kernel image
  build (`image.py`).
- `gateway/`: kernels on a Jupyter Kernel / Enterprise Gateway (`remote.py`),
  their websocket (`channel.py`), settings and path mapping (`config.py`).

`sandbox_backend` is the one place that knows which `SandboxBackend` each
`sandbox.backend` setting names; everything else talks to the registry, or to
the backend through the protocol in `sandbox/base.py`. Everything is imported
only when chosen: docker and gateway bring their own clients, and the image
build (`python -m datadesk.sandbox.backends.docker.image`) runs from a plain
checkout with the standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datadesk.sandbox.base import SandboxBackend
    from datadesk.sandbox.registry import KernelRegistry
    from datadesk.settings import SandboxSettings, Settings
    from datadesk.store.interfaces.kernels import KernelTable, WorkerRegistry
    from datadesk.store.layout import Layout


def sandbox_backend(settings: SandboxSettings, home: Path, cluster: bool = False) -> SandboxBackend:
    """The backend `settings.backend` names (`local`, `docker` or `gateway`); ValueError otherwise.
    `cluster`: the kernel table is shared by several hosts and there is an object store."""
    if settings.backend == "local":
        from datadesk.sandbox.backends.local.process import LocalSandbox

        return LocalSandbox(settings, home)  # home: users.json, read at every kernel start
    if settings.backend == "docker":
        from datadesk.sandbox.backends.docker.container import DockerSandbox

        return DockerSandbox(settings, home)
    if settings.backend == "gateway":
        from datadesk.sandbox.backends.gateway.remote import GatewaySandbox

        return GatewaySandbox(settings, home, cluster)  # checks the gateway_* settings (SettingsError)
    raise ValueError(f"sandbox.backend must be local, docker, gateway or none, not {settings.backend!r}")


def build_kernel_registry(settings: Settings, layout: Layout, table: KernelTable | None = None,
                          workers: WorkerRegistry | None = None) -> KernelRegistry:
    """The kernel registry for the configured backend (`local`, `docker` or `gateway`), over the
    kernel table and heartbeats given (cluster/kernels.py `build_kernels`), else this home's files."""
    from datadesk.sandbox.registry import KernelRegistry

    cluster = table is not None
    return KernelRegistry(settings.sandbox, layout.home, sandbox_backend(settings.sandbox, layout.home, cluster),
                          table=table, workers=workers)
