"""The endpoints, one Litestar `Controller` per resource: threads (messages, SSE), artifacts
(and uploads), export, memory, search, task state, session (login, me, health) and workspace.
Each parses, authorizes (`api/guards/`), calls one service of the `Runtime` and shapes the
response."""
