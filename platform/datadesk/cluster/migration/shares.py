"""`datadesk migrate`: the shares of a file home (`workspaces/<ws>/shares/<sid>.json`) copied
into the cluster's `shares` table, by id, like the rest of the copy (migration/copy.py): a
missing row is written; a row that differs is made equal to the home while the home is the
truth (`fill` False), else left as the cluster has it and listed as kept."""

from __future__ import annotations

import os
from typing import Iterator

from datadesk.cluster.database import Database
from datadesk.cluster.migration.report import Report
from datadesk.cluster.shares import PgShares
from datadesk.domain.ids import ID_PATTERN
from datadesk.domain.shares import Share
from datadesk.store.interfaces.shares import ShareStoreError
from datadesk.store.layout import Layout
from datadesk.store.shares import FileShares

_UPDATE = ("UPDATE shares SET workspace = %s, owner = %s, thread = %s, kind = %s, title = %s, created = %s,"
           " revoked = %s WHERE id = %s")


def home_shares(layout: Layout, notes: list[str]) -> Iterator[Share]:
    """Every readable share of the home; an unreadable file is noted, not copied."""
    root = layout.workspaces_dir
    if not root.is_dir():
        return
    files = FileShares(layout)
    for ws in sorted(p.name for p in root.iterdir() if p.is_dir() and ID_PATTERN.fullmatch(p.name)):
        folder = root / ws / "shares"
        if not folder.is_dir():
            continue
        with os.scandir(folder) as entries:
            sids = sorted(e.name[:-5] for e in entries if e.name.endswith(".json") and ID_PATTERN.fullmatch(e.name[:-5]))
        for sid in sids:
            try:
                share = files.get(sid, [ws])
            except ShareStoreError as exc:
                notes.append(str(exc))
                continue
            if share is not None:
                yield share


def copy_shares(layout: Layout, db: Database, report: Report, fill: bool) -> None:
    """The home's shares into the `shares` table (module doc)."""
    rows = PgShares(db)
    for share in home_shares(layout, report.notes):
        report.counts["shares"] += 1
        have = rows.get(share.id, [share.workspace])
        if have == share:
            continue
        if have is None and not _exists(db, share.id):
            rows.add(share)
            report.wrote("shares")
        elif fill:
            report.kept.append(f"share {share.id} differs in the cluster: left as it is")
        else:
            with db.connection() as conn:
                conn.execute(_UPDATE, (share.workspace, share.owner, share.thread, share.kind, share.title,
                                       share.created, share.revoked, share.id))
            report.wrote("shares")


def _exists(db: Database, sid: str) -> bool:
    with db.connection() as conn:
        return conn.execute("SELECT 1 FROM shares WHERE id = %s", (sid,)).fetchone() is not None
