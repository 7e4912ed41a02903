"""A stand-in `python` tool for tests of offload decisions before a kernel is involved.

It makes the offload capability real ("the python tool is in this request and
the sandbox is healthy") and lets tests flip the sandbox's health. It runs no
code: it answers that this is a test sandbox.
"""

from __future__ import annotations

from datadesk.chat.policy import PYTHON_TOOL
from datadesk.composition import Runtime
from datadesk.tools.registry import ToolResult, ToolSpec


class FakeSandbox:
    def __init__(self, rt: Runtime, healthy: bool = True) -> None:
        self.healthy = healthy
        self.reason = "the test sandbox is stopped"
        rt.sandbox_health = lambda: (self.healthy, "" if self.healthy else self.reason)

        async def run(args, ctx):
            return ToolResult("test sandbox: code is not executed here")

        if rt.tools.get(PYTHON_TOOL) is not None:
            return  # a real python tool is registered: only its health is faked
        rt.tools.register(
            ToolSpec(name=PYTHON_TOOL, description="Run Python in the thread's kernel (test stand-in).",
                     parameters={"type": "object", "properties": {"code": {"type": "string"}},
                                 "required": ["code"]},
                     permission="code_execution", offloadable=False),
            run,
        )
