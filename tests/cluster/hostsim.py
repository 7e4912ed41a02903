"""Several real hosts on one machine (SCALE.md section 4), for tests/cluster/test_multihost.py.

`Topology.up()` builds, all of it real and stopped by PID in `down()`:

- a bridge in the root namespace holding 10.213.<x>.1/24 (a /24 no interface here uses), and
  network namespaces `dd<pid>a`, `dd<pid>b`, `dd<pid>c` (app hosts) and `dd<pid>k` (kernels),
  each joined to the bridge by a veth pair; `Net.link(name, False)` takes a host off the
  network without a FIN (its veth goes down);
- in the root namespace: PostgreSQL 15 (tests/clusterkit.py; restarted to listen on the bridge
  address too), SeaweedFS (`weed server -s3`, tests/clusterkit.py) and the fake model
  (fake_steps.py) on loopback, the last two reached at the bridge address through haproxy
  (`mode tcp`: the bytes, and so the Host header of a presigned URL, unchanged); haproxy also
  serves the app on 127.0.0.1, hashing `/api/threads/<tid>` over the three hosts
  (deploy/haproxy.cfg), and on a second port in front of host A alone;
- Enterprise Gateway in `k` (tests/egkit.py) under a tmpfs for the kernels' files;
- each app host: `datadesk serve` in its namespace under `unshare -m -u` (its own host name),
  with its own tmpfs mounted as DATADESK_HOME (a copy of one template home: the demo
  workspace), in a cpu cgroup of its own capped at HOST_CPUS.

Nothing is shared between hosts but PostgreSQL, the bucket and the gateway: every host sees
its home at the same path, and `Host.sh` runs a command in a host's own mount namespace.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.clusterkit import ClusterPG, SeaweedS3, cluster_problem, start_cluster_postgres, start_seaweedfs
from tests.cluster.test_operate_cluster import pg_down, pg_up
from tests.dbkit import _wait_port, free_port
from tests.cluster.hostclient import listening_ports
from tests.egkit import EG_BIN, KERNEL_USER, start_gateway

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = Path("/usr/sbin/haproxy")
HOST_CPUS = 0.5  # each app host's cap: 3 hosts vs 1 measures scaling, not this machine's cores
APP_HOSTS = ("a", "b", "c")
OCTET = {"root": 1, "a": 11, "b": 12, "c": 13, "k": 20}
SECRET_KEY = "multihost-secret-" + "m" * 32
SETTINGS = """\
[chat]
max_turns_per_user = {turns}
[summary]
enabled = false
[server]
streams_per_user = 500
requests_in_flight_per_user = 500
request_burst_per_user = 100000
requests_per_minute_per_user = 100000
[cluster]
pool_size = 8
[sandbox]
backend = "gateway"
gateway_url = "{gateway}"
gateway_files = "presigned"
gateway_kernel_files_dir = "{kernel_files}"
gateway_kernel_env = {{ KERNEL_USERNAME = "{kernel_user}" }}
pool_size = 0
max_kernels_per_user = {kernels}
max_kernels = 40
"""


def topology_problem() -> str | None:
    """Why the multi-host topology cannot be built here, or None."""
    problem = cluster_problem()
    if problem:
        return problem
    if os.geteuid() != 0:
        return "the multi-host test needs root (network namespaces, veths, cgroups, tmpfs mounts)"
    for tool in ("ip", "unshare", "nsenter", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if not HAPROXY.is_file():
        return f"haproxy is not installed ({HAPROXY}: apt-get install haproxy)"
    if not EG_BIN.is_file():
        return f"Jupyter Enterprise Gateway is not installed ({EG_BIN}: .ci/run makes the .venv-eg venv)"
    if CpuCap.root() is None:
        return "no cpu cgroup controller (v1 /sys/fs/cgroup/cpu or v2 with +cpu) to cap each host"
    return None


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def _tool(name: str) -> str:
    return shutil.which(name) or name


def _ip(*args: str, check: bool = True) -> str:
    out = subprocess.run([_tool("ip"), *args], capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


# --------------------------------------------------------------------------- network


@dataclass
class Net:
    """The bridge, the namespaces and their veths (see the module doc)."""

    tag: str = field(default_factory=lambda: f"dd{os.getpid() % 10_000_000}")
    subnet: str = ""
    made: list[str] = field(default_factory=list)

    def ns(self, name: str) -> str:
        """Namespace `name`, and the root namespace's end of its veth pair (the peer: <this>p)."""
        return self.tag + name

    @property
    def bridge(self) -> str:
        return self.tag + "br"

    def addr(self, name: str) -> str:
        return f"{self.subnet}.{OCTET[name]}"

    def build(self) -> None:
        used = _ip("-4", "-o", "addr") + _ip("-4", "route")
        free = [x for x in range(11, 250) if f"10.213.{x}." not in used]
        self.subnet = f"10.213.{free[os.getpid() % len(free)]}"
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(self.bridge)
        _ip("addr", "add", f"{self.addr('root')}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name in (*APP_HOSTS, "k"):
            ns = veth = self.ns(name)
            _ip("netns", "add", ns)
            self.made.append("netns:" + ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", veth + "p", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", veth + "p")
            _ip("-n", ns, "link", "set", veth + "p", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def link(self, name: str, up: bool) -> None:
        """Put host `name` on the network or take it off (no FIN reaches anyone)."""
        _ip("link", "set", self.ns(name), "up" if up else "down")

    def pids(self, name: str) -> list[int]:
        """Every process in namespace `name` (`ip netns pids`)."""
        return [int(p) for p in _ip("netns", "pids", self.ns(name), check=False).split()]

    def remove(self) -> None:
        for made in reversed(self.made):
            if made.startswith("netns:"):
                _ip("link", "del", made[6:], check=False)  # the veth pair (named as its namespace)
                _ip("netns", "del", made[6:], check=False)
            else:
                _ip("link", "del", made, check=False)
        self.made.clear()

    def leftovers(self) -> list[str]:
        """Namespaces and links of ours still there (a namespace goes once its last process has)."""
        for _ in range(50):
            names = _ip("netns", "list", check=False).split() + [
                line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).splitlines()]
            left = sorted({n for n in names if n.startswith(self.tag)})
            if not left:
                break
            time.sleep(0.1)
        return left


# --------------------------------------------------------------------------- cpu caps


class CpuCap:
    """A cpu cgroup of its own (v1 `cpu.cfs_quota_us` or v2 `cpu.max`) capped at `cpus`."""

    PERIOD_US = 100_000

    def __init__(self, name: str, cpus: float) -> None:
        root = self.root()
        assert root is not None
        self.v2 = (root / "cgroup.controllers").exists()
        self.path = root / name
        self.path.mkdir()
        if not self.v2:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
        self.set(cpus)

    def set(self, cpus: float) -> None:
        self.cpus = cpus
        quota = int(cpus * self.PERIOD_US)
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    @staticmethod
    def root() -> Path | None:
        v1 = Path("/sys/fs/cgroup/cpu")
        if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
            return v1
        for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            control = v2 / "cgroup.subtree_control"
            if control.exists() and "cpu" in control.read_text().split():
                return v2
        return None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def procs(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        for _ in range(100):
            try:
                return self.path.rmdir()
            except FileNotFoundError:
                return None
            except OSError:
                time.sleep(0.05)  # its last process is still being reaped
        raise RuntimeError(f"cgroup {self.path} still holds {self.procs()}")


# --------------------------------------------------------------------------- processes


class Procs:
    """Every process the topology starts, each in its own process group; stopped by PID."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, cmd: list[str], env: dict[str, str], cap: CpuCap | None = None,
              cwd: Path = ROOT) -> subprocess.Popen:
        log = self.logs / f"{name}-{len(self.started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    start_new_session=True)
        proc.log = log  # type: ignore[attr-defined]
        if cap is not None:
            cap.add(proc.pid)  # before it forks: its children stay in the group
        self.started.append((name, proc))
        return proc

    @staticmethod
    def send(proc: subprocess.Popen, sig: int) -> None:
        """`sig` to the process group (a stopped group is continued first)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, sig)

    @staticmethod
    def reap(proc: subprocess.Popen, wait_s: float = 20) -> None:
        """Wait for `proc` (SIGKILL to its group after `wait_s`), then end what it left in its group."""
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    @classmethod
    def stop(cls, proc: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 20) -> None:
        cls.send(proc, sig)
        cls.reap(proc, wait_s)

    def stop_all(self) -> None:
        """SIGTERM to every group at once, then each waited for."""
        for _, proc in self.started:
            self.send(proc, signal.SIGTERM)
        for _, proc in reversed(self.started):
            self.reap(proc)

    def alive(self) -> list[str]:
        return [f"{name} (pid {p.pid})" for name, p in self.started if p.poll() is None]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120, headers: dict | None = None) -> None:
    """Until `url` answers 200 (fails with `proc`'s log when it exits or `timeout` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            log = getattr(proc, "log", None)
            raise RuntimeError(f"{url} did not answer:\n{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.1)


def kill_child(pid: int, timeout: float = 10) -> bool:
    """SIGKILL child `pid`'s group and reap it (tests/clusterkit.py keeps no Popen of SeaweedFS,
    and SeaweedFS takes over 10 s to stop on SIGTERM); whether it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- an app host


