"""MCP servers' tools in the registry: the client manager (`manager.py`: one task per server,
tools registered per workspace), its configuration (`config.py`: `[mcp.<server>]`, secrets,
tool names), the bounded transports (`stdio.py`, `http.py`; a server's stdout cut into messages
by `framing.py`, a large answer spooled to disk by `spool.py`), their stream helpers
(`streams.py`: stderr to the log, the end of a connection noticed), what a result becomes
(`results.py`) and what a tool's schemas say about its tabular results (`shapes.py`)."""
