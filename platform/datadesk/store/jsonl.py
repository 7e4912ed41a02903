"""Reading a JSON-lines file from its end: the one tail reader of the store.

Thread logs and context manifests grow with the thread; the newest entries are what a
turn needs, so they are read backwards block by block and the cost is the distance from
the end, not the length of the file. A torn last line (no trailing newline: a crash
mid-write) is never returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

BLOCK = 64 * 1024


def lines_from_end(path: Path, block: int = BLOCK) -> Iterator[bytes]:
    """Complete, non-blank lines of `path`, newest first (a torn last line is skipped)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(0, os.SEEK_END)
        pos = fh.tell()
        buf = b""
        first_block = True
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            buf = fh.read(pos - start) + buf
            pos = start
            lines = buf.split(b"\n")
            # lines[0] may be partial unless the start of the file was reached
            buf = lines[0] if pos > 0 else b""
            complete = lines[1:] if pos > 0 else lines
            if first_block:
                # the last element is the torn line (or b"" after a final newline)
                complete = complete[:-1]
                first_block = False
            for raw in reversed(complete):
                if raw.strip():
                    yield raw


def last_newline_end(fh, size: int, block: int = BLOCK) -> int:
    """Offset just after the last b"\\n" of an open binary file of `size` bytes (0 if none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        chunk = fh.read(pos - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            return start + idx + 1
        pos = start
    return 0
