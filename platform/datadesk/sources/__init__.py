"""The databases the model queries, as read-only SQL sources behind one interface
(`registry.Source`): the workspace's DuckDB warehouse and the analysts' own databases
(`[sources.<name>]` in workspace.toml).

registry (`SourceSet`: a workspace's sources, the warehouse first; `WorkspaceSources`) ->
warehouse (the DuckDB file and its `[views]`, a locked-down connection per query) or
database (config -> check, one read statement per dialect -> a driver session of engines/
from a per-user pool) -> a stream of Arrow batches (`query.ResultStream`) that the SQL tool
and the offload pipeline read the same way. errors: what can go wrong, in one hierarchy.
"""
