"""One image per figure (issue 19): the common save-then-show pattern

    fig.savefig("/outputs/daily.png"); plt.show()

gives the same chart twice, as the file the code wrote and as the image the kernel displayed
(at another dpi, cropped "tight" by the inline backend, so never the same bytes; the inline
backend also shows every open figure at the end of a cell, with or without `plt.show()`). The
file is the one the user asked for, so the displayed copy is dropped when it shows the same
picture as one of the files (each file accounts for one displayed image); the file then gets
the displayed figure's title and dark-theme variant (`saved_copies` says which file it is). A
displayed chart that no file shows is always kept: a duplicate is better than a lost chart.

"The same picture": both are cropped to their content (what is not background), and compared
at 32x32 in greyscale: aspect ratios within 3%, and the pixel difference under half of the ink
(the non-white) they hold. Measured on line and bar charts: the same figure at another dpi and
crop differs by 0.18-0.27 of its ink (antialiasing of text and thin lines), another chart of
the same size by 0.84 and more; two charts that differ only by a hair count as one. Anything
that cannot be decoded is kept: an image is dropped only when it surely is a duplicate.
"""

from __future__ import annotations

import io
import logging
from typing import Sequence

log = logging.getLogger(__name__)

SIZE = 32
MAX_RATIO_DIFF = 0.03
MAX_INK_DIFF = 0.5
MAX_DECODE_BYTES = 20 << 20
MAX_PIXELS = 40_000_000


def _signature(data: bytes) -> tuple[float, list[int]] | None:
    try:
        from PIL import Image, ImageChops

        if len(data) > MAX_DECODE_BYTES:
            return None
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > MAX_PIXELS:
                return None
            grey = im.convert("L")
        box = ImageChops.invert(grey).point(lambda v: 255 if v > 24 else 0).getbbox()
        if box:
            grey = grey.crop(box)
        w, h = grey.size
        if not w or not h:
            return None
        return w / h, list(grey.resize((SIZE, SIZE), Image.Resampling.BOX).tobytes())
    except Exception:  # not an image PIL reads, or no PIL: keep it
        log.debug("figure signature failed", exc_info=True)
        return None


def _same(a: tuple[float, list[int]], b: tuple[float, list[int]]) -> bool:
    if abs(a[0] - b[0]) / max(a[0], b[0]) > MAX_RATIO_DIFF:
        return False
    ink = (sum(255 - x for x in a[1]) + sum(255 - y for y in b[1])) / 2
    if ink <= 0:
        return a[1] == b[1]
    return sum(abs(x - y) for x, y in zip(a[1], b[1])) / ink < MAX_INK_DIFF


def saved_copies(images: Sequence[bytes], saved: Sequence[bytes]) -> dict[int, int]:
    """Which displayed `images` are the picture of one of the `saved` PNG files: {image index:
    file index} (each file accounts for one displayed image)."""
    if not images or not saved:
        return {}
    files = [(i, s) for i, s in enumerate(_signature(d) for d in saved) if s is not None]
    copies: dict[int, int] = {}
    for n, data in enumerate(images):
        sig = _signature(data) if files else None
        match = next((k for k, (_, f) in enumerate(files) if sig is not None and _same(sig, f)), None)
        if match is not None:
            copies[n] = files.pop(match)[0]
    return copies


def not_saved(images: Sequence[bytes], saved: Sequence[bytes]) -> list[bytes]:
    """The displayed `images` that are not the picture of one of the `saved` PNG files (each
    file accounts for one displayed image)."""
    copies = saved_copies(images, saved)
    return [data for n, data in enumerate(images) if n not in copies]
