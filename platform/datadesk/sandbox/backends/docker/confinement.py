"""Who can reach a docker kernel, and what the kernel may ask of the host's kernel.

- **seccomp**: `sandbox_image/seccomp.json`, Docker's default allow-list made stricter (no
  ptrace, personality, keyctl, bpf, userfaultfd, perf_event_open, mount family, namespaces,
  io_uring ...; refused calls fail with EPERM; the 32-bit ABIs are not in the filter at all, so
  such a call ends the process with SIGSYS). The image build stores it in the
  image as the label `SECCOMP_LABEL`, so the app applies exactly the profile its image was
  built with, also where it runs from a wheel without the checkout (docker compose).
- **kernel identity**: every kernel container runs as its own uid = gid, drawn from
  `[sandbox.docker_uid_base, + sandbox.docker_uid_count)`, a range no host account uses
  (checked against the account database, /etc/subuid and /etc/subgid). The engine's container
  list is the allocation table (label `UID_LABEL`): a removed container frees its uid, and no
  file or lock is left to clean up.
- **the socket directory**: owned by the app, mode 0700, plus POSIX ACLs naming the kernel's uid
  (the owner of a directory may grant any uid, so this works whether the app runs as root or
  not). While the kernel starts it may create entries (its five ZMQ sockets); a default ACL
  gives the app's uid read-write on them, so the app connects without sharing a group with the
  kernel. Once the kernel answers, the directory is sealed: the kernel keeps read access and
  can create nothing more, so no byte of user code reaches the host disk there. Every other
  host account is refused at the directory (no `x`), whatever the sockets' own modes.
  Without ACL support (a file system mounted `noacl`), a root app falls back to ownership
  `root:<kernel gid>` 0770, sealed to 0750; a non-root app is refused with the reason.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import random
import stat
import struct
from pathlib import Path
from typing import Any, Callable

SECCOMP_LABEL = "org.datadesk.sandbox.seccomp"
UID_LABEL = "datadesk.uid"

# <linux/posix_acl_xattr.h>: a version header, then (tag u16, perm u16, id u32) entries sorted by tag, id
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
ACCESS_ACL = "system.posix_acl_access"
DEFAULT_ACL = "system.posix_acl_default"
R, W, X = 4, 2, 1


class ConfinementError(RuntimeError):
    """The kernel cannot be confined as required here; the message says why and what to do."""


# -- seccomp ----------------------------------------------------------------------------

def load_profile(text: str, source: str) -> str:
    """`text` checked to be a seccomp profile that refuses by default; returned compact."""
    try:
        profile = json.loads(text)
    except ValueError as exc:
        raise ConfinementError(f"the seccomp profile in {source} is not JSON: {exc}") from None
    if not isinstance(profile, dict) or profile.get("defaultAction") not in ("SCMP_ACT_ERRNO", "SCMP_ACT_KILL",
                                                                              "SCMP_ACT_KILL_PROCESS"):
        raise ConfinementError(f"the seccomp profile in {source} does not refuse unlisted system calls")
    return json.dumps(profile, separators=(",", ":"))


def image_profile(labels: dict[str, str] | None, image: str) -> str:
    """The seccomp profile an image was built with (its label), compact."""
    text = (labels or {}).get(SECCOMP_LABEL)
    if not text:
        raise ConfinementError(f"the sandbox image {image} carries no seccomp profile (built before it "
                               "existed): rebuild it with `datadesk sandbox build`")
    return load_profile(text, f"the label {SECCOMP_LABEL} of {image}")


# -- kernel uids --------------------------------------------------------------------------

def _subordinate_ranges(path: str) -> list[tuple[str, int, int]]:
    """(owner, first, count) of /etc/subuid or /etc/subgid; [] when missing."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def id_range_conflicts(base: int, count: int) -> list[str]:
    """Accounts, groups and subordinate id ranges of this system inside [base, base + count)."""
    end = base + count
    found = [f"user {p.pw_name} (uid {p.pw_uid})" for p in pwd.getpwall() if base <= p.pw_uid < end]
    found += [f"group {g.gr_name} (gid {g.gr_gid})" for g in grp.getgrall() if base <= g.gr_gid < end]
    for path in ("/etc/subuid", "/etc/subgid"):
        for owner, first, n in _subordinate_ranges(path):
            if first < end and base < first + n:
                found.append(f"{path} range {first}-{first + n - 1} of {owner}")
    return found


