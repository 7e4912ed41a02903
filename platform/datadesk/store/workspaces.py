"""Workspaces: `workspace.toml` and the demo workspace bootstrap.

Keys (documented in docs/sources-and-mcp.md): `name`, `prompt`, `warehouse` (a DuckDB file
inside the workspace, optional), `[views]` (Parquet/CSV files or globs inside
the workspace's data folder, exposed as SQL views), `[mcp.<server>]` (MCP
servers; validated by tools/mcp/manager.py), `[sources.<name>]` (analysts' databases; validated by
datadesk.sources, a bad one is listed as misconfigured), `[tool_permissions]` (extra permission a
tool needs here), `disabled_tools`, and the feature flags `memory`,
`memory_extraction`, `auto_requery`. A bad file fails with the file, the key
and what is wrong. An edited file takes effect without a restart (`Workspaces.config`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import msgspec

from datadesk.domain.ids import check_id
from datadesk.store.files import write_atomic
from datadesk.store.layout import Layout


log = logging.getLogger(__name__)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class WorkspaceConfigError(ValueError):
    """A bad `workspace.toml`: the message names the file, the key and the problem."""


class WorkspaceConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str = ""
    prompt: str = ""
    warehouse: str = "data/warehouse.duckdb"  # relative to the workspace directory
    disabled_tools: list[str] = msgspec.field(default_factory=list)  # hidden from the model here
    memory: bool = False  # long-term memory for this workspace (users also need the permission)
    memory_extraction: bool = False  # background extraction of candidate facts (off by default)
    auto_requery: bool | None = None  # restore expired artifacts automatically (None: server setting)
    views: dict[str, str] = msgspec.field(default_factory=dict)  # view name -> data file or glob
    mcp: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)  # server name -> config table
    # source name -> config table; validated by datadesk.sources (a bad one is shown, never fatal)
    sources: dict[str, Any] = msgspec.field(default_factory=dict)
    tool_permissions: dict[str, str] = msgspec.field(default_factory=dict)  # tool -> required permission


def load_workspace(layout: Layout, ws: str) -> WorkspaceConfig:
    path = layout.workspace_config(ws)
    if not path.is_file():
        return WorkspaceConfig(name=ws)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise WorkspaceConfigError(f"{path}: invalid TOML: {exc}") from exc
    try:
        cfg = msgspec.convert(raw, WorkspaceConfig)
    except msgspec.ValidationError as exc:
        raise WorkspaceConfigError(f"{path}: {_keyed(str(exc))}") from exc
    wh = Path(cfg.warehouse)
    if wh.is_absolute() or ".." in wh.parts:
        raise WorkspaceConfigError(f"{path}: key 'warehouse' must be a path inside the workspace, got {cfg.warehouse!r}")
    for view, target in cfg.views.items():
        if not _IDENT.fullmatch(view):
            raise WorkspaceConfigError(f"{path}: key 'views.{view}': a view name must be a plain identifier")
        t = Path(target)
        if t.is_absolute() or ".." in t.parts or not str(t).startswith("data/"):
            raise WorkspaceConfigError(
                f"{path}: key 'views.{view}' must be a file or glob under data/, got {target!r}")
        if t.suffix.lower() not in (".parquet", ".csv", ".tsv"):
            raise WorkspaceConfigError(f"{path}: key 'views.{view}' must end in .parquet, .csv or .tsv")
    for tool, perm in cfg.tool_permissions.items():
        if perm not in ("code_execution", "memory", "admin"):
            raise WorkspaceConfigError(f"{path}: key 'tool_permissions.{tool}': unknown permission {perm!r} "
                                       "(code_execution, memory or admin)")
    for server in cfg.mcp:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", server):
            raise WorkspaceConfigError(f"{path}: key 'mcp.{server}': server names are 1-32 letters, digits, _ or -")
    return cfg


def _keyed(message: str) -> str:
    """msgspec's message with the key it is about first: "key 'views.x': Expected `str`, got `int`"."""
    unknown = re.fullmatch(r"Object contains unknown field `([^`]+)`(?: - at `\$(.*)`)?", message)
    if unknown:
        where = (unknown.group(2) or "").lstrip(".")
        return f"key '{where + '.' if where else ''}{unknown.group(1)}': not a key of workspace.toml here"
    at = re.fullmatch(r"(.*) - at `\$\.?(.*)`", message)
    if at and at.group(2):
        return f"key '{at.group(2).replace('[...]', '')}': {at.group(1)}"
    return message


