"""One PostgreSQL pool per process, dedicated connections for held locks and LISTEN, and the
schema migrations the app runs at start.

Every connection sets TCP keepalives and `tcp_user_timeout`, so a host that vanishes without a
FIN (its link gone) loses its session, and with it its advisory locks, within about 10 s
instead of the kernel's default two hours (SCALE.md section 3 measured 4.1 s at tighter values).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import weakref
from importlib import resources
from typing import Any, Iterator

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from datadesk.store.interfaces.errors import ClusterUnavailable

log = logging.getLogger(__name__)

# the client's side (libpq): notices a server that vanished
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
              "tcp_user_timeout": 10_000}
# the server's side of the same connection: the one that matters for locks, as it is the server
# that must drop a vanished host's session (and so its advisory locks and its turn)
SERVER_KEEPALIVES = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
                     " -c tcp_user_timeout=10000")
MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
MIGRATE_LOCK = "datadesk:migrate"
_OPEN: "weakref.WeakSet[Database]" = weakref.WeakSet()  # this process's open pools


class DatabaseError(ClusterUnavailable):
    """The cluster database could not be reached or used; the message names it (without password)."""


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for lock `name` (the same on every host and Python version)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


def redact_url(url: str) -> str:
    """`url` without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class Database:
    """A connection pool on `url` plus dedicated connections; `migrate()` brings the schema up."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, name: str = "datadesk",
                 connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.where = redact_url(url)
        self._kwargs: dict[str, Any] = {**KEEPALIVES, "options": SERVER_KEEPALIVES, "application_name": name,
                                        "connect_timeout": max(1, int(connect_timeout_s))}
        self.pool = ConnectionPool(url, min_size=min_size, max_size=max_size, open=False, name=name,
                                   kwargs={**self._kwargs, "row_factory": dict_row},
                                   timeout=connect_timeout_s)
        try:
            self.pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as exc:
            self.pool.close()
            raise DatabaseError(f"cannot connect to the cluster database {self.where}: {exc}") from exc
        _OPEN.add(self)

    @staticmethod
    def close_all(url: str) -> int:
        """Close every pool of this process on `url` (a test's teardown: a pool nobody closed
        would keep its threads reconnecting to a database that is gone). Returns how many."""
        found = [db for db in list(_OPEN) if db.url == url]
        for db in found:
            db.close()
        return len(found)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection inside a transaction: committed on success, rolled back on error."""
        with self.pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def autocommit(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in autocommit mode: each statement is its own transaction, with no
        BEGIN/COMMIT round trips. For single statements and reads that need no common snapshot;
        anything that locks a row for later statements uses `connection()`."""
        with self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if not conn.closed:
                    conn.autocommit = False  # the pool's other users expect a transaction

    def dedicated(self) -> psycopg.Connection:
        """A new autocommit connection outside the pool (a held session lock, LISTEN); the
        caller closes it. Its death releases whatever session locks it holds."""
        try:
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row, **self._kwargs)
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to the cluster database {self.where}: {exc}") from exc

    async def async_dedicated(self) -> psycopg.AsyncConnection:
        """An async autocommit connection outside the pool (LISTEN in the event loop)."""
        try:
            return await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=dict_row,
                                                         **self._kwargs)
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to the cluster database {self.where}: {exc}") from exc

    def migrate(self) -> list[str]:
        """Apply the migrations not applied yet, in number order, each in its own transaction,
        under an advisory lock so two hosts starting at once do not both run one. Returns the
        names applied now."""
        applied: list[str] = []
        conn = self.dedicated()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", (advisory_key(MIGRATE_LOCK),))
            conn.execute("CREATE TABLE IF NOT EXISTS datadesk_schema (version int PRIMARY KEY, name text NOT NULL,"
                         " applied_at timestamptz NOT NULL DEFAULT now())")
            done = {r["version"] for r in conn.execute("SELECT version FROM datadesk_schema").fetchall()}
            newest = max(done, default=0)
            for version, name, sql in migrations():
                if version in done:
                    continue
                if version < newest:
                    log.warning("migration %04d_%s is older than the applied %04d; applying it now",
                                version, name, newest)
                with conn.transaction():
                    conn.execute(sql)
                    conn.execute("INSERT INTO datadesk_schema (version, name) VALUES (%s, %s)", (version, name))
                applied.append(f"{version:04d}_{name}")
            known = {v for v, _, _ in migrations()}
            if done - known:
                raise DatabaseError(f"the cluster database {self.where} has schema versions this DataDesk does not "
                                    f"know ({sorted(done - known)}): it was upgraded by a newer release")
        finally:
            conn.close()  # releases the migration lock with the session
        if applied:
            log.info("cluster schema: applied %s", ", ".join(applied))
        return applied

    def close(self) -> None:
        _OPEN.discard(self)
        self.pool.close()


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every file in cluster/migrations/, in version order."""
    found: list[tuple[int, str, str]] = []
    for entry in resources.files("datadesk.cluster.migrations").iterdir():
        m = MIGRATION_NAME.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise DatabaseError(f"two migrations share a number: {versions}")
    return found
