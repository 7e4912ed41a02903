"""A text file read whole, for the readers of a tool's text (an upload or a paste in a shape
only they read: Markdown, HTML, vertical records, a Python repr, a JSON envelope ...).

    read_text(path, limits) -> str     at most `limits.text_bytes`; UTF-8 (a BOM allowed)
"""

from __future__ import annotations

import codecs
from pathlib import Path

from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.limits import UploadLimits


def read_text(path: Path, limits: UploadLimits) -> str:
    """The file's text; LimitExceeded past `limits.text_bytes`, TabularParseError naming the
    byte and line that is not UTF-8."""
    size = Path(path).stat().st_size
    if size > limits.text_bytes:
        raise limits.refuse_text(size)
    data = Path(path).read_bytes()
    bom = 3 if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = bom + err.start
        line = data.count(b"\n", 0, at) + 1
        raise TabularParseError(f"file is not UTF-8 at byte {at} (line {line}, byte 0x{data[at]:02X}); "
                                "save it as UTF-8") from None