CHECK_INTERVAL_S = 1.0  # a workspace.toml is looked at (one stat) at most this often per workspace


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What says a file changed, cheaply: (mtime_ns, size, inode); None when it is not there."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class _Loaded:
    """One workspace's config as this process holds it (under `Workspaces._lock`)."""

    __slots__ = ("cfg", "signature", "checked", "error")

    def __init__(self, cfg: WorkspaceConfig | None, signature: Any, checked: float, error: str | None) -> None:
        self.cfg = cfg  # the last good config (None: the file was never good)
        self.signature = signature  # of the file as last read (good or not)
        self.checked = checked  # monotonic time of the last look at the file
        self.error = error  # why the file as it is now is not used (the last good config is)


class Workspaces:
    """The workspaces of this home and each one's config (its warehouse and databases are
    `sources.registry.WorkspaceSources`).

    A config is re-read when its `workspace.toml` changed: `config()` looks at the file (one stat
    of mtime, size and inode) at most every `check_interval_s` seconds per workspace, so an edit
    takes effect without a restart; callers that built something from a config (sources, MCP
    servers) compare the object they built from with `config()`'s, which stays the same object
    while the file is unchanged. A file that becomes invalid (or goes away) does not replace the
    last good config: that one is still served and `error(ws)` says what is wrong (file, key,
    problem), logged once per change of the file. A file that was never good raises
    WorkspaceConfigError. `check(path, cfg)` validates more (the MCP tables: composition.py).
    Safe from any thread: one caller looks at the file while the others get the config they had."""

    def __init__(self, layout: Layout, check: Callable[[Path, WorkspaceConfig], None] | None = None,
                 check_interval_s: float = CHECK_INTERVAL_S) -> None:
        self.layout = layout
        self.check = check
        self.check_interval_s = check_interval_s
        self._cache: dict[str, _Loaded] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        root = self.layout.workspaces_dir
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []

    def config(self, ws: str) -> WorkspaceConfig:
        """The config of workspace `ws`: the file's, re-read when it changed, else the last good one."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(ws)
            if hit is not None and now - hit.checked < self.check_interval_s:
                return self._served(ws, hit)
            if hit is not None and hit.cfg is not None:
                hit.checked = now  # this caller looks at the file; the others keep the config meanwhile
        if hit is None or hit.cfg is None:
            with self._lock:  # the first read (or a file never good): the callers wait for it
                hit = self._cache.get(ws)
                if hit is None or hit.cfg is None and now - hit.checked >= self.check_interval_s:
                    hit = self._cache[ws] = self._read(ws, hit, now)
                return self._served(ws, hit)
        fresh = self._read(ws, hit, now)
        with self._lock:
            self._cache[ws] = fresh
            return self._served(ws, fresh)

    def error(self, ws: str) -> str | None:
        """Why `ws`'s workspace.toml as it is now is not used (the last good config is), else None."""
        with self._lock:
            hit = self._cache.get(ws)
        return hit.error if hit is not None else None

    @staticmethod
    def _served(ws: str, hit: _Loaded) -> WorkspaceConfig:
        if hit.cfg is None:
            raise WorkspaceConfigError(hit.error or f"workspace {ws!r} has no config")
        return hit.cfg

    def _read(self, ws: str, hit: _Loaded | None, now: float) -> _Loaded:
        """The config after one look at the file: the same entry when it did not change, a new
        one read from it when it did; a bad file keeps the last good config, with its error."""
        path = self.layout.workspace_config(ws)
        sig = _signature(path)
        if hit is not None and sig == hit.signature:
            return _Loaded(hit.cfg, sig, now, hit.error)
        last = hit.cfg if hit is not None else None
        try:
            if sig is None and last is not None:
                raise WorkspaceConfigError(f"{path}: the file is gone")
            cfg = load_workspace(self.layout, ws)
            if self.check is not None:
                self.check(path, cfg)
        except WorkspaceConfigError as exc:
            if last is not None:
                log.error("workspace %s: %s; the last good config is still in use", ws, exc)
            else:
                log.error("workspace %s: %s", ws, exc)
            return _Loaded(last, sig, now, str(exc))
        if last is not None:
            log.info("workspace %s: %s changed; its config is reloaded", ws, path)
        return _Loaded(cfg, sig, now, None)


