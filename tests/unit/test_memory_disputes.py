"""A fact in an unresolved conflict reaches the model labelled disputed (issue 31): the older,
active fact is injected with the newer text quoted and the advice to ask, never as settled."""

from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.domain.memory import DISPUTES_SHOWN, render_memory_block
from datadesk.memory.store import MemoryStore
from datadesk.store.layout import Layout

WS, UID = "demo", "dana"


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(Layout(tmp_path))


def entries(block: str) -> list[str]:
    return [ln for ln in block.splitlines() if ln.startswith("- [")]


def test_the_older_fact_is_labelled_with_the_newer_text(store: MemoryStore) -> None:
    old = store.remember(WS, UID, "Reports are in English")
    new = store.remember(WS, UID, "Reports should be in   Chinese")
    other = store.remember(WS, UID, "Energy is in kWh")
    assert new.status == "conflict"
    block = store.block(WS, UID)
    assert entries(block) == [
        f"- [{old.id}] (fact) Reports are in English (disputed: a newer memory says \"Reports should be in "
        "Chinese\" and the user has not chosen which holds; ask them before relying on either; they "
        "resolve it in the memory panel)",
        f"- [{other.id}] (fact) Energy is in kWh",
    ]
    assert [f.id for f in store.active(WS, UID)] == [old.id, other.id]  # the conflict itself never acts


@pytest.mark.parametrize("keep,acts", [("new", ["Reports should be in Chinese"]),
                                       ("old", ["Reports are in English"]),
                                       ("both", ["Reports are in English", "Reports should be in Chinese"])])
def test_once_resolved_no_label_is_left(store: MemoryStore, keep: str, acts: list[str]) -> None:
    store.remember(WS, UID, "Reports are in English")
    new = store.remember(WS, UID, "Reports should be in Chinese")
    store.resolve(WS, UID, new.id, keep)
    block = store.block(WS, UID)
    assert "disputed" not in block, block
    assert sorted(ln.split(") ", 1)[1] for ln in entries(block)) == sorted(acts)


def test_a_forgotten_conflict_no_longer_disputes(store: MemoryStore) -> None:
    store.remember(WS, UID, "Timezone = UTC")
    new = store.remember(WS, UID, "Timezone: Europe/Paris")
    assert "disputed" in store.block(WS, UID)
    store.forget(WS, UID, new.id)
    assert "disputed" not in store.block(WS, UID)


def test_a_conflict_of_another_project_does_not_dispute_here(store: MemoryStore) -> None:
    old = store.remember(WS, UID, "Reports are in English")
    store.remember(WS, UID, "Use heating degree days", scope="project:clientB", replaces=old.id)
    assert "disputed" in store.block(WS, UID, project="clientB")
    assert "disputed" not in store.block(WS, UID, project="clientA")
    assert "disputed" not in store.block(WS, UID)


def test_many_newer_texts_are_bounded_newest_first(tmp_path: Path) -> None:
    ticks = iter(range(1_000, 2_000))
    store = MemoryStore(Layout(tmp_path), clock=lambda: float(next(ticks)))
    old = store.remember(WS, UID, "Timezone = UTC")
    zones = ["Europe/Paris", "Asia/Tokyo", "America/Lima", "Africa/Cairo", "Europe/Oslo"]
    for zone in zones:
        assert store.remember(WS, UID, f"Timezone: {zone}").status == "conflict"
    (line,) = entries(render_memory_block(store.facts(WS, UID), now=5_000.0))
    assert line.startswith(f"- [{old.id}] (fact) Timezone = UTC (disputed: a newer memory says")
    shown = [z for z in zones if z in line]
    assert sorted(shown, key=line.index) == zones[-DISPUTES_SHOWN:][::-1], line
    assert f"(and {len(zones) - DISPUTES_SHOWN} more)" in line
