"""The cluster set: PostgreSQL and an S3-compatible object store behind the `store/interfaces/` protocols.

Only modules in this package import psycopg, psycopg_pool or obstore; the composition root
imports it only when `cluster.database_url` is set, so the embedded default needs neither.
"""
