"""Resource bounds of DuckDB SQL in the app process (issue 15): memory, threads and spill space.

DuckDB runs inside the app process; left at its defaults it may take 80% of
the host's memory, every core and 90% of the free disk (spilling into the
data dir). Every warehouse instance (`warehouse.py`), and each in-memory DuckDB of the
result grid (`offload/grid/pages.py`), gets instead, before `lock_configuration`:

    SET memory_limit='<limits.sql_memory_mb> MB'
    SET threads=<limits.sql_threads>
    SET temp_directory='<home>/tmp/sql/<random>'    outside the data dir
    SET max_temp_directory_size='<limits.sql_temp_mb> MB'

The spill directory is removed once the instance's last connection closes.
Past a limit DuckDB stops the statement; `limit_message` turns its error into
one that names the setting and how to narrow the query.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import duckdb


@dataclass(frozen=True)
class SQLLimits:
    memory_mb: int = 512
    threads: int = 2
    temp_mb: int = 1024
    tmp_root: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "datadesk-sql")

    @classmethod
    def from_settings(cls, limits: object, home: Path) -> "SQLLimits":
        return cls(memory_mb=int(getattr(limits, "sql_memory_mb")), threads=int(getattr(limits, "sql_threads")),
                   temp_mb=int(getattr(limits, "sql_temp_mb")), tmp_root=Path(home) / "tmp" / "sql")

    def statements(self, temp_dir: Path) -> list[str]:
        """The SET statements that bound one instance (run before lock_configuration)."""
        quoted = "'" + str(temp_dir).replace("'", "''") + "'"
        return [f"SET memory_limit='{self.memory_mb}MB'", f"SET threads={self.threads}",
                f"SET temp_directory={quoted}", f"SET max_temp_directory_size='{self.temp_mb}MB'"]

    def new_temp_dir(self) -> Path:
        """A fresh path under tmp_root (DuckDB creates it when it first spills)."""
        self.tmp_root.mkdir(parents=True, exist_ok=True)
        return self.tmp_root / uuid.uuid4().hex


class TempDirs:
    """The spill directory of each shared (per-file) instance and its open connections:
    the directory goes when the last connection closes (the instance closes with it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: dict[str, tuple[Path, int]] = {}

    def fresh(self, key: str, path: Path) -> None:
        """A new instance for `key` was just set up with `path` (an earlier one is gone)."""
        with self._lock:
            old = self._dirs.get(key)
            self._dirs[key] = (path, 1)
        if old is not None and old[0] != path:
            remove_dir(old[0])

    def opened(self, key: str) -> None:
        with self._lock:
            path, count = self._dirs.get(key, (None, 0))
            if path is not None:
                self._dirs[key] = (path, count + 1)

    def closed(self, key: str) -> None:
        with self._lock:
            path, count = self._dirs.get(key, (None, 0))
            if path is None:
                return
            if count > 1:
                self._dirs[key] = (path, count - 1)
                return
            del self._dirs[key]
        remove_dir(path)


def remove_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def limit_message(exc: BaseException, limits: SQLLimits) -> str | None:
    """A clear message when `exc` is DuckDB stopping at a resource limit, else None."""
    text = str(exc)
    if not isinstance(exc, duckdb.OutOfMemoryException) and "Out of Memory" not in text:
        return None
    if "max_temp_directory_size" in text or "temp" in text.lower() and "directory" in text.lower():
        return (f"the query needed more than {limits.temp_mb} MB of temporary disk space "
                "(limits.sql_temp_mb); filter or aggregate in SQL, or add a LIMIT")
    return (f"the query needed more than {limits.memory_mb} MB of memory (limits.sql_memory_mb); "
            "filter or aggregate in SQL (avoid large cross joins, list()/string_agg() over many rows), "
            "or add a LIMIT")
