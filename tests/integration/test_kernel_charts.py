"""Charts from a real kernel (issue 32): an Altair chart comes back as a Vega-Lite chart artifact
with its spec and title, a too-large spec is refused with what to do instead, a raw spec dict
works, and matplotlib figures get the house style (thousands separators, legend outside) and a
dark-theme variant. Docker kernels (the image has altair); the house style also on the local
kernel (the host has matplotlib, not altair)."""

from __future__ import annotations

import io
import json

import pytest

from tests.integration.test_sandbox import sandbox_settings
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox

ALTAIR = """\
import altair as alt, pandas as pd
df = pd.DataFrame({"day": pd.date_range("2024-01-01", periods=30).astype(str),
                   "sales": [1000 * i for i in range(30)], "region": ["north", "south"] * 15})
alt.Chart(df).mark_line().encode(x="day:T", y="sales:Q", color="region:N",
                                 tooltip=["day:T", "sales:Q"]).properties(title="Daily sales by region")
"""

TOO_LARGE = """\
import altair as alt, pandas as pd, numpy as np
alt.data_transformers.disable_max_rows()
df = pd.DataFrame({"x": np.arange(60_000), "y": np.random.default_rng(1).normal(size=60_000)})
alt.Chart(df).mark_point().encode(x="x:Q", y="y:Q")
"""

RAW_SPEC = """\
from IPython.display import display
display({"application/vnd.vegalite.v5+json": {
    "data": {"values": [{"k": "a", "v": 3}, {"k": "b", "v": 5}]},
    "mark": "bar", "encoding": {"x": {"field": "k", "type": "nominal"},
                                "y": {"field": "v", "type": "quantitative", "aggregate": "sum"}}}}, raw=True)
"""

URL_SPEC = """\
from IPython.display import display
display({"application/vnd.vegalite.v5+json": {"data": {"url": "https://example.com/x.csv"}, "mark": "bar"}},
        raw=True)
"""

MATPLOTLIB = """\
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([0, 1, 2], [1_000_000, 2_500_000, 3_000_000], label="sales")
ax.plot([0, 1, 2], [1_200_000, 2_000_000, 2_800_000], label="costs")
ax.legend()
ax.set_title("Revenue by day")
fig.canvas.draw()
print("ticks", [t.get_text() for t in ax.get_yticklabels()][1:3])
print("offset", repr(ax.yaxis.get_offset_text().get_text()))
box, axbox = ax.get_legend().get_window_extent(), ax.get_window_extent()
print("legend outside", box.x0 >= axbox.x1)
plt.show()
"""


def _png_mean(data: bytes) -> float:
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(data)) as im:
        return sum(ImageStat.Stat(im.convert("L")).mean)


def _figure_checks(rt, c, r) -> None:
    assert not r.is_error, r.content
    assert "ticks ['1,250,000', '1,500,000']" in r.content or "ticks ['1,000,000'" in r.content, r.content
    assert "offset ''" in r.content and "legend outside True" in r.content, r.content
    meta = r.meta
    assert meta.images and len(meta.images) == 1, r.content
    light_id = meta.images[0]
    dark_id = (meta.dark_images or {}).get(light_id)
    assert dark_id, f"no dark variant: {meta}"
    light, dark = rt.artifacts.load(c.thread, light_id), rt.artifacts.load(c.thread, dark_id)
    assert light.title == "Revenue by day" and light.dark_variant == dark_id and dark.variant_of == light_id
    assert f'"Revenue by day"' in r.content and dark_id not in r.content, r.content
    lum_light = _png_mean(rt.artifacts.data_path(c.thread, light).read_bytes())
    lum_dark = _png_mean(rt.artifacts.data_path(c.thread, dark).read_bytes())
    assert lum_light > 200 and lum_dark < 80, (lum_light, lum_dark)


@pytest.mark.docker
def test_altair_chart_comes_back_as_a_vega_lite_artifact(tmp_path) -> None:
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("docker", exec_timeout_s=60))
    c = ctx(rt, tid="charts")

    async def body():
        return [await py(rt, c, code) for code in (ALTAIR, TOO_LARGE, RAW_SPEC, URL_SPEC, MATPLOTLIB)]

    chart, large, raw, url, figure = run_with(rt, body)
    assert not chart.is_error, chart.content
    assert chart.meta.charts and len(chart.meta.charts) == 1, chart.content
    art = rt.artifacts.load(c.thread, chart.meta.charts[0])
    assert art.format == "vega-lite" and art.title == "Daily sales by region"
    assert art.media_type.startswith("application/vnd.vegalite.v"), art.media_type
    spec = json.loads(rt.artifacts.data_path(c.thread, art).read_text())
    assert "line" in json.dumps(spec.get("mark") or spec), sorted(spec)
    assert sum(len(v) for v in spec["datasets"].values()) == 30, sorted(spec)
    assert '"Daily sales by region" (Vega-Lite, 30 data rows)' in chart.content, chart.content
    assert "VegaLite" not in chart.content, chart.content  # Altair's text/plain stand-in is not output

    assert not large.meta.charts, large.content
    assert "aggregate first" in large.content and "limit 1,000,000 bytes" in large.content, large.content

    assert raw.meta.charts, raw.content
    assert rt.artifacts.load(c.thread, raw.meta.charts[0]).title == "sum of v by k"
    assert not url.meta.charts and "its data names a url" in url.content, url.content
    _figure_checks(rt, c, figure)


@pytest.mark.docker
def test_the_house_style_keeps_the_idle_kernel_small(tmp_path) -> None:
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("docker"))
    c = ctx(rt, tid="idle")
    code = ("import sys\nprint('loaded:', [m for m in ('matplotlib', 'altair', 'pandas') if m in sys.modules], "
            "[k for k in globals() if 'datadesk' in k or 'style' in k])")
    r = run_with(rt, lambda: py(rt, c, code))
    assert "loaded: [] []" in r.content, r.content


def test_matplotlib_house_style_on_the_local_kernel(tmp_path) -> None:
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("local", allow_unsafe_local=True))
    c = ctx(rt, tid="mpl")

    async def body():
        return [await py(rt, c, code) for code in (MATPLOTLIB, SAVE_THEN_SHOW)]

    shown, saved = run_with(rt, body)
    _figure_checks(rt, c, shown)
    # save-then-show: the file is the one chart, and it carries the shown figure's title and dark copy
    assert not saved.is_error, saved.content
    assert len(saved.meta.images) == 1, saved.content
    art = rt.artifacts.load(c.thread, saved.meta.images[0])
    assert art.origin.filename == "daily.png" and art.title == "Daily kWh", art
    assert art.dark_variant and saved.meta.dark_images == {art.id: art.dark_variant}
    assert saved.content.count("artifact a") == 1, saved.content  # the dark copy is not named to the model


SAVE_THEN_SHOW = """import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.bar(["mon", "tue"], [12_500, 14_200])
ax.set_title("Daily kWh")
fig.savefig("/outputs/daily.png")
plt.show()
"""
