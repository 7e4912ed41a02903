"""Driving the python tool directly on a Runtime with a real sandbox backend (shared by the
local/docker and the gateway sandbox tests)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec

from datadesk.composition import Runtime
from datadesk.llm.scripted import ScriptedModel
from datadesk.settings import Settings
from datadesk.store.threads import Thread
from datadesk.tools.registry import ToolContext


def runtime_with_sandbox(home: Path, sandbox: dict) -> Runtime:
    """A Runtime on `home` whose `[sandbox]` section is `sandbox` (the model is never called)."""
    settings = msgspec.convert({"home": str(home), "sandbox": sandbox}, Settings, dec_hook=lambda t, o: Path(o))
    return Runtime(settings=settings, model=ScriptedModel())


def ctx(rt: Runtime, user: str = "alice", tid: str = "t1", perms=("code_execution",)) -> ToolContext:
    """The tool context of a thread of `user` in the demo workspace."""
    tdir = rt.layout.thread_dir("demo", user, tid)
    (tdir / "artifacts").mkdir(parents=True, exist_ok=True)
    return ToolContext(thread=Thread(tdir), workspace="demo", user=user, permissions=frozenset(perms), call_id="c1")


async def py(rt: Runtime, c: ToolContext, code: str, **args):
    return await rt.tools.run("python", json.dumps({"code": code, **args}), c)


def run_with(rt: Runtime, body):
    """Start the runtime (kernels, reaper), run `body()`, stop it."""
    async def main():
        await rt.start()
        try:
            return await body()
        finally:
            await rt.stop()
    return asyncio.run(main())
