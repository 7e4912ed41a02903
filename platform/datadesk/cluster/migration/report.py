"""What a migration run found and did (`Report`), and the rows and keys that copying and
verifying compute the same way."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from datadesk.cluster.objects.artifacts import PgArtifactStore
from datadesk.cluster.migration.filehome import FileThread, regular
from datadesk.cluster.threads import jsonb_text
from datadesk.domain.artifacts import Artifact
from datadesk.domain.users import User
from datadesk.store.interfaces.artifacts import ThreadKey


MIGRATED_FILE = "migrated.json"  # composition.py refuses a file-mode server on a home holding it


Progress = Callable[[str, int, int], None]  # (stage, done, total)


class HomeInUse(RuntimeError):
    """A worker or a turn holds the home (the message names which), or another migrate runs."""


@dataclass
class Report:
    """What a run found and did. `counts`: what the home holds (as copied or compared);
    `written`: rows and objects this run wrote; `kept`: left as the cluster has them;
    `notes`: what the home holds that is not copied (a torn tail, an unreadable file);
    `differences`: what verify found different."""

    home: str
    database: str
    storage: str
    verify: bool = False
    counts: Counter = field(default_factory=Counter)
    written: Counter = field(default_factory=Counter)
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.differences

    def wrote(self, what: str, n: int = 1) -> None:
        if n:
            self.written[what] += n

    def summary(self, limit: int = 50) -> str:
        what = "verified" if self.verify else "migrated"
        lines = [f"{what} {self.home} -> {self.database}, {self.storage} in {self.seconds:.1f} s",
                 "home: " + _counts(self.counts)]
        if not self.verify:
            lines.append("written now: " + (_counts(self.written) or "nothing (already there)"))
        for title, items in (("not copied", self.notes), ("kept as the cluster has it", self.kept),
                             ("DIFFERENT", self.differences)):
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines += [f"  {item}" for item in items[:limit]]
                if len(items) > limit:
                    lines.append(f"  ... and {len(items) - limit} more")
        if self.verify:
            lines.append("verify: clean" if self.ok else f"verify: {len(self.differences)} difference(s)")
        else:
            lines.append(f"{self.home}/{MIGRATED_FILE} written: a file-mode server now refuses this home; "
                         "check the copy with `datadesk migrate --verify`")
        return "\n".join(lines)


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counter.items()) if v)


def same_user(have: User, want: User) -> bool:
    """Whether the cluster's user is the home's as `import_user` copies it (times to the
    database's microseconds; a revoked user's tokens revoked)."""
    if ((have.id, have.name, list(have.workspaces), list(have.permissions), have.revoked)
            != (want.id, want.name, list(want.workspaces), list(want.permissions), want.revoked)
            or abs(have.created - want.created) >= 1e-3 or len(have.tokens) != len(want.tokens)):
        return False
    return all((h.id, h.hash, h.revoked) == (w.id, w.hash, w.revoked or want.revoked)
               and abs(h.created - w.created) < 1e-3 for h, w in zip(have.tokens, want.tokens))


def artifact_row(tk: ThreadKey, art: Artifact, data_key: str | None, orig_key: str | None) -> dict[str, Any]:
    """The `artifacts` row of `art` as `PgArtifactStore.save` writes it."""
    return {"ws": tk.workspace, "uid": tk.user, "tid": tk.thread, "aid": art.id, "meta": jsonb_text(art),
            "kind": art.kind, "status": art.status, "live": art.available and art.is_cache,
            "bytes": art.stored_bytes, "deliv": art.bytes if art.kind == "deliverable" and art.available else 0,
            "data_key": data_key, "orig_key": orig_key, "created": art.created, "last_used": art.last_used}


def artifact_keys(ft: FileThread, art: Artifact) -> tuple[str | None, str | None, list[tuple[str, Path]]]:
    """(data key, original key, [(key, local file)]) of an artifact: an available one's data
    and an upload's kept original (when its file is there); a tombstone has none."""
    if not art.available:
        return None, None, []
    tk = ThreadKey(ft.ws, ft.uid, ft.tid)
    folder = ft.dir / "artifacts"
    data_key = PgArtifactStore.object_key(tk, art)
    files = [(data_key, folder / art.file)]
    orig_key = PgArtifactStore.original_key(tk, art)
    if orig_key is not None and art.original and "/" not in art.original and regular(folder / art.original):
        files.append((orig_key, folder / art.original))
    else:
        orig_key = None  # no kept original (or it is gone): the row names none, as `save` does
    return data_key, orig_key, files

