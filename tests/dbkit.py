"""Real database servers for the source tests: PostgreSQL and MariaDB started under a temp dir
on a free 127.0.0.1 port as their own system user, loaded with test data, stopped by PID.

Each server starts once per test run (session fixtures in tests/sources/conftest.py). Two
logins, as docs/sources-and-mcp.md tells an admin to set them up: `analyst` may only read (SELECT on the
tables, no CREATE or TEMP, no FILE), and `owner` owns the tables (it could write). A source on
`owner` needs `allow_write_privileges = true`; a refused write through it proves the read-only
transaction or the statement check, not a missing grant. Passwords are random per run, so a
test can look for them in every file the app wrote.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
ROWS = 300_000  # rows of the `orders` table in every database


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       check=True)
        return pwd.getpwnam(name)


def _as(user: pwd.struct_passwd) -> dict:
    return {"user": user.pw_uid, "group": user.pw_gid} if os.geteuid() == 0 else {}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """`cmd`, failing with its stderr (not just its exit status)."""
    out = subprocess.run(cmd, capture_output=True, **kw)
    if out.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({out.returncode}): "
                           f"{out.stderr.decode(errors='replace')[-2000:]}")
    return out


def _wait_port(port: int, timeout: float, proc_alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if not proc_alive():
            raise RuntimeError("the database server exited during start")
        time.sleep(0.05)
    raise RuntimeError(f"no server on port {port} after {timeout} s")


def _stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether `pid` is gone. A server this process started itself (mariadbd's Popen) stays a
    zombie that `kill(pid, 0)` still finds until it is reaped: reap it here, or every stop would
    wait out its whole timeout (20 s) and then SIGKILL the corpse."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass  # not our child (pg_ctl's postmaster) or reaped already: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@dataclass
class Server:
    """One running database server: where it listens and how the analyst logs in."""

    kind: str  # postgresql | mariadb
    port: int
    user: str
    password: str
    database: str
    root: Path
    pid: int = 0
    writer: str = "owner"  # the login that owns the tables (could write)
    writer_password: str = ""

    def url(self, with_password: bool = False, user: str = "") -> str:
        user = user or self.user
        password = self.writer_password if user == self.writer else self.password
        auth = f"{user}:{password}@" if with_password else f"{user}@"
        return f"{self.kind}://{auth}127.0.0.1:{self.port}/{self.database}"

    def stop(self) -> None:
        if self.pid:
            _stop_pid(self.pid, signal.SIGINT if self.kind == "postgresql" else signal.SIGTERM)
            self.pid = 0


@dataclass
class PgHome:
    """The folders of a test PostgreSQL server under `root`: `data` (initdb's) and `sock` (its
    unix socket), owned by the `postgres` system user that runs its tools; its log is root/log."""

    root: Path
    user: pwd.struct_passwd
    env: dict[str, str]

    @property
    def data(self) -> Path:
        return self.root / "pgdata"

    @property
    def sock(self) -> Path:
        return self.root / "sock"

    def hand_over(self, path: Path) -> None:
        """Give `path` to the server's user (when running as root; else it is ours already)."""
        if os.geteuid() == 0:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """`cmd` as the server's user, with the server's tools on PATH."""
        return _run(cmd, env=self.env, **_as(self.user), **kw)

    def start(self) -> int:
        """pg_ctl start (waits until it accepts connections); the postmaster's pid."""
        self.run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "30",
                  "start"])
        return int((self.data / "postmaster.pid").read_text().split()[0])


def pg_home(root: Path) -> PgHome:
    """`root` and its socket folder made and handed to the `postgres` system user (made if missing)."""
    home = PgHome(root, _system_user("postgres"), {"PATH": f"{PG_BIN}:/usr/bin:/bin", "LANG": "C.UTF-8"})
    root.mkdir(parents=True, exist_ok=True)
    home.sock.mkdir(exist_ok=True)
    for p in (root, home.sock):
        home.hand_over(p)
    return home


def postgres_problem() -> str | None:
    return None if (PG_BIN / "initdb").is_file() else f"PostgreSQL 15 is not installed ({PG_BIN})"


def mariadb_problem() -> str | None:
    if shutil.which("mariadbd") or Path("/usr/sbin/mariadbd").is_file():
        return None
    return "MariaDB is not installed (apt-get install mariadb-server)"


def databases_problem() -> str | None:
    return postgres_problem() or mariadb_problem()