@dataclass
class Host:
    """One app host: `datadesk serve` in namespace `name` with its own tmpfs home and cpu cap."""

    name: str
    topo: "Topology"
    port: int = 0
    proc: subprocess.Popen | None = None
    cap: CpuCap | None = None

    @property
    def addr(self) -> str:
        return self.topo.net.addr(self.name)

    @property
    def base(self) -> str:
        return f"http://{self.addr}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid  # type: ignore[union-attr]

    def launch(self) -> subprocess.Popen:
        """Start the host (a fresh tmpfs home: what a host that comes back has); not waited for."""
        t = self.topo
        env = {**t.host_env, "DATADESK_HOST": self.addr, "DATADESK_PORT": str(self.port),
               "DD_HOSTNAME": f"{t.net.tag}-{self.name}"}
        script = ('hostname "$DD_HOSTNAME" && mount -t tmpfs -o size=768m,mode=0700 ddhome "$DATADESK_HOME" '
                  '&& cp -a "$DD_TEMPLATE"/. "$DATADESK_HOME"/ && exec "$DD_PYTHON" -m datadesk.cli serve')
        cmd = [_tool("ip"), "netns", "exec", t.net.ns(self.name), _tool("unshare"), "-m", "-u",
               "--propagation", "private", "/bin/sh", "-c", script]
        self.proc = t.procs.spawn(f"host-{self.name}", cmd, env, cap=self.cap)
        return self.proc

    def wait(self, timeout: float = 120) -> None:
        wait_http(f"{self.base}/api/health", self.proc, timeout)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL the host's process group (nothing of it runs on)."""
        if self.proc is not None:
            Procs.stop(self.proc, signal.SIGKILL)

    def sh(self, script: str) -> str:
        """`script` run in this host's own mount namespace (its home), as root."""
        out = subprocess.run(["nsenter", "-t", str(self.pid), "-m", "--", "sh", "-c", script],
                             capture_output=True, text=True, timeout=60,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "H": str(self.topo.home)})
        assert out.returncode == 0, f"{script}: {out.stderr}"
        return out.stdout


