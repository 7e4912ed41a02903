"""The kernel's chart house style (sandbox/kernel_style.py), its parts run here without being
installed (installing would restyle matplotlib for the whole test process)."""

from __future__ import annotations

import io

import pytest

from datadesk.sandbox.kernel_setup import STYLE_FILE, setup_line

mpl = pytest.importorskip("matplotlib")
mpl.use("agg")


def _style() -> dict:
    ns: dict = {"__name__": "kernel_style_under_test"}  # not "_datadesk_style": nothing installed
    exec(compile(STYLE_FILE.read_text(), str(STYLE_FILE), "exec"), ns)
    return ns


@pytest.mark.parametrize("locs, labels", [
    ([0, 2.5, 5, 7.5], ["0.0", "2.5", "5.0", "7.5"]),
    ([1e6, 2e6, 3e6], ["1,000,000", "2,000,000", "3,000,000"]),
    ([0, 0.25, 0.5], ["0.00", "0.25", "0.50"]),
    ([1000.5, 1001.0], ["1,000.5", "1,001.0"]),
])
def test_tick_labels_have_separators_and_the_decimals_the_step_needs(locs, labels) -> None:
    import matplotlib.ticker as ticker

    fmt = _style()["_thousands_formatter"](ticker)()
    fmt.set_locs(locs)
    assert [fmt(v) for v in locs] == labels and fmt.get_offset() == ""


def test_the_dark_variant_is_dark_and_the_figure_is_left_as_it_was() -> None:
    from matplotlib.figure import Figure
    from PIL import Image, ImageStat

    fig = Figure()
    ax = fig.subplots()
    ax.plot([1, 2, 3], color="#3d7fe0")
    ax.set_title("Daily")
    before = (fig.get_facecolor(), ax.get_facecolor(), ax.title.get_color(), ax.spines["left"].get_edgecolor())
    out = _style()["figure_bundle"](fig)
    assert out["title"] == "Daily"
    import base64

    with Image.open(io.BytesIO(base64.b64decode(out["dark"]))) as im:
        assert sum(ImageStat.Stat(im.convert("L")).mean) < 80
    assert (fig.get_facecolor(), ax.get_facecolor(), ax.title.get_color(),
            ax.spines["left"].get_edgecolor()) == before


def test_the_setup_line_is_one_statement_in_a_namespace_of_its_own() -> None:
    line = setup_line()
    assert line.startswith("exec(compile(") and "'__name__': '_datadesk_style'" in line
    compile(line, "<line>", "exec")
