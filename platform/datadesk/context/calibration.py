"""Token-count calibration per model: tiktoken's estimate versus the provider's count.

After every reply, `observe(model, estimated, reported)` folds the ratio of
the provider's `usage.prompt_tokens` to our raw estimate into an
exponentially weighted average; the factor used is that average plus a
safety margin. Stored in `$DATADESK_HOME/calibration.json`: at most every
WRITE_EVERY_S (the first observation at once), without an fsync. It is an
optimisation that a crash may set back by a few observations; written after every
reply, with an fsync, on the event loop, it was one of the larger stalls under load.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec

from datadesk.store.files import read_json, write_json

ALPHA = 0.3  # weight of the newest observation
WRITE_EVERY_S = 30.0


class ModelCalibration(msgspec.Struct):
    ratio: float
    samples: int = 0


class Calibration:
    def __init__(self, path: Path, margin: float) -> None:
        self.path = path
        self.margin = margin
        self._lock = threading.Lock()
        self._written_at = 0.0
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
            now = time.monotonic()
            if cal.samples == 1 or now - self._written_at >= WRITE_EVERY_S:
                self._written_at = now
                try:
                    write_json(self.path, self._data, sync=False)
                except OSError:
                    pass  # calibration is an optimisation; never fail a turn for it
        return cal.ratio * (1 + self.margin)
