"""Landlock confinement of the local kernel (issue 15): the kernel may read the system and
Python installation and its thread's data, write only its outputs and run directories, and
never read or write the app's home, the app's config, or another process's /proc entry
(where the app's environment, and its LLM key, could be read).

Landlock (Linux 5.13+) is an unprivileged, stackable LSM: a process restricts itself and
every process it starts, with no root and no container engine. We call it through ctypes
(the three syscalls), in the kernel's `preexec_fn` between fork and exec:

    ruleset = landlock_create_ruleset(handled = every filesystem right this ABI knows)
    for each allowed path: landlock_add_rule(PATH_BENEATH, rights, open(path, O_PATH))
    prctl(PR_SET_NO_NEW_PRIVS); landlock_restrict_self(ruleset)

Access is allow-listed: anything not under an allowed path is denied. Landlock also
forbids ptrace of processes outside the domain (the app), and from ABI 6 we scope signals
and abstract Unix sockets to the domain, so the kernel cannot signal the app either.

`plan()` runs in the parent (it may list directories, allocate, log); `apply()` runs in the
child and only makes syscalls on the prepared data.
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same numbers on x86-64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# filesystem rights by ABI (include/uapi/linux/landlock.h)
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_ALL = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = EXECUTE | READ_FILE | READ_DIR
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/sys")  # /sys: cgroup and CPU facts (DuckDB, BLAS)
PROC_FILES = ("/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/filesystems", "/proc/sys/kernel",
              "/proc/self")  # /proc/self is resolved in the child: the kernel's own entry, no one else's
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/shm", "/dev/fd")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none: not Linux, too old, or switched off)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        value = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(value))


def _all_fs_rights(abi: int) -> int:
    rights = _ABI1_ALL
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


@dataclass(frozen=True)
class Plan:
    """What the child applies: (path, rights) rules under the handled rights of `abi`."""

    abi: int
    rules: tuple[tuple[str, int], ...]


def _within(path: Path, other: Path) -> bool:
    return path == other or other in path.parents


def _allow_except(root: Path, hidden: list[Path], rights: int, out: list[tuple[str, int]]) -> None:
    """Allow `root` with `rights`, except the hidden paths under it: then allow its entries one by
    one, descending only along the way to a hidden path (Landlock has no deny rules)."""
    inside = [h for h in hidden if _within(h, root)]
    if not inside:
        out.append((str(root), rights))
        return
    if any(h == root for h in inside):
        return
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink():
            continue  # the target is allowed (or not) on its own
        _allow_except(entry, inside, rights, out)


def plan(*, read: Iterable[Path], write: Iterable[Path], hidden: Iterable[Path],
         abi: int | None = None) -> Plan:
    """The rules for one kernel: `read` (plus the system, Python and its site-packages), `write`
    (full rights beneath), never anything inside `hidden` (the app's home and config)."""
    abi = abi_version() if abi is None else abi
    hide = [Path(os.path.realpath(h)) for h in hidden]
    every = _all_fs_rights(abi)
    rules: list[tuple[str, int]] = []
    python_dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    python_dirs.update(p for p in sys.path if p and os.path.isabs(p))
    python_dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots = {Path(os.path.realpath(p)) for p in (*SYSTEM_DIRS, *python_dirs) if os.path.exists(p)}
    for root in sorted(roots):
        _allow_except(root, hide, READ, rules)
    for path in (*PROC_FILES, *DEV_FILES):
        if os.path.exists(path):
            rules.append((path, READ | (WRITE_FILE if path.startswith("/dev") else 0)))
    for path in read:
        rules.append((str(path), READ))
    for path in write:
        rules.append((str(path), every))
    return Plan(abi=abi, rules=tuple(rules))


def apply(p: Plan) -> None:
    """Restrict this process (call in the child, before exec). Raises OSError on failure: a
    kernel must not start unconfined when confinement was asked for."""
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=_all_fs_rights(p.abi), handled_access_net=0,
                        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if p.abi >= 6 else 0)
    size = 24 if p.abi >= 6 else 16 if p.abi >= 4 else 8
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in p.rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since the plan: nothing to allow
            try:
                if not os.path.isdir(path):
                    rights &= EXECUTE | READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV  # file rules take file rights only
                rule = _PathBeneath(allowed_access=rights & attr.handled_access_fs, parent_fd=parent)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(parent)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)
