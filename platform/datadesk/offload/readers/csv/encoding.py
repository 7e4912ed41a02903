"""Which text encoding a delimited file is in, by its bytes: UTF-8 (with or without its BOM),
UTF-16 LE/BE (with a BOM, or without one by the pattern of its NUL bytes) and Windows-1252 (what
Excel's "CSV" writes on Windows in most of Europe); None when the bytes are not text at all.

pyarrow then reads the file in that encoding through its own streaming transcoder
(`ReadOptions(encoding=...)`), so no copy of the file is made and nothing is held whole.
"""

from __future__ import annotations

import codecs
from pathlib import Path

UTF8, UTF8_BOM, UTF16_LE, UTF16_BE, CP1252 = "utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "cp1252"
# What a user may choose on a re-import (the names pyarrow's transcoder and Python both know).
ENCODINGS = (UTF8, UTF8_BOM, "utf-16", UTF16_LE, UTF16_BE, CP1252, "iso-8859-1", "iso-8859-15")
_BOMS = ((codecs.BOM_UTF8, UTF8_BOM), (codecs.BOM_UTF16_LE, UTF16_LE), (codecs.BOM_UTF16_BE, UTF16_BE))
_NUL_PAIRS = 2048  # byte pairs looked at for the NUL pattern of BOM-less UTF-16
_CHUNK = 1 << 20


def bom_of(head: bytes) -> tuple[str | None, int]:
    """(the encoding a byte-order mark says, its length), or (None, 0) without one. UTF-32's
    marks (FF FE 00 00) are not taken for UTF-16's."""
    if head.startswith(b"\xff\xfe\x00\x00") or head.startswith(b"\x00\x00\xfe\xff"):
        return None, 0
    for mark, name in _BOMS:
        if head.startswith(mark):
            return name, len(mark)
    return None, 0


def sniff_encoding(head: bytes, complete: bool) -> str | None:
    """The encoding of a file whose first bytes are `head` (all of it when `complete`), or None
    when it looks binary: UTF-16 by its BOM or its NULs (every other byte of ASCII text), UTF-8
    when the head decodes as UTF-8, else Windows-1252."""
    name, _ = bom_of(head)
    if name is not None:
        return name
    utf16 = _utf16_by_nuls(head)
    if utf16 is not None:
        return utf16
    if b"\x00" in head:
        return None
    try:
        head.decode(UTF8)
        return UTF8
    except UnicodeDecodeError as err:
        if not complete and err.reason == "unexpected end of data" and err.end == len(head):
            return UTF8  # a character cut by the end of the head
    return CP1252


def _utf16_by_nuls(head: bytes) -> str | None:
    """UTF-16 without a BOM: mostly ASCII text has a NUL in every odd (LE) or even (BE) byte."""
    sample = head[: 2 * _NUL_PAIRS]
    pairs = len(sample) // 2
    if pairs < 2:
        return None
    even = sample[0::2][:pairs].count(0)
    odd = sample[1::2][:pairs].count(0)
    if odd >= 0.6 * pairs and even <= 0.02 * pairs:
        return UTF16_LE
    if even >= 0.6 * pairs and odd <= 0.02 * pairs:
        return UTF16_BE
    return None


def bom_length(head: bytes, encoding: str) -> int:
    """Bytes of a byte-order mark at the start that belongs to `encoding` (skipped when read)."""
    name, size = bom_of(head)
    if name is None:
        return 0
    if name == UTF8_BOM and encoding in (UTF8, UTF8_BOM):
        return size
    if name in (UTF16_LE, UTF16_BE) and encoding in ("utf-16", name):
        return size
    return 0


def stream_encoding(head: bytes, encoding: str) -> str:
    """The codec that reads the bytes after the BOM: "utf-16" becomes the byte order its BOM
    (or NUL pattern, else little-endian) says; "utf-8-sig" is UTF-8 once its BOM is skipped."""
    if encoding == "utf-16":
        name, _ = bom_of(head)
        return name if name in (UTF16_LE, UTF16_BE) else (_utf16_by_nuls(head) or UTF16_LE)
    return UTF8 if encoding == UTF8_BOM else encoding


def decode_head(head: bytes, encoding: str, complete: bool) -> str:
    """`head` (after its BOM) as text; a character cut at its end is dropped, and bytes the
    encoding cannot map become U+FFFD (reading the file then names the byte)."""
    if not complete and encoding in (UTF16_LE, UTF16_BE) and len(head) % 2:
        head = head[:-1]
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    return decoder.decode(head, final=complete)


def first_bad_byte(path: Path, encoding: str, start: int = 0) -> tuple[int, int] | None:
    """(byte offset, line) of the first byte `encoding` cannot decode in the file from `start`,
    streaming; None when all of it decodes."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    base, lines = start, 1
    with open(path, "rb") as fh:
        fh.seek(start)
        while True:
            chunk = fh.read(_CHUNK)
            final = not chunk
            try:
                text = decoder.decode(chunk, final=final)
            except UnicodeDecodeError as err:
                # the decoder holds back at most a few bytes of a cut sequence: err.start is in `chunk`
                # after those, so the offset is close enough to name the place
                return base + err.start, lines + chunk[: err.start].count(b"\n")
            lines += text.count("\n")
            base += len(chunk)
            if final:
                return None
