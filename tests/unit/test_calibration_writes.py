"""The calibration file is written at the first observation, then at most every WRITE_EVERY_S."""

from __future__ import annotations

import json

from datadesk.context import calibration
from datadesk.context.calibration import Calibration


def test_first_observation_is_written_then_writes_are_spaced(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    cal = Calibration(path, margin=0.05)
    cal.observe("m", 1000, 1300)
    assert json.loads(path.read_text())["m"]["samples"] == 1
    cal.observe("m", 1000, 1300)
    assert json.loads(path.read_text())["m"]["samples"] == 1  # kept in memory, used at once
    assert cal._data["m"].samples == 2
    monkeypatch.setattr(calibration, "WRITE_EVERY_S", 0.0)
    cal.observe("m", 1000, 1300)
    assert json.loads(path.read_text())["m"]["samples"] == 3
    assert Calibration(path, margin=0.05).factor("m", 1.0) == cal.factor("m", 1.0)
