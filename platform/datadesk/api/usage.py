"""`GET /api/threads/{tid}/usage`: tokens and cost per turn and for the thread (chat/costs.py),
from the usage the model replies recorded and the `llm.prices` setting."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, get
from litestar.params import FromPath

from datadesk.api.guards.access import find_thread
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.chat.costs import thread_costs


class UsageController(Controller):
    path = "/api/threads"

    @get("/{tid:str}/usage")
    async def usage(self, tid: FromPath[str], user: CurrentUser, rt: RuntimeDep) -> dict[str, Any]:
        """Each turn's requests, prompt, cached and completion tokens, and cost (None where the
        model has no price: `priced` false), and the same summed over the thread."""
        handle = find_thread(rt, user, tid)
        llm = rt.settings.llm
        turns, total = await asyncio.to_thread(thread_costs, iter(handle.log), llm.prices, llm.model)
        return {"thread": handle.id, "turns": msgspec.to_builtins(turns), "total": msgspec.to_builtins(total),
                "prices_set": sorted(llm.prices)}
