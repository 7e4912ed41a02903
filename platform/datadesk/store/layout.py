"""Where things live under `$DATADESK_HOME` (DESIGN section 3).

Every id is validated before it becomes part of a path, so a hostile id can
never name a file outside its owner's directory.
"""

from __future__ import annotations

from pathlib import Path

from datadesk.domain.ids import check_id


class Layout:
    """Paths of the data directory. Pure: creates nothing."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home).resolve()

    @property
    def users_file(self) -> Path:
        return self.home / "users.json"

    @property
    def sessions_file(self) -> Path:
        return self.home / "sessions.json"

    @property
    def workspaces_dir(self) -> Path:
        return self.home / "workspaces"

    def workspace_dir(self, ws: str) -> Path:
        return self.workspaces_dir / check_id(ws, "workspace")

    def workspace_config(self, ws: str) -> Path:
        return self.workspace_dir(ws) / "workspace.toml"

    def workspace_data_dir(self, ws: str) -> Path:
        """The warehouse directory: the only place SQL may read."""
        return self.workspace_dir(ws) / "data"

    def user_dir(self, ws: str, uid: str) -> Path:
        return self.workspace_dir(ws) / "users" / check_id(uid, "user")

    def threads_dir(self, ws: str, uid: str) -> Path:
        return self.user_dir(ws, uid) / "threads"

    def thread_dir(self, ws: str, uid: str, tid: str) -> Path:
        return self.threads_dir(ws, uid) / check_id(tid, "thread")
