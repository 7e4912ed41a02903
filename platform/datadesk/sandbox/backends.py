"""The configured sandbox backend (`sandbox.backend`) and the kernel registry over it.

The one place that knows which `SandboxBackend` each setting names; everything
else talks to the registry, or to the backend through the protocol in base.py.
"""

from __future__ import annotations

from pathlib import Path

from datadesk.sandbox.base import SandboxBackend
from datadesk.sandbox.registry import KernelRegistry
from datadesk.settings import SandboxSettings, Settings
from datadesk.store.layout import Layout


def sandbox_backend(settings: SandboxSettings, home: Path) -> SandboxBackend:
    """The backend `settings.backend` names (`local`, `docker` or `gateway`); ValueError otherwise.

    Each module is imported only when chosen (docker and gateway bring their own clients).
    """
    if settings.backend == "local":
        from datadesk.sandbox.local import LocalSandbox

        return LocalSandbox(settings, home)  # home: users.json, read at every kernel start
    if settings.backend == "docker":
        from datadesk.sandbox.docker import DockerSandbox

        return DockerSandbox(settings, home)
    if settings.backend == "gateway":
        from datadesk.sandbox.gateway import GatewaySandbox

        return GatewaySandbox(settings, home)  # checks the gateway_* settings (SettingsError)
    raise ValueError(f"sandbox.backend must be local, docker, gateway or none, not {settings.backend!r}")


def build_kernel_registry(settings: Settings, layout: Layout) -> KernelRegistry:
    """The kernel registry for the configured backend (`local`, `docker` or `gateway`)."""
    return KernelRegistry(settings.sandbox, layout.home, sandbox_backend(settings.sandbox, layout.home))
