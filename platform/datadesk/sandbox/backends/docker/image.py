"""Build the kernel image for the docker sandbox backend (DESIGN.md section 7).

    python -m datadesk.sandbox.backends.docker.image [--force] [--base IMAGE] [--print-tag]
    sandbox_image/build.sh [same options]

The image is built without any network inside Docker:

1. its tag is ``datadesk-sandbox:<12 hex>``, a hash of the Dockerfile, the
   wheel lock (requirements.txt), .dockerignore, the seccomp profile and the
   build constants below; when that tag exists the build is skipped (well
   under a second);
2. the pinned wheels for CPython 3.11 / manylinux x86_64 are fetched on the
   host with ``pip download`` into ``sandbox_image/wheels/`` (offline when
   they are all there already);
3. the base image is ``--base``, else ``python:3.11-slim`` when present or
   pullable, else ``datadesk-base:bookworm``, made once with
   ``debootstrap --variant=minbase`` + ``docker import`` (needs root);
4. ``docker build`` (classic builder, through the Docker API) tags the result
   and ``datadesk-sandbox:latest``. The seccomp profile kernels run under
   (``sandbox_image/seccomp.json``) goes into the image as the label
   ``org.datadesk.sandbox.seccomp`` (compact JSON): the app applies the
   profile its image was built with, also when it has no checkout.

Standard library + the ``docker`` SDK (imported lazily). Nothing from the rest
of datadesk is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

# ------------------------------------------------------------------ constants
# Everything here that changes what ends up in the image is part of the tag.

IMAGE_NAME = "datadesk-sandbox"
LATEST_TAG = f"{IMAGE_NAME}:latest"
DEFAULT_BASE = "python:3.11-slim"
FALLBACK_BASE = "datadesk-base:bookworm"
PYTHON_VERSION = "3.11"  # the base's python must match the wheels
WHEEL_PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_28_x86_64",
)
WHEEL_ABIS = ("cp311", "abi3", "none")
LAYOUT_VERSION = 1  # bump when the build logic changes the image
SECCOMP_FILE = "seccomp.json"  # the kernels' seccomp profile (see confinement.py)
HASHED_FILES = ("Dockerfile", "requirements.txt", ".dockerignore", SECCOMP_FILE)

DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv")
DEBIAN_DEFAULT_MIRROR = "http://deb.debian.org/debian"

PULL_TIMEOUT_S = 15
LABEL_PREFIX = "org.datadesk.sandbox"
SECCOMP_LABEL = f"{LABEL_PREFIX}.seccomp"

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """A build step failed; the message says what to do."""


# ---------------------------------------------------------------------- paths


def default_context_dir() -> Path:
    """``sandbox_image/`` of the source checkout this module lives in."""
    env = os.environ.get("DATADESK_SANDBOX_CONTEXT")
    if env:
        return Path(env)
    # platform/datadesk/sandbox/backends/docker/image.py -> repo root is parents[5]
    return Path(__file__).resolve().parents[5] / "sandbox_image"


def image_tag(context_dir: Path | None = None) -> str:
    """The tag the current Dockerfile + lock + constants build to."""
    context_dir = Path(context_dir or default_context_dir())
    h = hashlib.sha256()
    for name in HASHED_FILES:
        path = context_dir / name
        h.update(name.encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except FileNotFoundError:
            if name != ".dockerignore":
                raise BuildError(f"{path} is missing: is {context_dir} the sandbox_image directory?")
        h.update(b"\0")
    constants = (PYTHON_VERSION, WHEEL_PLATFORMS, WHEEL_ABIS, LAYOUT_VERSION)
    h.update(repr(constants).encode())
    return f"{IMAGE_NAME}:{h.hexdigest()[:12]}"


# --------------------------------------------------------------------- docker


def _docker_client(timeout: int = 600):
    try:
        import docker  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise BuildError("the 'docker' Python package is missing: pip install docker") from exc
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means the same to the user
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BuildError(
            f"Docker engine not reachable at {host} ({type(exc).__name__}: {exc}). "
            "Start dockerd (e.g. `sudo systemctl start docker`, or `sudo dockerd &`), "
            "or point DOCKER_HOST at a running engine."
        ) from exc
    return client


def _image_exists(client, name: str):
    import docker.errors  # noqa: PLC0415

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None


def _python_version_of(client, image: str) -> str:
    out = client.containers.run(
        image,
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        remove=True,
        network_mode="none",
        stdout=True,
        stderr=True,
    )
    return out.decode().strip()


def _try_pull(client, image: str, log: Log) -> bool:
    """Pull ``image`` within PULL_TIMEOUT_S; False when it cannot be had."""
    repo, _, tag = image.partition(":")
    result: dict[str, Any] = {}

    def pull() -> None:
        try:
            client.api.pull(repo, tag=tag or "latest")
            result["ok"] = True
        except Exception as exc:  # noqa: BLE001
            result["error"] = exc

    log(f"[image] trying `docker pull {image}` (at most {PULL_TIMEOUT_S} s)")
    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    worker.join(PULL_TIMEOUT_S)
    if result.get("ok"):
        return True
    why = result.get("error") or "timed out"
    log(f"[image] pull failed: {str(why).splitlines()[0][:200]}")
    return False


# ------------------------------------------------------------------- wheels


def download_wheels(context_dir: Path, log: Log = print) -> Path:
    """Fetch the pinned wheels for the image's Python into context/wheels."""
    wheels = context_dir / "wheels"
    wheels.mkdir(exist_ok=True)
    req = context_dir / "requirements.txt"
    target = [
        "--only-binary=:all:",
        "--python-version", PYTHON_VERSION,
        "--implementation", "cp",
        *[a for abi in WHEEL_ABIS for a in ("--abi", abi)],
        *[a for plat in WHEEL_PLATFORMS for a in ("--platform", plat)],
        "-d", str(wheels),
        "-r", str(req),
    ]
    base = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check"]
    offline = subprocess.run(
        [*base, "--no-index", "--find-links", str(wheels), "-q", *target],
        capture_output=True,
        text=True,
    )
    if offline.returncode == 0:
        log(f"[image] wheels: all present in {wheels}")
        return wheels
    log(f"[image] wheels: pip download into {wheels}")
    proc = subprocess.run([*base, "--progress-bar", "off", *target], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(("Saved ", "File was already downloaded", "Successfully downloaded")):
            log(f"  {line}")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BuildError(f"pip download failed (is PyPI reachable from this host?):\n{tail}")
    return wheels


# ---------------------------------------------------------------- base image


def debian_mirror() -> str:
    """The Debian mirror the host's apt uses, else deb.debian.org."""
    env = os.environ.get("DATADESK_DEBIAN_MIRROR")
    if env:
        return env
    files: list[Path] = [Path("/etc/apt/sources.list")]
    d = Path("/etc/apt/sources.list.d")
    if d.is_dir():
        files += sorted(d.iterdir())
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for uri, suites in _apt_entries(text, deb822=path.suffix == ".sources"):
            if "security" in uri or not re.search(r"/debian/?$", uri):
                continue
            if any(s.split("-")[0] == DEBIAN_SUITE for s in suites) or not suites:
                return uri.rstrip("/")
    return DEBIAN_DEFAULT_MIRROR


def _apt_entries(text: str, deb822: bool) -> Iterable[tuple[str, list[str]]]:
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                k, _, v = line.partition(":")
                fields[k.strip().lower()] = v.strip()
            if "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()
    else:
        for line in text.splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                yield line[1], [line[2]]


def make_debian_base(context_dir: Path, client, log: Log = print, name: str = FALLBACK_BASE) -> str:
    """debootstrap a minimal bookworm with python3 and import it as ``name``."""
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None
    )
    if not debootstrap:
        raise BuildError(
            "no base image: python:3.11-slim is not present and cannot be pulled, and "
            "debootstrap is missing to make one. Install it (`sudo apt-get install -y "
            "debootstrap`) or pass --base IMAGE (a Debian/Ubuntu image with python3.11)."
        )
    if os.geteuid() != 0:
        raise BuildError(
            "making the base image with debootstrap needs root: run this as root "
            "(sudo -E), or pass --base IMAGE"
        )
    mirror = debian_mirror()
    rootfs = context_dir / "rootfs"
    tarball = context_dir / "rootfs.tar"
    shutil.rmtree(rootfs, ignore_errors=True)
    log(
        f"[image] base: debootstrap --variant=minbase {DEBIAN_SUITE} from {mirror} "
        "(a few minutes, once)"
    )
    t0 = time.monotonic()
    cmd = [
        debootstrap,
        "--variant=minbase",
        "--include=" + ",".join(DEBIAN_PACKAGES),
        DEBIAN_SUITE,
        str(rootfs),
        mirror,
    ]
    try:
        _run_streaming(cmd, log, every=25)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file() and p.name != "lock":
                    p.unlink()
        log(f"[image] base: importing as {name}")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
            check=True,
        )
        repo, _, tag = name.partition(":")
        client.api.import_image(
            src=str(tarball),
            repository=repo,
            tag=tag or "latest",
            changes=[
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8",
                'CMD ["/bin/bash"]',
            ],
        )
    except subprocess.CalledProcessError as exc:
        raise BuildError(f"{Path(exc.cmd[0]).name} failed with exit code {exc.returncode}") from exc
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
        tarball.unlink(missing_ok=True)
    log(f"[image] base: {name} ready ({time.monotonic() - t0:.0f} s)")
    return name


