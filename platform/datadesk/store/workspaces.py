"""Workspaces: `workspace.toml` (prompt, warehouse) and the demo workspace bootstrap.

The full configuration (MCP servers, feature flags, per-tool permissions)
arrives with a later issue; this module reads what the skeleton needs and
fails with the file, the key and the problem when something is wrong.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from datadesk.domain.ids import check_id
from datadesk.store.files import write_atomic
from datadesk.store.layout import Layout


class WorkspaceConfigError(ValueError):
    """A bad `workspace.toml`: the message names the file, the key and the problem."""


class WorkspaceConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str = ""
    prompt: str = ""
    warehouse: str = "data/warehouse.duckdb"  # relative to the workspace directory
    disabled_tools: list[str] = msgspec.field(default_factory=list)  # hidden from the model here
    memory: bool = False  # long-term memory for this workspace (users also need the permission)
    memory_extraction: bool = False  # background extraction of candidate facts (off by default)


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
    return cfg


def warehouse_path(layout: Layout, ws: str, cfg: WorkspaceConfig) -> Path:
    return layout.workspace_dir(ws) / cfg.warehouse


def _toml_str(value: str) -> str:
    return '"""\n' + value.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""'


def ensure_demo_workspace(layout: Layout, ws: str = "demo") -> bool:
    """Create the demo workspace (config + deterministic warehouse) if missing. True if created."""
    from datadesk.store.demo import create_demo_warehouse, demo_workspace_prompt

    check_id(ws, "workspace")
    data_dir = layout.workspace_data_dir(ws)
    created = False
    if not (data_dir / "warehouse.duckdb").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        create_demo_warehouse(data_dir)
        created = True
    cfg_path = layout.workspace_config(ws)
    if not cfg_path.exists():
        text = (
            f'name = "Demo: office energy"\n'
            f'warehouse = "data/warehouse.duckdb"\n'
            f"prompt = {_toml_str(demo_workspace_prompt())}\n"
        )
        write_atomic(cfg_path, text.encode("utf-8"))
        created = True
    return created
