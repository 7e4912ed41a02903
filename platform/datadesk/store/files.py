"""Small file primitives: atomic writes and JSON documents."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temp file beside `path`, fsync it, then rename over `path`.

    A reader sees the old file or the new one, never a half-written one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    write_atomic(path, msgspec.json.format(msgspec.json.encode(obj), indent=2) + b"\n", mode)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        return default