def _toml_str(value: str) -> str:
    return '"""\n' + value.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""'


DEMO_SKILLS = {
    "monthly-energy-report": """\
How to compute and present the monthly energy report of the office buildings (holidays excluded).

1. Scope: the calendar month the user names (default: the last complete month in `readings`).
2. Exclude public holidays and weekends from working-day figures: join `holidays` on
   `CAST(ts AS DATE) = holidays.date` and drop those days; keep a separate all-days total.
3. Per building: total kWh, kWh per m2 (`buildings.floor_area_m2`), mean working-day kWh,
   and the change against the same month of the previous year when the data has it.
4. Compute over the FULL data: aggregate in SQL, or load the artifact with the python tool;
   never from a preview.
5. Present: one Markdown table sorted by kWh per m2 (descending), the three notable findings
   (largest change, worst intensity, any meter gaps: NULL kWh hours), and one bar chart
   following the chart-style skill. State that holidays were excluded and which ones.
""",
    "chart-style": """\
The house style for matplotlib charts (titles, colours, units, sizes).

- Figure size 10 x 5 inches, dpi 120; one message per chart; no 3D, no pie charts.
- Title: what and when, e.g. "Energy use per building, March 2024 (holidays excluded)".
- Axis labels with units: kWh, kWh/m2, degC. Thousands separators on the axis.
- Colours: the primary series #1f4e79; comparison #f28e2b; highlight #e15759; grey #9e9e9e
  for context. Never rely on colour alone: label the highlighted bar.
- Bars sorted by value; horizontal bars when there are more than 8 categories.
- Remove the top and right spines; light grid on the value axis only.
- Show the chart with plt.show(); also save it to /outputs/<name>.png when the user wants a file.
""",
}


def ensure_demo_skills(layout: Layout, ws: str = "demo") -> None:
    for name, text in DEMO_SKILLS.items():
        path = layout.workspace_dir(ws) / "skills" / name / "SKILL.md"
        if not path.exists():
            write_atomic(path, text.encode("utf-8"))


def ensure_demo_workspace(layout: Layout, ws: str = "demo", memory: bool = False) -> bool:
    """Create the demo workspace (config + deterministic warehouse) if missing. True if created.
    `memory`: the new config turns long-term memory on (as `datadesk serve` makes it)."""
    from datadesk.store.demo import create_demo_warehouse, demo_workspace_prompt

    check_id(ws, "workspace")
    data_dir = layout.workspace_data_dir(ws)
    created = False
    if not (data_dir / "warehouse.duckdb").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        create_demo_warehouse(data_dir)
        created = True
    ensure_demo_skills(layout, ws)
    cfg_path = layout.workspace_config(ws)
    if not cfg_path.exists():
        text = (
            f'name = "Demo: office energy"\n'
            f'warehouse = "data/warehouse.duckdb"\n'
            + ("memory = true\n" if memory else "")  # `serve` turns it on: the demo shows memory working
            + f"prompt = {_toml_str(demo_workspace_prompt())}\n"
        )
        write_atomic(cfg_path, text.encode("utf-8"))
        created = True
    return created
