"""Search over a user's threads: what the API asks (`SearchIndex`), what the thread store
tells the index (`SearchIndexer`), the hit and the errors.

- `SearchIndex.search(owner, workspaces, text, limit)`: the best matches in the caller's own
  threads of those workspaces, at most a few per thread, best first. Thread titles match
  as `seq` 0. The user's text is reduced to words (every word must occur, `"a b"` is a
  phrase, `word*` a prefix, the last word a prefix), never parsed as the engine's syntax.
  A query's cost is bounded (length, terms, rows, a deadline).
- `SearchIndexer`: the thread store calls `indexed_append(thread, record)` after a
  committed append and `indexed_reset(thread, drop)` after a clear (`drop` False) or a
  delete (True). Both are best effort: an index is derived, never the truth, and the next
  search catches up with whatever a crash or an error left out.

Implementations: `store.search` (embedded: a SQLite FTS5 file per user and workspace;
`ThreadSearch` and `FileSearchIndexer`) and `cluster.search.PgSearch` (PostgreSQL full
text over the `records` table; one object is both).

Errors: `BadSearchQuery` (empty, too long, too many terms, an unbalanced quote, a bad
limit; API: 400) and its subclass `SearchTooCostly` (the query ran past its deadline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from datadesk.domain.records import Record


class BadSearchQuery(ValueError):
    """The search text cannot be searched (empty, too long, too many terms, unbalanced quote)."""


class SearchTooCostly(BadSearchQuery):
    """The query ran past its deadline: the words are too common or too short."""


@dataclass
class SearchHit:
    """One matching record (or title, `seq` 0) of one thread."""

    thread: str
    workspace: str
    title: str
    seq: int
    role: str
    ts: float
    updated: float
    snippet: str
    highlights: list[tuple[int, int]]  # [start, end) character offsets of the matched words in `snippet`


class SearchIndex(Protocol):
    """Full-text search over one user's threads, across the workspaces they name."""

    def search(self, owner: str, workspaces: list[str], text: str, limit: int = 20) -> list[SearchHit]:
        """The best matches of `text` in `owner`'s threads of `workspaces`, best first;
        `BadSearchQuery` for a text or limit that cannot be searched."""
        ...


class SearchIndexer(Protocol):
    """What a thread store tells the search index (best effort: errors are logged, not raised)."""

    def indexed_append(self, thread: Any, record: Record) -> None:
        """`record` was committed to `thread`."""
        ...

    def indexed_reset(self, thread: Any, drop: bool) -> None:
        """`thread` was cleared (`drop` False: its title stays searchable) or deleted (True)."""
        ...
