"""Workspaces: `workspace.toml` and the demo workspace bootstrap.

Keys (documented in docs/sources-and-mcp.md): `name`, `prompt`, `warehouse` (a DuckDB file
inside the workspace, optional), `[views]` (Parquet/CSV files or globs inside
the workspace's data folder, exposed as SQL views), `[mcp.<server>]` (MCP
servers; validated by tools/mcp/manager.py), `[sources.<name>]` (analysts' databases; validated by
datadesk.sources, a bad one is listed as misconfigured), `[tool_permissions]` (extra permission a
tool needs here), `disabled_tools`, and the feature flags `memory`,
`memory_extraction`, `auto_requery`. A bad file fails with the file, the key
and what is wrong.
"""

from __future__ import annotations

import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from datadesk.domain.ids import check_id
from datadesk.store.files import write_atomic
from datadesk.store.layout import Layout


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
        raise WorkspaceConfigError(f"{path}: {exc}") from exc
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


class Workspaces:
    """The workspaces of this home: each one's config, read once and cached (its warehouse and
    databases are `sources.registry.WorkspaceSources`). A bad `workspace.toml` raises
    WorkspaceConfigError when first asked for."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._cache: dict[str, WorkspaceConfig] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        root = self.layout.workspaces_dir
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []

    def config(self, ws: str) -> WorkspaceConfig:
        """The config of workspace `ws`."""
        with self._lock:
            hit = self._cache.get(ws)
            if hit is None:
                hit = self._cache[ws] = load_workspace(self.layout, ws)
            return hit


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