def check_id_range(base: int, count: int) -> None:
    """Raise ConfinementError unless [base, base + count) is a usable range of kernel ids."""
    if count < 1 or base < 65536 or base + count > 2**31:
        raise ConfinementError(f"sandbox.docker_uid_base={base} / docker_uid_count={count}: the kernel ids "
                               "must lie within 65536 .. 2^31-1, above every regular and system account")
    clash = id_range_conflicts(base, count)
    if clash:
        raise ConfinementError(f"kernel ids {base}-{base + count - 1} (sandbox.docker_uid_base, docker_uid_count) "
                               f"are used on this system: {', '.join(clash[:5])}; choose a free range")


def pick_uid(taken: set[int], base: int, count: int) -> int:
    """A random id of the range that no live kernel container uses."""
    if len(taken) < count // 2:
        while True:
            uid = base + random.randrange(count)
            if uid not in taken:
                return uid
    free = [u for u in range(base, base + count) if u not in taken]
    if not free:
        raise ConfinementError(f"all {count} kernel ids (sandbox.docker_uid_count) are in use")
    return random.choice(free)


def container_uid(attrs: dict[str, Any]) -> int | None:
    """The kernel uid of a container (from its label, else its configured user), from inspect data."""
    config = attrs.get("Config") or {}
    label = (config.get("Labels") or attrs.get("Labels") or {}).get(UID_LABEL, "")
    user = str(config.get("User") or "").partition(":")[0]
    for text in (label, user):
        if text.isdigit():
            return int(text)
    return None


class EngineConfinement:
    """Per engine connection: the image's seccomp profile and the drawing of kernel uids."""

    def __init__(self, client: Callable[[], Any], settings: Any) -> None:
        self._client = client
        self.image = settings.image
        self.base = settings.docker_uid_base
        self.count = settings.docker_uid_count
        self._profile: tuple[str, str] | None = None  # (image id, compact profile)
        self._ids_checked = False

    def seccomp_profile(self) -> str:
        """The seccomp profile the configured image was built with (parsed once per image id)."""
        image = self._client().images.get(self.image)
        if self._profile is None or self._profile[0] != image.id:
            self._profile = (image.id, image_profile(image.labels, self.image))
        return self._profile[1]

    def _containers(self, label: str) -> list[Any]:
        return self._client().containers.list(all=True, sparse=True, filters={"label": [label]})

    def draw_uid(self) -> int:
        """A uid of the range that no kernel container on this engine (of any data dir) holds."""
        if not self._ids_checked:
            check_id_range(self.base, self.count)
            self._ids_checked = True
        taken = set()
        for c in self._containers("datadesk.sandbox=1"):
            uid = (c.attrs.get("Labels") or {}).get(UID_LABEL, "")
            if uid.isdigit():
                taken.add(int(uid))
        return pick_uid(taken, self.base, self.count)

    def uid_clash(self, mine: Any, uid: int) -> bool:
        """Whether an older container (by creation time, then id) holds `uid` too: the younger
        one gives it up, so two kernels drawing at the same moment never share a uid."""
        own, others = None, []
        for c in self._containers(f"{UID_LABEL}={uid}"):
            key = (int(c.attrs.get("Created") or 0), c.id)
            if c.id == mine.id:
                own = key
            else:
                others.append(key)
        return own is not None and any(k < own for k in others)


# -- POSIX ACLs ---------------------------------------------------------------------------

def _acl(owner: int, users: dict[int, int], other: int = 0) -> bytes:
    """An ACL xattr value: owner perms, named users' perms, no group, a mask covering the users."""
    mask = 0
    for perm in users.values():
        mask |= perm
    entries = [(_USER_OBJ, owner, _NO_ID), *((_USER, p, uid) for uid, p in sorted(users.items())),
               (_GROUP_OBJ, 0, _NO_ID)]
    if users:
        entries.append((_MASK, mask, _NO_ID))
    entries.append((_OTHER, other, _NO_ID))
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def _acl_unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def _set_acl(path: Path, value: bytes, default: bool = False) -> None:
    os.setxattr(path, DEFAULT_ACL if default else ACCESS_ACL, value, follow_symlinks=False)