def _run_streaming(cmd: list[str], log: Log, every: int = 1) -> None:
    """Run ``cmd``, logging every ``every``-th line (and all errors)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    for n, line in enumerate(proc.stdout):
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if n % every == 0 or line.startswith(("E:", "W:")):
            log(f"  {line}")
    if proc.wait() != 0:
        log("\n".join(f"  {t}" for t in tail))
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def choose_base(context_dir: Path, client, base: str | None, log: Log = print) -> str:
    """The base image to build FROM, made or pulled as needed."""
    if base:
        if not _image_exists(client, base) and not _try_pull(client, base, log):
            raise BuildError(f"base image {base!r} is neither present nor pullable")
        chosen = base
    elif _image_exists(client, DEFAULT_BASE):
        chosen = DEFAULT_BASE
    elif _try_pull(client, DEFAULT_BASE, log):
        chosen = DEFAULT_BASE
    elif _image_exists(client, FALLBACK_BASE):
        chosen = FALLBACK_BASE
    else:
        chosen = make_debian_base(context_dir, client, log)
    version = _python_version_of(client, chosen)
    if version != PYTHON_VERSION:
        raise BuildError(
            f"base image {chosen} has python {version}, the wheels are for {PYTHON_VERSION}"
        )
    log(f"[image] base: {chosen} (python {version})")
    return chosen


# ---------------------------------------------------------------------- build


def build_image(
    context_dir: Path | None = None,
    force: bool = False,
    base: str | None = None,
    log: Log = print,
) -> str:
    """Build (or find) the kernel image; returns its tag."""
    t0 = time.monotonic()
    context_dir = Path(context_dir or default_context_dir()).resolve()
    tag = image_tag(context_dir)
    client = _docker_client()
    existing = _image_exists(client, tag)
    if existing is not None and not force:
        built_from = (existing.labels or {}).get(f"{LABEL_PREFIX}.base")
        if base is None or base == built_from:
            latest = _image_exists(client, LATEST_TAG)
            if latest is None or latest.id != existing.id:
                existing.tag(IMAGE_NAME, "latest")
            log(f"[image] {tag} is up to date")
            return tag
        log(f"[image] {tag} was built from {built_from}, rebuilding from {base}")

    log(f"[image] building {tag} from {context_dir}")
    download_wheels(context_dir, log)
    chosen = choose_base(context_dir, client, base, log)

    log(f"[image] docker build --build-arg BASE_IMAGE={chosen} -t {tag} {context_dir}")
    docker_build(client, context_dir, tag, chosen, LABEL_PREFIX, force, log, "[image]", t0,
                 extra_labels={SECCOMP_LABEL: seccomp_label(context_dir)})
    return tag


def seccomp_label(context_dir: Path) -> str:
    """The seccomp profile of the kernels, compact, for the image's label."""
    path = Path(context_dir) / SECCOMP_FILE
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path}: not a readable JSON seccomp profile ({exc})") from exc
    if not isinstance(profile, dict) or "defaultAction" not in profile:
        raise BuildError(f"{path}: not a seccomp profile (no defaultAction)")
    return json.dumps(profile, separators=(",", ":"))


