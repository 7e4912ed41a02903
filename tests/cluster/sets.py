"""What the conformance suites share: `Hosts`, the instances of one set that a test makes (each
another worker on the embedded set, another host with its own pool on the cluster set), the
`hosts` fixture over both sets, a holder process to kill, and the report of measured delays."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETS = ["embedded", "cluster"]
REPORT = os.environ.get("DATADESK_TURNS_REPORT")  # a file to append the measured delays to (JSON lines)

T = TypeVar("T")


class Hosts:
    """The hosts of one set (`kind`: "embedded" or "cluster"). On the cluster set `url` and `db`
    are the test's fresh, migrated database and `database(...)` is another host's own pool on
    it. A suite subclasses this with the maker of its area's instances; `close()` closes what
    they were handed to `closing` first, then the hosts' pools."""

    def __init__(self, kind: str, request: Any, tmp_path: Path) -> None:
        self.kind = kind
        self._made: list = []
        self._dbs: list = []
        if kind == "cluster":
            self.url = request.getfixturevalue("cluster_db_url")
            self.db = request.getfixturevalue("cluster_db")

    def database(self, name: str, max_size: int) -> Any:
        """A new pool on the test's database: what another host would open."""
        from datadesk.cluster.database import Database  # imported here: the embedded set runs without psycopg

        db = Database(self.url, max_size=max_size, name=name)
        self._dbs.append(db)
        return db

    def closing(self, part: T) -> T:
        """`part` (anything with `close()`), closed with the hosts."""
        self._made.append(part)
        return part

    def close(self) -> None:
        for part in self._made:
            part.close()
        for db in self._dbs:
            db.close()


def hosts_fixture(make: Callable[[str, Any, Path], Hosts]) -> Any:
    """A suite's `hosts` fixture: `make(kind, request, tmp_path)` for each set, closed after the
    test (`hosts = hosts_fixture(MyHosts)` in the suite's module)."""

    @pytest.fixture(params=SETS)
    def hosts(request, tmp_path):
        h = make(request.param, request, tmp_path)
        yield h
        h.close()

    return hosts


def report_delays(name: str, values: list[float], kind: str) -> None:
    """Append the median, p95 and max of `values` (seconds) to $DATADESK_TURNS_REPORT, if set."""
    if REPORT and values:
        with open(REPORT, "a") as fh:
            fh.write(json.dumps({"name": name, "kind": kind, "n": len(values),
                                 "p50_ms": round(statistics.median(values) * 1000, 1),
                                 "p95_ms": round(sorted(values)[max(0, int(len(values) * 0.95) - 1)] * 1000, 1),
                                 "max_ms": round(max(values) * 1000, 1)}) + "\n")


@contextlib.contextmanager
def process(script: str, *args: str) -> Iterator[subprocess.Popen]:
    """`python -c script` with `args`, then the platform and project folders (for its sys.path)
    as its last two arguments; its stdout piped, as text. Killed when the block leaves it alive."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args, str(ROOT / "platform"), str(ROOT)],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill(proc)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`, as when its host goes (nothing of its own runs), and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
