"""A log append on a disk that fills up: the record is whole or absent, no seq is used, and the
error names the file and the reason (issue 25). The full disk is a file size limit
(RLIMIT_FSIZE, in a child process): the kernel takes part of a write and fails the rest, as a
full disk does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from datadesk.domain.records import Record
from datadesk.store.threadlog import ThreadLog

CHILD = textwrap.dedent('''
    import json, resource, signal, sys, time
    sys.path.insert(0, sys.argv[3])
    from pathlib import Path
    from datadesk.domain.records import Record
    from datadesk.store.files import StoreWriteError
    from datadesk.store.threadlog import ThreadLog
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal, as ENOSPC would be
    log = ThreadLog(Path(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    out = []
    for size in (100, 352_000, 50):
        try:
            rec = log.append(lambda seq: Record(seq=seq, role="assistant", ts=time.time(), content="x" * size))
            out.append(["ok", rec.seq])
        except StoreWriteError as exc:
            out.append(["error", str(exc)])
    print(json.dumps(out))
''')


def test_a_short_write_leaves_the_log_as_it_was_and_uses_no_seq(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    ThreadLog(path).append(lambda seq: Record(seq=seq, role="user", ts=1.0, content="hello"))
    limit = path.stat().st_size + 40_000  # room for the small answers, not for the 352,000 characters
    platform = str(Path(__file__).resolve().parents[2] / "platform")
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(limit), platform], capture_output=True,
                         text=True, check=True)
    results = json.loads(out.stdout)
    assert results[0] == ["ok", 2]
    assert results[1][0] == "error"
    assert "the file size limit was reached" in results[1][1] and "record 3 (the assistant's answer, 352,000 " \
        "characters)" in results[1][1] and str(path) in results[1][1]
    assert results[2] == ["ok", 3]  # the failed record used no seq
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and len(raw) < limit
    records = list(ThreadLog(path))
    assert [r.seq for r in records] == [1, 2, 3] and [len(r.content) for r in records] == [5, 100, 50]
    assert not (tmp_path / "log.torn").exists()  # nothing torn was left to repair
