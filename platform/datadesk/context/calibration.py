"""Token-count calibration per model: tiktoken's estimate versus the provider's count.

After every reply, `observe(model, estimated, reported)` folds the ratio of
the provider's `usage.prompt_tokens` to our raw estimate into an
exponentially weighted average; the factor used is that average plus a
safety margin. Stored in `$DATADESK_HOME/calibration.json`.
"""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec

from datadesk.store.files import read_json, write_json

ALPHA = 0.3  # weight of the newest observation


class ModelCalibration(msgspec.Struct):
    ratio: float
    samples: int = 0


class Calibration:
    def __init__(self, path: Path, margin: float) -> None:
        self.path = path
        self.margin = margin
        self._lock = threading.Lock()
        raw = read_json(path, {}) or {}
        try:
            self._data = msgspec.convert(raw, dict[str, ModelCalibration])
        except msgspec.ValidationError:
            self._data = {}

    def factor(self, model: str, initial: float) -> float:
        """Multiply tiktoken counts by this for `model` (profile default until observed)."""
        cal = self._data.get(model)
        if cal is None or cal.samples == 0:
            return initial
        return cal.ratio * (1 + self.margin)

    def observe(self, model: str, estimated_raw: int, reported: int) -> float:
        if estimated_raw <= 0 or reported <= 0:
            return self.factor(model, 1.0)
        ratio = reported / estimated_raw
        if not 0.2 < ratio < 5:  # nonsense usage (e.g. a cached-only count): ignore it
            return self.factor(model, 1.0)
        with self._lock:
            cal = self._data.get(model)
            if cal is None or cal.samples == 0:
                cal = ModelCalibration(ratio=ratio, samples=1)
            else:
                cal = ModelCalibration(ratio=(1 - ALPHA) * cal.ratio + ALPHA * ratio, samples=cal.samples + 1)
            self._data[model] = cal
            try:
                write_json(self.path, self._data)
            except OSError:
                pass  # calibration is an optimisation; never fail a turn for it
        return cal.ratio * (1 + self.margin)
