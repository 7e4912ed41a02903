"""The process's own start time (store/tempnames.py `own_start`): read once, and again in a fork."""

from __future__ import annotations

import os

from datadesk.store import tempnames


def test_own_start_is_this_process_start_and_a_fork_reads_its_own() -> None:
    mine = tempnames.own_start()
    assert mine is not None and mine == tempnames.proc_start(os.getpid())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own pid and start time, not the cached parent's
        try:
            ok = tempnames.own_start() == tempnames.proc_start(os.getpid()) and \
                tempnames.owner_tag().endswith(f"-{os.getpid()}-{tempnames.own_start()}~")
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"1"
    assert tempnames.own_start() == mine
