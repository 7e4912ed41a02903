"""Analysts' own databases as read-only SQL sources (`[sources.<name>]` in workspace.toml).

config (the TOML table, secrets from the environment) -> check (one read statement, per
dialect) -> a driver session (postgres, mysql, sqlite, adbc: read-only in the database
session itself) from a per-user pool -> a `SourceStream` of normalised Arrow batches that
the SQL tool and the offload pipeline treat like the warehouse's. `registry.SourceSet` holds
a workspace's sources and their states.
"""
