"""`GET /api/search?q=`: full-text search over the caller's own threads (the set's `SearchIndex`: store/search.py, cluster/search.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from litestar import Controller, get
from litestar.exceptions import ClientException
from litestar.params import QueryParameter

from datadesk.api.guards.access import member_workspace
from datadesk.api.guards.auth import CurrentUser, RuntimeDep
from datadesk.store.search import MAX_LIMIT, BadSearchQuery


class SearchController(Controller):
    path = "/api/search"

    @get("/")
    async def search(
        self, user: CurrentUser, rt: RuntimeDep,
        q: Annotated[str, QueryParameter(description="words to find in thread titles and messages; "
                                                     "\"a phrase\", word* for a prefix")] = "",
        limit: Annotated[int, QueryParameter(description=f"matches to return (1-{MAX_LIMIT})")] = 20,
        workspace: Annotated[str | None, QueryParameter(description="only this workspace")] = None,
    ) -> dict[str, Any]:
        """Matches, best first, each with its thread, the record's seq (0: the title) and a snippet
        whose matched words are the `highlights` ([start, end) offsets)."""
        workspaces = [member_workspace(user, workspace)] if workspace else list(user.workspaces)
        finder = rt.search
        start = time.perf_counter()
        try:
            hits = await asyncio.to_thread(finder.search, user.id, workspaces, q, limit)
        except BadSearchQuery as exc:
            raise ClientException(str(exc)) from None
        return {"query": q, "took_ms": round((time.perf_counter() - start) * 1000, 1),
                "results": [{"thread": h.thread, "workspace": h.workspace, "title": h.title, "seq": h.seq,
                             "role": h.role, "ts": h.ts, "updated": h.updated, "snippet": h.snippet,
                             "highlights": [list(s) for s in h.highlights]} for h in hits]}
