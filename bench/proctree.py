"""A process tree's CPU and memory from /proc, for the benchmarks that run a real server."""

from __future__ import annotations

import os

CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(pid: int) -> list[int]:
    """`pid` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _stat(path: str) -> list[bytes] | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree_cpu(pid: int, reaped: bool = False) -> float:
    """CPU-seconds (utime+stime) of the tree under `pid`; with `reaped`, also what its processes'
    children that already ended used."""
    total = 0.0
    for p in tree(pid):
        f = _stat(f"/proc/{p}/stat")
        if f is not None:
            total += (int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if reaped else 0)) / CLK
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of the tree under `pid`."""
    return sum(int(f[21]) * PAGE for p in tree(pid) if (f := _stat(f"/proc/{p}/stat")) is not None)


def main_threads_cpu(pid: int) -> float:
    """CPU-seconds of the main threads (the event loops) of the tree's processes."""
    return sum((int(f[11]) + int(f[12])) / CLK for p in tree(pid)
               if (f := _stat(f"/proc/{p}/task/{p}/stat")) is not None)


def host_cpu() -> tuple[float, float]:
    """(busy, total) CPU-seconds of the whole host since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / CLK, sum(f[:8]) / CLK
