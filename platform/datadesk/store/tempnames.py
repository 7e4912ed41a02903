"""Temp names that carry their owner, so a dead process's leftovers can go at once.

Every temp file or folder the app writes into the data directory is named
`.<name>.~<host>-<pid>-<start>~.<random>.tmp`: the host (a short hash of its name), the pid
and that process's start time (clock ticks since boot, /proc/<pid>/stat field 22, so a
reused pid is not taken for the owner). The start-up sweep removes an entry whose owner on
this host no longer runs, whatever its age; an entry of a live owner, of another host or
without a tag (older versions) goes only after an hour without a write.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path

_TAG = re.compile(r"~([0-9a-f]{6})-(\d{1,10})-(\d{1,20})~")


def _stat_fields(pid: object) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state first), or [] when none."""
    try:
        n = int(pid)  # type: ignore[call-overload]
    except (TypeError, ValueError):  # from a marker file or a name: anything
        return []
    if n <= 0:
        return []
    try:
        raw = Path(f"/proc/{n}/stat").read_bytes()
    except OSError:
        return []
    # the command name may hold spaces and parentheses: fields start after the last ')'
    return raw[raw.rfind(b")") + 2:].split()


def _start_of(fields: list[bytes]) -> int | None:
    try:
        return int(fields[19])  # field 22: start time in clock ticks since boot
    except (IndexError, ValueError):
        return None


def proc_start(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    return _start_of(_stat_fields(pid))


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """True while `pid` runs (not a zombie) and, given `start`, is still that same process."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    return start is None or _start_of(fields) == start


def host_hash() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


_tag_cache: tuple[int, str] | None = None


def owner_tag() -> str:
    """`~<host>-<pid>-<start>~` of this process (made again after a fork)."""
    global _tag_cache
    pid = os.getpid()
    if _tag_cache is None or _tag_cache[0] != pid:
        _tag_cache = (pid, f"~{host_hash()}-{pid}-{proc_start(pid) or 0}~")
    return _tag_cache[1]


def temp_prefix(name: str) -> str:
    """The prefix of a temp entry for `name` (pass it to tempfile.mkstemp/mkdtemp with suffix '.tmp')."""
    return f".{name}.{owner_tag()}."


def owner_dead(name: str) -> bool:
    """True when `name` carries the tag of a process of this host that no longer runs."""
    m = _TAG.search(name)
    if m is None or m.group(1) != host_hash():
        return False
    start = int(m.group(3)) or None
    return not pid_alive(int(m.group(2)), start)
