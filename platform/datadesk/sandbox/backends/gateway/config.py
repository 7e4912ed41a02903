"""The gateway backend's settings, the path mapping between app and kernels, and its proof.

`GatewayConfig` holds the `sandbox.gateway_*` settings, checked (`from_settings`
names the bad one); `http_problem` / `status_problem` word a failed request
to the gateway for the user (naming the setting to fix, the token scrubbed).

Files: the kernel's slot (`/data` links and `/outputs`, under the app's
home, see `KernelRegistry._placement`) must sit on a volume the kernels
mount too (e.g. a ReadWriteMany volume in every kernel pod). The app sees it
at `sandbox.gateway_shared_dir`, kernels at `sandbox.gateway_kernel_shared_dir`;
a slot path maps by swapping that prefix (`GatewayConfig.kernel_path`). Each
start proves the mapping (`prove_mapping`): the app writes a random probe
file into the slot and the kernel must read it back and be able to write its
outputs dir, else the start fails saying which setting to fix.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import httpx

from datadesk.sandbox.base import SandboxUnavailable
from datadesk.settings import SandboxSettings, SettingsError

if TYPE_CHECKING:
    from datadesk.sandbox.execution import OnTimeout
    from datadesk.sandbox.backends.gateway.channel import GatewayChannel

PROBE_FILE = ".datadesk-probe"

_KERNEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENV_NAME_RE = re.compile(r"KERNEL_[A-Z0-9_]{1,64}")
# kernel-side paths go into Python string literals and pod templates: keep them plain
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9._/@+-]*")
_RESERVED_ENV = ("KERNEL_DATADESK_", "KERNEL_WORKING_DIR")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class GatewayConfig:
    """The `sandbox.gateway_*` settings, checked (`from_settings` names the bad one)."""

    url: str  # http(s)://host[:port][/base], no trailing slash
    token: str
    kernel_name: str
    shared_dir: Path  # app side, resolved
    kernel_shared_dir: PurePosixPath  # kernel side
    kernel_env: dict[str, str]
    presigned: bool = False  # files through presigned URLs of the object store, no shared volume
    kernel_files_dir: str = ""  # presigned: kernel-side root of each kernel's data/ and outputs/

    @classmethod
    def from_settings(cls, sb: SandboxSettings, home: Path, cluster: bool = False) -> "GatewayConfig":
        """`cluster`: the app runs on the cluster set (there is an object store to presign)."""
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
        presigned, files_dir = _files_mode(sb, cluster)
        return cls(url=url, token=token, kernel_name=sb.gateway_kernel_name, shared_dir=shared,
                   kernel_shared_dir=PurePosixPath(kernel_side), kernel_env=env, presigned=presigned,
                   kernel_files_dir=files_dir)

    def kernel_dirs(self, slot: str) -> tuple[str, str]:
        """Presigned mode: where the kernel of `slot` keeps its data and outputs, on its side."""
        if not self.kernel_files_dir:
            return "/data", "/outputs"
        root = PurePosixPath(self.kernel_files_dir) / slot
        return str(root / "data"), str(root / "outputs")

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


def _files_mode(sb: SandboxSettings, cluster: bool) -> tuple[bool, str]:
    """(presigned?, kernel-side files root) from `sandbox.gateway_files`, checked."""
    mode = sb.gateway_files
    if mode not in ("auto", "volume", "presigned"):
        raise SettingsError(f'sandbox.gateway_files must be "auto", "volume" or "presigned", not {mode!r}')
    presigned = mode == "presigned" or (mode == "auto" and cluster and not sb.gateway_shared_dir)
    if presigned and not cluster:
        raise SettingsError('sandbox.gateway_files = "presigned" hands kernels presigned URLs of the object '
                            'store: it needs the cluster set (cluster.database_url and storage.url); '
                            'use "volume" with a shared volume otherwise')
    root = sb.gateway_kernel_files_dir.rstrip("/") if sb.gateway_kernel_files_dir != "/" else "/"
    if root and (not _SAFE_PATH_RE.fullmatch(root) or ".." in root.split("/")):
        raise SettingsError(f"sandbox.gateway_kernel_files_dir must be an absolute path of letters, digits "
                            f"and . _ - @ + / (no '..'), not {sb.gateway_kernel_files_dir!r}")
    return presigned, root


def http_problem(cfg: GatewayConfig, exc: Exception) -> str:
    return cfg.scrub(f"the Jupyter gateway at {cfg.url} is not reachable: {type(exc).__name__}: {exc}")


def status_problem(cfg: GatewayConfig, response: httpx.Response, what: str) -> str:
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

# --------------------------------------------------------------------------- the probe

# how every setup cell ends (this one and transfer.py's): cwd = the outputs dir, plain tracebacks
ENTER_OUTPUTS = """    os.chdir(outputs)
    ip = get_ipython()
    for magic, arg in (("xmode", "Plain"), ("colors", "nocolor")):
        try:
            ip.run_line_magic(magic, arg)
        except Exception:
            pass
"""

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
""" + ENTER_OUTPUTS + """_datadesk_setup({data!r}, {outputs!r}, {probe!r}, {expected!r})
del _datadesk_setup
"""


async def prove_mapping(channel: GatewayChannel, config: GatewayConfig, data_dir: Path, kernel_data: str,
                        kernel_outputs: str, timeout_s: float, interrupt: OnTimeout) -> None:
    """Prove the path mapping (the kernel reads the app's probe file, can write its outputs dir),
    then cwd = outputs and plain tracebacks. Raises SandboxUnavailable naming the settings."""
    probe = data_dir / PROBE_FILE
    expected = secrets.token_hex(16)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(expected)
    try:
        code = SETUP_CODE.format(data=kernel_data, outputs=kernel_outputs, probe=PROBE_FILE, expected=expected)
        result = await channel.run(code, timeout_s, interrupt, silent=True)
    finally:
        probe.unlink(missing_ok=True)
    if result.status != "ok":
        why = f"{result.error.evalue}" if result.error else f"the setup code ended with status {result.status}"
        raise SandboxUnavailable(
            f"the gateway kernel does not see the app's files at the mapped path: {why}. The app's "
            f"{config.shared_dir} (sandbox.gateway_shared_dir) must be the same volume the kernel sees at "
            f"{config.kernel_shared_dir} (sandbox.gateway_kernel_shared_dir), writable for the kernel's user")