PG_DATA = f"""
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, country text);
COMMENT ON TABLE customers IS 'One row per customer';
COMMENT ON COLUMN customers.country IS 'ISO 3166 alpha-2';
INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['DE','FR','IT'])[1 + g % 3] FROM generate_series(1, 100) g;
CREATE TABLE orders (
  id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2) NOT NULL, ratio double precision,
  ts timestamptz NOT NULL, day date NOT NULL, paid boolean NOT NULL, note text,
  meta json, ref uuid, tags text[], wait interval);
INSERT INTO orders SELECT g, 1 + g % 100, (g % 1000) + 0.25, g / 7.0,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute', date '2024-01-01' + (g % 365),
  g % 2 = 0, 'note ' || g, json_build_object('k', g), md5(g::text)::uuid,
  ARRAY['a' || (g % 3), 'b'], (g % 90) * interval '1 minute'
FROM generate_series(1, {ROWS}) g;
CREATE SCHEMA hidden;
CREATE TABLE hidden.secrets (id int);
ANALYZE;
"""


# the read-only login of docs/sources-and-mcp.md (the `hidden` schema is readable too: `schemas` is the app's boundary)
PG_READ_ONLY = """
REVOKE ALL ON DATABASE sales FROM PUBLIC;
GRANT CONNECT ON DATABASE sales TO analyst;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public, hidden TO analyst;
GRANT SELECT ON ALL TABLES IN SCHEMA public, hidden TO analyst;
ALTER DEFAULT PRIVILEGES FOR ROLE owner, postgres GRANT SELECT ON TABLES TO analyst;
"""