# --------------------------------------------------------------------------- the whole topology


class Topology:
    """The hosts, the shared services and the balancer (see the module doc)."""

    def __init__(self, demo_warehouse: Path, max_turns: int = 3, max_kernels: int = 2,
                 step_delay: float = 0.2, bench_rows: int = 1000) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="datadesk-multihost-"))
        self.root.chmod(0o711)  # PostgreSQL's own user reaches its folder under it
        (self.root / "logs").mkdir()
        self.procs = Procs(self.root / "logs")
        self.net = Net()
        self.limits = {"turns": max_turns, "kernels": max_kernels}
        self.step_delay = step_delay
        self.bench_rows = bench_rows  # rows of the offloaded result of a `bench` turn (fake_steps.py)
        self.demo_warehouse = demo_warehouse
        self.home = self.root / "home"  # every host's DATADESK_HOME: a tmpfs of its own over this path
        self.kernel_files = self.root / "kernel-files"  # a tmpfs in k's mount namespace
        self.eg: Any = None
        self.gateway = ""
        self.pg: ClusterPG | None = None
        self.weed: SeaweedS3 | None = None
        self.caps: list[CpuCap] = []
        self.hosts: dict[str, Host] = {}
        self.ports: dict[str, int] = {}
        self.host_env: dict[str, str] = {}
        self.local_env: dict[str, str] = {}  # a process of the root namespace: loopback addresses
        self.users: Any = None
        self._close_users = lambda: None

    # -- up ------------------------------------------------------------------------------------
    def up(self) -> "Topology":
        self.net.build()
        self._postgres()
        self.weed = start_seaweedfs(self.root / "seaweedfs")
        self.bucket = self.weed.new_bucket()
        self._fake_model()
        self._haproxy()
        self._gateway()
        self._template()
        for name in APP_HOSTS:
            cap = CpuCap(f"{self.net.tag}-{name}", HOST_CPUS)
            self.caps.append(cap)
            self.hosts[name] = Host(name, self, port=self.ports["host"], cap=cap)
        for host in self.hosts.values():  # the first start migrates the database (under its lock)
            host.launch()
        for host in self.hosts.values():
            host.wait()
        self._open_users()
        return self

    def _postgres(self) -> None:
        """The cluster test's PostgreSQL, restarted to listen on the bridge address too."""
        self.pg = pg = start_cluster_postgres(self.root / "pg")
        with (pg.root / "pgdata" / "postgresql.conf").open("a") as f:
            f.write(f"listen_addresses = '127.0.0.1,{self.net.addr('root')}'\nmax_connections = 400\n")
        with (pg.root / "pgdata" / "pg_hba.conf").open("a") as f:
            f.write(f"host all all {self.net.subnet}.0/24 scram-sha-256\n")
        pg_down(pg)
        pg_up(pg)
        self.ports["postgres"] = pg.port
        self.db_url = pg.new_database()

    def _fake_model(self) -> None:
        port_file = self.root / "fake.port"
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}
        proc = self.procs.spawn("fake-model", [sys.executable, "-m", "tests.cluster.fake_steps", "--port-file",
                                               str(port_file), "--step-delay", str(self.step_delay),
                                               "--rows", str(self.bench_rows)], env)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.log.read_text()[-2000:]
            time.sleep(0.05)
        self.ports["fake-model"] = int(port_file.read_text())

    def _haproxy(self) -> None:
        """The app's balancer on 127.0.0.1 (all hosts; A alone), and the namespaces' way to the
        store and the model at the bridge address."""
        assert self.weed is not None
        for name in ("lb", "lb-a", "s3-fwd", "llm-fwd"):
            self.ports[name] = free_port()
        self.ports["host"] = free_port()  # every app host listens on this port in its own namespace
        bridge, p = self.net.addr("root"), self.ports
        servers = "".join(f"    server {n} {self.net.addr(n)}:{p['host']} check inter 1s fall 2 rise 1\n"
                          for n in APP_HOSTS)
        cfg = ("global\n    maxconn 4096\ndefaults\n    mode http\n    timeout connect 5s\n"
               "    timeout client 1h\n    timeout server 1h\n    retries 2\n    option redispatch\n"
               f"frontend app\n    bind 127.0.0.1:{p['lb']}\n    default_backend apps\n"
               f"frontend app-a\n    bind 127.0.0.1:{p['lb-a']}\n    default_backend apps-a\n"
               "backend apps\n    balance uri path-only depth 3\n    hash-type consistent\n"
               # which host answered (tests/cluster/test_multihost.py spreads its threads evenly with it)
               "    http-response set-header X-Served-By %[srv_name]\n"
               f"    option httpchk GET /api/health\n{servers}"
               f"backend apps-a\n    server a {self.net.addr('a')}:{p['host']}\n"
               f"listen s3\n    mode tcp\n    bind {bridge}:{p['s3-fwd']}\n    server s 127.0.0.1:{self.weed.port}\n"
               f"listen llm\n    mode tcp\n    bind {bridge}:{p['llm-fwd']}\n"
               f"    server f 127.0.0.1:{p['fake-model']}\n")
        (self.root / "haproxy.cfg").write_text(cfg)
        proc = self.procs.spawn("haproxy", [str(HAPROXY), "-f", str(self.root / "haproxy.cfg"), "-db"],
                                dict(os.environ))
        _wait_port(p["lb"], 20, lambda: proc.poll() is None)

    def _gateway(self) -> None:
        """Enterprise Gateway in namespace k (tests/egkit.py: process kernels of this interpreter),
        under a tmpfs for the kernels' files that no app host sees."""
        self.kernel_files.mkdir()
        mount = f"mount -t tmpfs -o size=512m ddkernels {shlex.quote(str(self.kernel_files))}"
        prefix = [_tool("ip"), "netns", "exec", self.net.ns("k"), _tool("unshare"), "-m", "--propagation", "private",
                  "/bin/sh", "-c", f'{mount} && exec "$@"', "sh"]
        self.ports["gateway"] = free_port()
        self.eg = start_gateway(self.root / "eg", self.net.addr("k"), self.ports["gateway"], prefix)
        self.gateway = self.eg.url

    @property
    def gateway_headers(self) -> dict[str, str]:
        return self.eg.headers()

    def _template(self) -> None:
        """The home every host starts from (a copy in its tmpfs), and the hosts' environment."""
        from datadesk.store.layout import Layout
        from datadesk.store.workspaces import ensure_demo_workspace

        template = self.root / "template"
        layout = Layout(template)
        data = layout.workspace_data_dir("demo")
        data.mkdir(parents=True)
        shutil.copy(self.demo_warehouse / "warehouse.duckdb", data / "warehouse.duckdb")
        ensure_demo_workspace(layout)
        (template / "datadesk.toml").write_text(SETTINGS.format(
            turns=self.limits["turns"], kernels=self.limits["kernels"], gateway=self.gateway,
            kernel_files=self.kernel_files, kernel_user=KERNEL_USER))
        self.home.mkdir()
        bridge = self.net.addr("root")
        store = self.bucket.env()
        common = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                  "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}", "DATADESK_SECRET_KEY": SECRET_KEY,
                  "AWS_ACCESS_KEY_ID": store["AWS_ACCESS_KEY_ID"], "AWS_REGION": store["AWS_REGION"],
                  "AWS_SECRET_ACCESS_KEY": store["AWS_SECRET_ACCESS_KEY"], "DATADESK_STORAGE_URL": self.bucket.url,
                  "DATADESK_LLM_API_KEY": "sk-test", "DATADESK_LLM_MODEL": "fake-model",
                  "DATADESK_GATEWAY_TOKEN": self.eg.token}
        self.host_env = {**common, "DD_TEMPLATE": str(template), "DD_PYTHON": sys.executable,
                         "DATADESK_HOME": str(self.home), "DATADESK_CONFIG": str(self.home / "datadesk.toml"),
                         "DATADESK_CLUSTER_DATABASE_URL": self.db_url.replace("@127.0.0.1:", f"@{bridge}:"),
                         "DATADESK_STORAGE_ENDPOINT": f"http://{bridge}:{self.ports['s3-fwd']}",
                         "DATADESK_LLM_BASE_URL": f"http://{bridge}:{self.ports['llm-fwd']}/v1"}
        self.local_env = {**os.environ, **common, "DATADESK_CLUSTER_DATABASE_URL": self.db_url,
                          "DATADESK_STORAGE_ENDPOINT": self.bucket.endpoint,
                          "DATADESK_CONFIG": str(template / "datadesk.toml")}

    def _open_users(self) -> None:
        """The cluster's user store, in this process (the CLI's own path, minus its start-up)."""
        import msgspec

        from datadesk.composition import open_users
        from datadesk.settings import Settings

        settings = msgspec.convert({"home": str(self.root / "cli-home"),
                                    "cluster": {"database_url": self.db_url, "pool_size": 2},
                                    "server": {"secret_key": SECRET_KEY},
                                    "storage": {"url": self.bucket.url, "endpoint": self.bucket.endpoint}},
                                   Settings, dec_hook=lambda t, o: Path(o))
        self.users, self._close_users = open_users(settings)

    # -- use -----------------------------------------------------------------------------------
    def add_user(self, name: str, code: bool = True) -> str:
        """A user of the demo workspace (python allowed with `code`); their API token."""
        return self.users.add(name, ["demo"], ["code_execution"] if code else [])[1]

    def base(self, name: str) -> str:
        """Host `name` addressed directly, or the balancer: "lb" (all hosts), "lb-a" (A alone)."""
        return f"http://127.0.0.1:{self.ports[name]}" if name.startswith("lb") else self.hosts[name].base

    def sql(self, query: str, params: tuple = ()) -> list[dict]:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def kernel_pids(self) -> list[int]:
        """The kernel processes the gateway runs now (namespace k)."""
        return [pid for pid in self.net.pids("k") if b"ipykernel_launcher" in _cmdline(pid)]

    def restart(self, name: str) -> None:
        """Host `name` back: its link up, a fresh process on a fresh home."""
        host = self.hosts[name]
        host.kill()
        self.net.link(name, True)
        host.launch()
        host.wait()

    # -- down ----------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop everything by PID, remove the namespaces, veths, cgroups and files; returns what
        is left (processes alive, ports listening, links or namespaces): empty when clean."""
        left: list[str] = []
        with contextlib.suppress(Exception):
            self._close_users()
        self.procs.stop_all()
        if self.eg is not None:
            self.eg.stop()  # it shuts its kernels down
            left += [f"gateway (pid {self.eg.proc.pid})"] if self.eg.proc.poll() is None else []
        for pid in self.net.pids("k") if self.net.made else []:  # kernels the gateway left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        left += self.procs.alive()
        if self.weed is not None and self.weed.pid:  # nothing of it is kept: no need to wait for its stop
            left += [] if kill_child(self.weed.pid) else [f"seaweedfs (pid {self.weed.pid})"]
            self.weed.pid = 0
        if self.pg is not None and self.pg.pid:
            pid = self.pg.pid
            self.pg.stop()
            left += [f"postgres (pid {pid})"] if Path(f"/proc/{pid}").exists() else []
        for cap in self.caps:
            try:
                cap.remove()
            except RuntimeError as exc:
                left.append(str(exc))
        self.net.remove()
        left += [f"link or namespace {n}" for n in self.net.leftovers()]
        ours = set(self.ports.values()) | ({self.weed.port} if self.weed else set())
        left += [f"port {p} still listens" for p in sorted(ours & listening_ports())]
        shutil.rmtree(self.root, ignore_errors=True)
        return left
