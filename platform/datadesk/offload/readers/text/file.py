"""A text file read whole, for the readers of a tool's text (an upload or a paste in a shape
only they read: Markdown, HTML, vertical records, a Python repr, a JSON envelope ...).

    read_text(path, limits) -> str     at most `limits.text_bytes`; in the encoding its bytes say

The encoding is sniffed as for a CSV file (`csv.encoding`: UTF-8 with or without its BOM,
UTF-16 by its BOM or its NULs, else Windows-1252), so a Markdown table saved by Excel or a
Windows tool reads as its CSV would.
"""

from __future__ import annotations

from pathlib import Path

from datadesk.offload.readers.csv.encoding import UTF8, bom_length, sniff_encoding, stream_encoding
from datadesk.offload.readers.errors import TabularParseError
from datadesk.offload.readers.limits import UploadLimits

_HEAD = 1 << 16


def read_text(path: Path, limits: UploadLimits) -> str:
    """The file's text; LimitExceeded past `limits.text_bytes`, TabularParseError naming the
    byte and line its encoding cannot decode."""
    size = Path(path).stat().st_size
    if size > limits.text_bytes:
        raise limits.refuse_text(size)
    data = Path(path).read_bytes()
    head = data[:_HEAD]
    encoding = sniff_encoding(head, len(data) <= _HEAD) or UTF8
    skip = bom_length(head, encoding)
    codec = stream_encoding(head, encoding)
    return decode_file(data, skip, codec)


def decode_file(data: bytes, skip: int, codec: str = UTF8) -> str:
    """`data` after its first `skip` bytes (a BOM) decoded; TabularParseError naming the byte
    and line `codec` cannot decode."""
    try:
        return data[skip:].decode(codec)
    except UnicodeDecodeError as err:
        at = skip + err.start
        line = data.count(b"\n", 0, at) + 1
        name = "UTF-8" if codec == UTF8 else codec
        raise TabularParseError(f"file is not {name} at byte {at} (line {line}, byte 0x{data[at]:02X}); "
                                "save it as UTF-8") from None
