"""The store's side of "corrections win": a named correction the user made supersedes at
once; what nobody named, or what the user did not make, is a conflict for the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.memory.store import FactNotFound, MemoryStore
from datadesk.settings import MemorySettings
from datadesk.store.layout import Layout

WS, UID = "demo", "dana"


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(Layout(tmp_path / "var"), MemorySettings())


def status(store: MemoryStore, fid: str) -> str:
    return store.get(WS, UID, fid).status


def test_a_user_correction_supersedes_the_named_fact_at_once(store: MemoryStore) -> None:
    blue = store.remember(WS, UID, "Charts in blue")
    green = store.remember(WS, UID, "Charts in green", replaces=blue.id, user_correction=True)
    assert green.status == "active" and green.supersedes == [blue.id]
    old = store.get(WS, UID, blue.id)
    assert old.status == "superseded" and old.superseded_by == green.id  # kept for the audit
    assert [f.text for f in store.active(WS, UID)] == ["Charts in green"]


def test_contradicts_names_several_facts(store: MemoryStore) -> None:
    a = store.remember(WS, UID, "Charts in blue")
    b = store.remember(WS, UID, "Bar charts use navy")
    c = store.remember(WS, UID, "Charts in green", contradicts=[a.id, b.id], user_correction=True)
    assert c.status == "active" and sorted(c.supersedes) == sorted([a.id, b.id])
    assert status(store, a.id) == status(store, b.id) == "superseded"
    with pytest.raises(FactNotFound, match="to contradict"):
        store.remember(WS, UID, "Charts in red", contradicts=["fnope"], user_correction=True)


def test_without_the_users_word_a_named_fact_makes_a_conflict(store: MemoryStore) -> None:
    blue = store.remember(WS, UID, "Charts in blue")
    green = store.remember(WS, UID, "Charts in green", contradicts=[blue.id])
    assert green.status == "conflict" and green.conflicts_with == blue.id and status(store, blue.id) == "active"
    kept = store.resolve(WS, UID, green.id, "new")
    assert kept.status == "active" and status(store, blue.id) == "superseded"


def test_the_rule_still_guards_what_was_not_named(store: MemoryStore) -> None:
    english = store.remember(WS, UID, "Reports are in English")
    blue = store.remember(WS, UID, "Charts in blue")
    new = store.remember(WS, UID, "Reports should be in Chinese", replaces=blue.id, user_correction=True)
    # the model named the wrong fact: the rule sees the contradiction with English, the user decides
    assert new.status == "conflict" and new.conflicts_with == english.id
    assert status(store, blue.id) == "active" and status(store, english.id) == "active"