def docker_build(client, context_dir: Path, tag: str, base: str, label_prefix: str, nocache: bool,
                 log: Log, prefix: str, t0: float, extra_labels: dict[str, str] | None = None) -> None:
    """`docker build --build-arg BASE_IMAGE=<base> -t <tag>` through the API (classic builder, no
    pull), its output streamed to `log`; then `<name>:latest` too. Raises BuildError naming why."""
    labels = {label_prefix: "1", f"{label_prefix}.base": base, f"{label_prefix}.tag": tag, **(extra_labels or {})}
    image_id = None
    try:
        stream = client.api.build(path=str(context_dir), tag=tag, buildargs={"BASE_IMAGE": base}, labels=labels,
                                  rm=True, forcerm=True, nocache=nocache, pull=False, decode=True, timeout=3600,
                                  use_config_proxy=False)
        for chunk in stream:
            if "error" in chunk:
                raise BuildError(f"docker build failed: {chunk['error'].strip()}")
            for line in (chunk.get("stream") or "").rstrip().splitlines():
                if line.strip():
                    log(f"  {line.rstrip()}")
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = aux["ID"]
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - API errors, tar errors ...
        raise BuildError(f"docker build failed: {type(exc).__name__}: {exc}") from exc
    image = _image_exists(client, tag)
    if image is None:
        raise BuildError(f"docker build finished but {tag} is missing (id {image_id})")
    name = tag.rsplit(":", 1)[0]
    image.tag(name, "latest")
    size_mb = (image.attrs.get("Size") or 0) / 1e6
    log(f"{prefix} built {tag} (+ {name}:latest), {size_mb:.0f} MB, in {time.monotonic() - t0:.0f} s")


def run_build_cli(build: Callable[[], str]) -> int:
    """Run a build for a command line: print the tag, or the error; exit 0, 1 or 130."""
    try:
        tag = build()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(tag)
    return 0


# ------------------------------------------------------------------------ cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m datadesk.sandbox.backends.docker.image",
        description="Build the DataDesk kernel image (datadesk-sandbox:<hash>).",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists (no layer cache)")
    parser.add_argument("--base", metavar="IMAGE", help="base image with python 3.11 (default: auto)")
    parser.add_argument(
        "--context",
        metavar="DIR",
        type=Path,
        default=None,
        help="the sandbox_image directory (default: the one of this checkout)",
    )
    parser.add_argument("--print-tag", action="store_true", help="print the tag the sources build to, and exit")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if args.print_tag:
        return run_build_cli(lambda: image_tag(args.context))
    return run_build_cli(lambda: build_image(args.context, force=args.force, base=args.base, log=log))


if __name__ == "__main__":
    sys.exit(main())
