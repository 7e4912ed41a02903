"""The house style of charts, run inside the kernel (issue 32); never imported by the app.

`sandbox/kernel_setup.py` hands this file's source to ipykernel as a start-up line, so it must
stay self-contained: only the standard library and IPython (loaded by then) at the top level.
The idle kernel stays small: nothing here imports matplotlib or altair. A post-import hook on
`sys.meta_path` applies the rest when the code first imports them:

- matplotlib: a palette that reads on light and dark backgrounds, axis numbers with thousands
  separators (never an offset like "1e6" or scientific notation), and `ax.legend()` without a
  `loc` (or with "best") placed outside the plot, to the right; saved files are cropped
  "tight" so that such a legend stays in.
- altair: the "mimetype" renderer, so a chart comes back as its Vega-Lite spec.
- every figure the kernel shows carries a second bundle entry, `FIGURE_MIME`: its title and a
  dark-theme rendering of the same figure (the colours of text, axes and frames swapped for the
  dark theme, drawn again, then restored), which the chat shows in dark mode.
"""

import base64
import math
import sys

FIGURE_MIME = "application/vnd.datadesk.figure+json"
PALETTE = ["#3d7fe0", "#ef8a2b", "#2ba58b", "#e05a5c", "#9b6bd6", "#c08f00", "#d9679f", "#7d8a99"]
DARK = {"bg": "#1c2027", "ink": "#e3e7ee", "muted": "#9aa4b2", "grid": "#3a414c"}
RC = {
    "axes.prop_cycle": None,  # set from PALETTE once cycler is importable
    "axes.formatter.useoffset": False,
    "axes.formatter.limits": (-7, 15),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "savefig.bbox": "tight",
    "figure.figsize": (7.0, 4.2),
}


# --------------------------------------------------------------------------- import hook


