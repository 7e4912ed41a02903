"""One image per figure: a displayed figure that is a PNG the same execution saved is dropped."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from datadesk.tools.figures import not_saved  # noqa: E402


def _png(fig, **kw) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **kw)
    return buf.getvalue()


def _chart(values, kind="line"):
    fig, ax = plt.subplots(figsize=(7, 3))
    (ax.plot if kind == "line" else ax.bar)(np.arange(len(values)), values)
    ax.set_title("Daily energy use (kWh)")
    return fig


def test_save_then_show_keeps_one_image_and_other_figures_stay() -> None:
    x = np.arange(100)
    daily = _chart(np.sin(x / 10))
    saved = _png(daily, dpi=80)  # fig.savefig("/outputs/daily.png", dpi=80)
    shown = _png(daily, dpi=72, bbox_inches="tight")  # what the inline backend displays
    other = _png(_chart(np.cos(x / 7)), dpi=72, bbox_inches="tight")
    bars = _png(_chart(np.arange(12), "bar"), dpi=72, bbox_inches="tight")
    assert not_saved([shown], [saved]) == []
    assert not_saved([shown, other, bars], [saved]) == [other, bars]
    assert not_saved([other], [saved]) == [other]
    assert not_saved([shown, shown], [saved]) == [shown]  # one file accounts for one image
    assert not_saved([shown], []) == [shown] and not_saved([b"not a png"], [saved]) == [b"not a png"]
    # save A, show only a different B: B is no copy of a file and stays (never a lost chart)
    assert not_saved([b"x"], [saved]) == [b"x"]
    assert not_saved([shown, other], [saved]) == [other]
    plt.close("all")