def start_postgres(root: Path) -> Server:
    """initdb + pg_ctl as the `postgres` system user; loads PG_DATA as the analyst's tables."""
    home = pg_home(root)
    srv = Server("postgresql", 0, "analyst", "pw-" + secrets.token_hex(12), "sales", root,
                 writer_password="pw-" + secrets.token_hex(12))
    home.run([str(PG_BIN / "initdb"), "-D", str(home.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--no-sync"])
    srv.port = free_port()  # chosen just before the server binds it (tests run in parallel)
    with (home.data / "postgresql.conf").open("a") as f:
        f.write(f"listen_addresses = '127.0.0.1'\nport = {srv.port}\nunix_socket_directories = '{home.sock}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
    (home.data / "pg_hba.conf").write_text("local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    srv.pid = home.start()
    psql = ["psql", "-h", str(home.sock), "-p", str(srv.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-q"]
    try:
        for stmt in (f"CREATE ROLE analyst LOGIN PASSWORD '{srv.password}'",
                     f"CREATE ROLE owner LOGIN PASSWORD '{srv.writer_password}'", "CREATE DATABASE sales OWNER owner"):
            home.run([*psql, "-d", "postgres", "-c", stmt])
        sql = "SET ROLE owner;\n" + PG_DATA + "RESET ROLE;\n" + PG_READ_ONLY
        home.run([*psql, "-d", "sales"], input=sql.encode())
    except BaseException:
        srv.stop()
        raise
    return srv


def pg_superuser(srv: Server, sql: str) -> str:
    """Run `sql` as the postgres superuser (e.g. to end the analyst's backends)."""
    pg = _system_user("postgres")
    out = subprocess.run(["psql", "-h", str(srv.root / "sock"), "-p", str(srv.port), "-U", "postgres",
                          "-d", "sales", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql], capture_output=True,
                         env={"PATH": "/usr/bin:/bin"}, **_as(pg))
    if out.returncode:
        raise RuntimeError(f"psql failed: {out.stderr.decode()[-2000:]}")
    return out.stdout.decode()


MARIA_DATA = f"""
CREATE TABLE customers (id int PRIMARY KEY, name varchar(64) NOT NULL, country char(2)
  COMMENT 'ISO 3166 alpha-2') COMMENT 'One row per customer';
INSERT INTO customers SELECT seq, CONCAT('customer ', seq), ELT(1 + seq % 3, 'DE', 'FR', 'IT') FROM seq_1_to_100;
CREATE TABLE orders (
  id bigint PRIMARY KEY, customer_id int NOT NULL, amount decimal(12,2) NOT NULL, ratio double,
  ts datetime(6) NOT NULL, day date NOT NULL, paid boolean NOT NULL, note varchar(64), meta json);
INSERT INTO orders SELECT seq, 1 + seq % 100, (seq % 1000) + 0.25, seq / 7.0,
  TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq MINUTE, DATE '2024-01-01' + INTERVAL (seq % 365) DAY,
  seq % 2 = 0, CONCAT('note ', seq), JSON_OBJECT('k', seq) FROM seq_1_to_{ROWS};
"""


def start_mariadb(root: Path) -> Server:
    """mariadb-install-db + mariadbd as the `mysql` system user; loads MARIA_DATA."""
    my = _system_user("mysql")
    root.mkdir(parents=True, exist_ok=True)
    data, sock = root / "data", root / "mysqld.sock"
    os.chown(root, my.pw_uid, my.pw_gid) if os.geteuid() == 0 else None
    srv = Server("mariadb", 0, "analyst", "pw-" + secrets.token_hex(12), "sales", root,
                 writer_password="pw-" + secrets.token_hex(12))
    _run(["mariadb-install-db", f"--datadir={data}", "--auth-root-authentication-method=socket", "--skip-test-db",
          f"--user={my.pw_name}"])
    srv.port = free_port()  # chosen just before the server binds it (tests run in parallel)
    log = open(root / "log", "wb")
    proc = subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={sock}", f"--port={srv.port}",
         "--bind-address=127.0.0.1", f"--user={my.pw_name}", f"--pid-file={root / 'pid'}",
         "--innodb-buffer-pool-size=128M", "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin",
         "--innodb-doublewrite=0", "--character-set-server=utf8mb4"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv.pid = proc.pid
    try:
        _wait_port(srv.port, 30, lambda: proc.poll() is None)
        setup = (f"CREATE DATABASE sales; CREATE USER analyst@'127.0.0.1' IDENTIFIED BY '{srv.password}';"
                 f"CREATE USER owner@'127.0.0.1' IDENTIFIED BY '{srv.writer_password}';"
                 "GRANT ALL ON sales.* TO owner@'127.0.0.1';"
                 "GRANT SELECT, SHOW VIEW ON sales.* TO analyst@'127.0.0.1'; USE sales;" + MARIA_DATA)
        _run(["mariadb", f"--socket={sock}", "-uroot"], input=setup.encode())
    except BaseException:
        srv.stop()
        raise
    return srv


def maria_root(srv: Server, sql: str) -> str:
    out = subprocess.run(["mariadb", f"--socket={srv.root / 'mysqld.sock'}", "-uroot", "-N", "-e", sql],
                         capture_output=True)
    if out.returncode:
        raise RuntimeError(f"mariadb failed: {out.stderr.decode()[-2000:]}")
    return out.stdout.decode()


def make_sqlite(path: Path, rows: int = ROWS) -> Path:
    """A SQLite file with the same `customers` and `orders` (text timestamps, real amounts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript(f"""
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 100)
INSERT INTO customers SELECT n, 'customer ' || n, substr('DEFRIT', 1 + 2 * (n % 3), 2) FROM g;
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, amount REAL NOT NULL,
  ratio REAL, day TEXT NOT NULL, paid INTEGER NOT NULL, note TEXT);
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows})
INSERT INTO orders SELECT n, 1 + n % 100, (n % 1000) + 0.25, n / 7.0, date('2024-01-01', '+' || (n % 365) || ' days'),
  n % 2 = 0, 'note ' || n FROM g;
""")
    con.commit()
    con.close()
    return path


def make_side_effect_functions(pg: Server, maria: Server) -> None:
    """`bump()` in both databases: a function that writes a row when called, owned (PostgreSQL) or
    defined (MariaDB) by the owner login, so only the read-only transaction can stop it."""
    pg_superuser(pg, "CREATE OR REPLACE FUNCTION public.bump() RETURNS int LANGUAGE sql AS "
                     "$$ INSERT INTO public.customers VALUES (999, 'x', 'DE') RETURNING 1 $$;"
                     "ALTER FUNCTION public.bump() OWNER TO owner")
    subprocess.run(["mariadb", f"--socket={maria.root / 'mysqld.sock'}", "-uroot", "--delimiter=//", "sales", "-e",
                    "DROP FUNCTION IF EXISTS bump// CREATE DEFINER=owner@'127.0.0.1' FUNCTION bump() RETURNS INT "
                    "MODIFIES SQL DATA BEGIN INSERT INTO customers VALUES (999, 'x', 'DE'); RETURN 1; END//"
                    "GRANT EXECUTE ON FUNCTION sales.bump TO owner@'127.0.0.1'//"],
                   check=True, capture_output=True)