class _AfterImport:
    """Runs `hooks[name](module)` right after the module `name` is first imported."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            try:
                hook(module)
            except Exception as exc:  # a style that fails must never break the import
                print(f"datadesk chart style not applied ({name}): {exc}", file=sys.stderr)

        loader.exec_module = exec_module
        return spec


# --------------------------------------------------------------------------- matplotlib


def _style_matplotlib(mpl):
    from cycler import cycler

    rc = dict(RC, **{"axes.prop_cycle": cycler(color=PALETTE)})
    mpl.rcParams.update(rc)
    mpl.rcParamsDefault.update(rc)  # plt.style.use("default") keeps the house style


def _thousands_formatter(ticker):
    class Thousands(ticker.ScalarFormatter):
        """Tick labels with thousands separators and as many decimals as the tick step needs."""

        def __init__(self):
            super().__init__(useOffset=False)
            self.set_scientific(False)

        def set_locs(self, locs):
            self.tick_values = [float(v) for v in locs]  # Formatter.locs is deprecated in 3.11
            super().set_locs(locs)

        def __call__(self, x, pos=None):
            locs = [v for v in getattr(self, "tick_values", []) if math.isfinite(v)]
            step = min((abs(b - a) for a, b in zip(locs, locs[1:]) if b != a), default=abs(x) or 1.0)
            decimals = 0  # as many as the step needs: 2.5 apart is "2.5", "5.0", "7.5"
            while decimals < 12 and abs(round(step, decimals) - step) > step * 1e-6:
                decimals += 1
            if abs(x) < step / 1e6:
                x = 0.0
            return f"{x:,.{decimals}f}"

        def get_offset(self):
            return ""

    return Thousands


def _style_scale(scale):
    import matplotlib.ticker as ticker

    thousands = _thousands_formatter(ticker)
    default = scale.LinearScale.set_default_locators_and_formatters

    def set_default_locators_and_formatters(self, axis):
        default(self, axis)
        if type(axis.get_major_formatter()) is ticker.ScalarFormatter:
            axis.set_major_formatter(thousands())

    scale.LinearScale.set_default_locators_and_formatters = set_default_locators_and_formatters


def _style_axes(axes):
    import functools

    legend = axes.Axes.legend

    @functools.wraps(legend)  # pyplot checks the wrapped method's __qualname__
    def outside_legend(self, *args, **kwargs):
        if kwargs.get("loc") in (None, "best", 0) and "bbox_to_anchor" not in kwargs:
            kwargs.update(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        return legend(self, *args, **kwargs)

    axes.Axes.legend = outside_legend


def _style_altair(alt):
    alt.renderers.enable("mimetype")


# --------------------------------------------------------------------------- the dark variant


def _luminance(color):
    from matplotlib.colors import to_rgba

    r, g, b, a = to_rgba(color)
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) if a > 0 else None


def _swap(undo, get, set_, pick):
    """Set the colour `pick(current)` returns (None: keep it); remember how to undo it."""
    try:
        current = get()
    except Exception:
        return
    if isinstance(current, str) or (hasattr(current, "__len__") and len(current) in (3, 4)):
        new = pick(current)
        if new is not None:
            set_(new)
            undo.append((set_, current))


def _dark(color, light_to):
    lum = _luminance(color)
    return None if lum is None else (light_to if lum > 0.85 else None)


def _ink(color):
    lum = _luminance(color)
    return DARK["ink"] if lum is not None and lum < 0.35 else None


def _darken(fig, undo):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    gridlines = set()
    for ax in fig.axes:
        gridlines.update(ax.xaxis.get_gridlines())
        gridlines.update(ax.yaxis.get_gridlines())
    for artist in fig.findobj():
        if isinstance(artist, Text):
            _swap(undo, artist.get_color, artist.set_color, _ink)
        elif artist in gridlines:
            _swap(undo, artist.get_color, artist.set_color, lambda c: DARK["grid"])
        elif isinstance(artist, Line2D):
            _swap(undo, artist.get_color, artist.set_color, _ink)
            _swap(undo, artist.get_markeredgecolor, artist.set_markeredgecolor, _ink)
        elif isinstance(artist, Patch):
            _swap(undo, artist.get_facecolor, artist.set_facecolor, lambda c: _dark(c, DARK["bg"]))
            _swap(undo, artist.get_edgecolor, artist.set_edgecolor,
                  lambda c: DARK["muted"] if (_luminance(c) or 1) < 0.35 else _dark(c, DARK["grid"]))
    _swap(undo, fig.get_facecolor, fig.set_facecolor, lambda c: DARK["bg"])


def _title(fig):
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text().strip():
        return sup.get_text().strip()
    for ax in fig.axes:
        for loc in ("center", "left", "right"):
            text = ax.get_title(loc=loc).strip()
            if text:
                return text
    return None


def figure_bundle(fig):
    """The `FIGURE_MIME` entry of a figure's display: its title and its dark-theme PNG."""
    from IPython.core.pylabtools import print_figure

    try:
        from matplotlib_inline.config import InlineBackend

        kwargs = dict(InlineBackend.instance().print_figure_kwargs)
    except Exception:
        kwargs = {"bbox_inches": "tight"}
    out = {"title": _title(fig)}
    undo = []
    try:
        _darken(fig, undo)
        png = print_figure(fig, "png", **kwargs)
        if png:
            out["dark"] = base64.b64encode(png).decode("ascii")
    finally:
        for set_, value in reversed(undo):
            set_(value)
    return out


def _register_figure_bundle():
    from IPython import get_ipython
    from IPython.core.formatters import JSONFormatter
    from traitlets import Unicode

    shell = get_ipython()
    if shell is None:
        return

    class FigureFormatter(JSONFormatter):
        format_type = Unicode(FIGURE_MIME)

    formatter = FigureFormatter(parent=shell.display_formatter)
    # by the base class: the inline backend drops every formatter's entry for Figure itself
    formatter.for_type_by_name("matplotlib.figure", "FigureBase", figure_bundle)
    shell.display_formatter.formatters[FIGURE_MIME] = formatter


def install():
    hooks = {"matplotlib": _style_matplotlib, "matplotlib.scale": _style_scale,
             "matplotlib.axes": _style_axes, "altair": _style_altair}
    for name in [n for n in hooks if n in sys.modules]:  # imported before this ran
        hooks.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport(hooks))
    _register_figure_bundle()


if __name__ == "_datadesk_style":  # run by kernel_setup.py's start-up line, not on import
    install()
