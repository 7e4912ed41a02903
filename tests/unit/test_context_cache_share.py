"""The provider prefix cache over the 30-turn thread of bench/context.py (issue 18, item 5).

Not a timed test: the share is counted in tokens (message-by-message shared prefix of
consecutive requests), so it is the same on any machine. Today's window (results
compacted by age) and the append-only one are measured in the same run; the history
budget is held at every request (asserted inside the benchmark).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_context", ROOT / "bench" / "context.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_context"] = module
    spec.loader.exec_module(module)
    return module


def share(bench, tmp_path: Path, **kw) -> float:
    return bench.prefix_cache(tmp_path, 30, 32_000, chunked=True, **kw)["weighted_prefix_ratio"]


def test_append_only_caches_at_least_80_percent_of_every_model_call(bench, tmp_path: Path) -> None:
    today = share(bench, tmp_path, append_only=False, every_step=True)
    append = share(bench, tmp_path, append_only=True, every_step=True)
    assert append >= 0.80 and append > today + 0.1, (append, today)


def test_first_requests_only_also_gain(bench, tmp_path: Path) -> None:
    today = share(bench, tmp_path, append_only=False)
    append = share(bench, tmp_path, append_only=True)
    assert today == pytest.approx(0.536, abs=0.005)  # the figure, same run
    assert append > today + 0.1, (append, today)


def test_the_preamble_is_best_after_the_system_message(bench, tmp_path: Path) -> None:
    start = share(bench, tmp_path, append_only=True, every_step=True, preamble="start")
    end = share(bench, tmp_path, append_only=True, every_step=True, preamble="end")
    assert start >= 0.80 and start > end, (start, end)
