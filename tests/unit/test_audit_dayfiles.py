"""The embedded audit log's reader against a plain reading of the same lines: over several days,
at any block size, with torn last lines, blank lines and long lines, every filter and every cursor
give exactly the entries, newest first, that a filter over the whole log in reverse gives."""

from __future__ import annotations

import io
import random

import msgspec
import pytest

from datadesk.audit.dayfiles import DayFiles, lines_before
from datadesk.audit.event import AuditEvent, AuditFilter

_encode = msgspec.json.Encoder().encode
T0 = 1_790_000_000.0


def _events(rnd: random.Random, n: int) -> list[AuditEvent]:
    return [AuditEvent(ts=T0 + i * 1800, action=rnd.choice(["query", "download"]),
                       outcome=rnd.choice(["ok", "ok", "error"]), user=rnd.choice(["ann", "bo", "cy"]),
                       sql=("x" * rnd.choice([1, 50, 900])) + ' "user":"ann" ' + str(i)) for i in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_lines_before_gives_every_whole_line_at_any_block_size(seed: int) -> None:
    rnd = random.Random(seed)
    lines = [b"y" * rnd.choice([0, 3, 40, 300]) + str(i).encode() if rnd.random() > 0.1 else b"" for i in range(60)]
    data = b"".join(line + b"\n" for line in lines) + (b"torn" * rnd.randrange(3))
    want, off = [], 0
    for line in lines:
        if line.strip():
            want.append((off, line))
        off += len(line) + 1
    block = rnd.randint(1, 400)
    got = [(o, raw) for o, raw, _ in lines_before(io.BytesIO(data), None, block)]
    assert got == want[::-1]
    needle = [b"7"]
    got = [(o, raw) for o, raw, _ in lines_before(io.BytesIO(data), None, block, needle) if raw is not None]
    assert [g for g in got if b"7" in g[1]] == [w for w in want[::-1] if b"7" in w[1]]
    if want:
        k = rnd.randrange(len(want))
        got = [(o, raw) for o, raw, _ in lines_before(io.BytesIO(data), want[k][0], block)]
        assert got == want[:k][::-1]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("flt", [AuditFilter(), AuditFilter(user="ann"), AuditFilter(outcome="error", user="cy"),
                                 AuditFilter(action="download", since=T0 + 50 * 1800, until=T0 + 250 * 1800)])
def test_pages_match_a_plain_filter_of_the_whole_log(tmp_path, monkeypatch, seed: int, flt: AuditFilter) -> None:
    import datadesk.audit.dayfiles as dayfiles

    rnd = random.Random(seed)
    monkeypatch.setattr(dayfiles, "BLOCK", rnd.choice([64, 700, 4096]))
    monkeypatch.setattr(dayfiles, "MAX_SCAN_BYTES", rnd.choice([2_000, 50_000, 10**9]))
    log = DayFiles(tmp_path)
    events = _events(rnd, 300)
    for ev in events:
        log.append(ev)
    assert len(log.days()) > 5  # 300 entries half an hour apart
    got, cursor = [], None
    for _ in range(1000):
        page = log.page(flt, cursor, rnd.choice([1, 7, 50]))
        got += page.entries
        cursor = page.next_cursor
        if cursor is None:
            break
    assert [e.ts for e in got] == [e.ts for e in events[::-1] if flt.matches(e)]
