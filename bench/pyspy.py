"""Sampling profiles of a running server with py-spy, summed into the costs that matter.

    with recording(pid, out_path): ...run the load...
    print(summary(out_path))

`recording` runs `py-spy record --subprocesses --format raw` against the server's process
tree (every worker; only samples where a thread was running, not idle) until the block ends.
`summary` folds the collapsed stacks into two tables: the functions with the most samples of
their own (self), and the frames of DataDesk's own code (`datadesk/`) with the most samples
under them (inclusive), each as a share of all samples. Needs `pip install py-spy` and the
right to trace the process (root, or ptrace_scope 0).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@contextmanager
def recording(pid: int, out: Path, rate: int = 100) -> Iterator[None]:
    exe = shutil.which("py-spy")
    if exe is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--subprocesses", "--rate", str(rate),
                             "--format", "raw", "--output", str(out), "--nonblocking", *os.environ.get("DATADESK_PYSPY_FLAGS", "").split()],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the load starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _where(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    short = file.split("site-packages/")[-1].split("platform/")[-1].split("lib/python3.11/")[-1]
    return f"{m.group('fn')} ({short})"


def summary(path: Path, top: int = 25) -> str:
    selfs: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in Path(path).read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        selfs[_where(frames[-1])] += count
        for f in {_where(f) for f in frames if "datadesk/" in f}:
            ours[f] += count
    if not total:
        return "no samples"
    rows = [f"{total} samples (CPU-active, all processes)", "", "self:"]
    rows += [f"  {c / total:6.1%}  {fn}" for fn, c in selfs.most_common(top)]
    rows += ["", "inclusive, DataDesk frames:"]
    rows += [f"  {c / total:6.1%}  {fn}" for fn, c in ours.most_common(top)]
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    print(summary(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))