def read_acl(path: Path, default: bool = False) -> dict[tuple[str, int | None], int]:
    """The ACL of `path` as {(tag, id): perm} (tags user_obj, user, group_obj, mask, other); {} when none."""
    try:
        raw = os.getxattr(path, DEFAULT_ACL if default else ACCESS_ACL, follow_symlinks=False)
    except OSError:
        return {}
    names = {_USER_OBJ: "user_obj", _USER: "user", _GROUP_OBJ: "group_obj", _MASK: "mask", _OTHER: "other"}
    out: dict[tuple[str, int | None], int] = {}
    for off in range(4, len(raw), 8):
        tag, perm, ident = struct.unpack_from("<HHI", raw, off)
        out[(names.get(tag, hex(tag)), None if ident == _NO_ID else ident)] = perm
    return out


class KernelDirs:
    """The host directories a kernel container gets, opened to its uid and to nobody else.

    Before the container starts: `prepare_run_dir` (the socket dir, writable by the kernel),
    then the connection file is written and `grant_files` makes it and the /data slot
    readable by the kernel; `seal` once the kernel has bound its sockets.
    """

    def __init__(self, run_dir: Path, data_dir: Path, uid: int) -> None:
        self.run_dir = Path(run_dir)
        self.data_dir = Path(data_dir)
        self.uid = uid
        self.app_uid = os.geteuid()
        self.acls = True

    def prepare_run_dir(self) -> None:
        """Before the connection file is written: only the app and the kernel can enter."""
        d = self.run_dir
        d.mkdir(parents=True, exist_ok=True)
        _refuse_link(d)
        os.chmod(d, 0o700)
        try:
            _set_acl(d, _acl(R | W | X, {self.uid: R | W | X}))
            # sockets the kernel binds here: owner the kernel, read-write for the app (connect)
            _set_acl(d, _acl(R | W | X, {self.app_uid: R | W | X}), default=True)
        except OSError as exc:
            if not _acl_unsupported(exc):
                raise
            self.acls = False
            self._kernel_group(d, 0o770)

    def grant_files(self, connection_file: Path) -> None:
        """The connection file (the HMAC key) readable by the kernel; the /data slot listable."""
        if self.acls:
            _set_acl(connection_file, _acl(R | W, {self.uid: R}))
        else:
            os.chown(connection_file, 0, self.uid)
            os.chmod(connection_file, 0o640)
        d = self.data_dir
        d.mkdir(parents=True, exist_ok=True)
        _refuse_link(d)
        os.chmod(d, 0o700)
        try:
            _set_acl(d, _acl(R | W | X, {self.uid: R | X}))
        except OSError as exc:
            if not _acl_unsupported(exc):
                raise
            self._kernel_group(d, 0o750)

    def seal(self) -> None:
        """The kernel has bound its sockets: it may no longer create anything in its socket dir."""
        if self.acls:
            _set_acl(self.run_dir, _acl(R | W | X, {self.uid: R | X}))
        else:
            os.chmod(self.run_dir, 0o750)

    def _kernel_group(self, d: Path, mode: int) -> None:
        """Without ACLs: `d` owned by root with the kernel's own group (only a root app can)."""
        if self.app_uid != 0:
            raise ConfinementError(
                f"the file system of {d} does not support POSIX ACLs, which a non-root app needs to open "
                "a kernel's directories to it (and only it): keep the data directory and sandbox.run_dir "
                "on ext4, xfs, btrfs or tmpfs, or run the app as root")
        os.chown(d, 0, self.uid)
        os.chmod(d, mode)


def _refuse_link(d: Path) -> None:
    if stat.S_ISLNK(os.lstat(d).st_mode):
        raise ConfinementError(f"{d} is a symbolic link: refusing to open it to a kernel")
