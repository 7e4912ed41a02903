"""The local backend's single-coder rule holds at hand-out from the pool too (issue 24): a kernel
pre-started while one user could execute code is ended, never given, once there are two.
Real ipykernel subprocesses on the local backend, through the python tool."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from datadesk.store.layout import Layout
from datadesk.store.users import UserStore
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody reaped yet is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


async def _pooled(registry, timeout_s: float = 60):
    """The pool's one kernel once it is warm."""
    deadline = time.monotonic() + timeout_s
    while not registry.pool:
        assert time.monotonic() < deadline, "the pool kernel did not start"
        await asyncio.sleep(0.1)
    return registry.pool[0]


@pytest.mark.security
def test_a_pooled_local_kernel_is_not_handed_out_once_a_second_user_can_execute_code(home: Path) -> None:
    users = UserStore(Layout(home))
    users.add("alice", ["demo"], ["code_execution"])
    rt = runtime_with_sandbox(home, {"backend": "local", "pool_size": 1})
    reg = rt.kernels

    async def body():
        first_pool = await _pooled(reg)
        first = await py(rt, ctx(rt), "import os\nos.getpid()")
        spare = await _pooled(reg)  # the pool refills after a hand-out
        users.add("mallory", ["demo"], ["code_execution"])  # a second coder, while the spare waits
        refused = await py(rt, ctx(rt, tid="t2"), "import os\nos.getpid()")
        # looked at before the runtime stops (stopping ends every kernel anyway)
        after = {"pool": list(reg.pool), "spare_gone": _gone(spare.kernel.pid),
                 "t2": reg.table.load(("demo", "alice", "t2")),
                 "spares": [r for r in reg.table.kernels() if r.key is None]}
        return first_pool.kernel.pid, first, spare.kernel.pid, refused, after

    first_pid, first, spare_pid, refused, after = run_with(rt, body)
    # with one coder the pooled kernel is the one that ran the code (the path under test)
    assert not first.is_error and str(first_pid) in first.content, first.content
    # with two, the waiting spare serves nobody: the clear refusal, and the spare is ended
    assert refused.is_error and "2 users can execute code" in refused.content, refused.content
    assert "docker" in refused.content and str(spare_pid) not in refused.content
    assert after["pool"] == [] and after["spare_gone"], after
    assert after["t2"] is None and after["spares"] == [], after  # nothing reserved, no spare counted
