"""Charts the python tool saves (issue 32): Vega-Lite specs the kernel displayed, and the title
and dark-theme variant of each matplotlib figure.

A Vega-Lite chart (an Altair chart, or `display({"application/vnd.vegalite.v5+json": spec},
raw=True)`) is kept only when it is a JSON object that looks like a Vega-Lite spec, carries its
data inline (a `url` would make the browser fetch from elsewhere) and fits `MAX_SPEC_BYTES`
with its data; otherwise the model is told why, and to aggregate first when it is too large.
The chat renders the saved spec with vega-embed (web/js/charts.js).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from datadesk.domain.artifacts import Artifact
from datadesk.offload.artifacts.quota import QuotaExceeded
from datadesk.sandbox.base import ChartOutput

MAX_SPEC_BYTES = 1_000_000
CHART_FORMAT = "vega-lite"
CHART_EXT = "vljson"  # never ".json": <aid>.json is the artifact's metadata, and list() reads *.json
VIEW_KEYS = ("mark", "layer", "concat", "hconcat", "vconcat", "facet", "repeat", "spec")
MAX_TITLE_CHARS = 200


class ChartRefused(ValueError):
    """A displayed chart that is not saved; the message says why, for the model."""


def _text(title: Any) -> str | None:
    if isinstance(title, dict):
        title = title.get("text")
    if isinstance(title, list):
        title = " ".join(str(t) for t in title if isinstance(t, (str, int, float)))
    if isinstance(title, str) and title.strip():
        return " ".join(title.split())[:MAX_TITLE_CHARS]
    return None


def _axis_name(channel: Any) -> str | None:
    if not isinstance(channel, dict):
        return None
    name = _text(channel.get("title")) or channel.get("field")
    if isinstance(name, str) and channel.get("aggregate") and not channel.get("title"):
        name = f"{channel['aggregate']} of {name}"
    return name if isinstance(name, str) and name else None


def _views(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec and its sub-views, depth first (a layer, a concat, a facet's or repeat's spec)."""
    out, todo = [], [spec]
    while todo and len(out) < 200:
        view = todo.pop(0)
        out.append(view)
        for key in ("layer", "concat", "hconcat", "vconcat"):
            todo += [v for v in view.get(key) or [] if isinstance(v, dict)]
        if isinstance(view.get("spec"), dict):
            todo.append(view["spec"])
    return out


def chart_title(spec: dict[str, Any]) -> str | None:
    """The spec's title, else its first sub-view's; else "<y> by <x>" from the first encoding."""
    views = _views(spec)
    for view in views:
        if title := _text(view.get("title")):
            return title
    for view in views:
        enc = view.get("encoding")
        if not isinstance(enc, dict):
            continue
        x, y = _axis_name(enc.get("x")), _axis_name(enc.get("y"))
        if x and y:
            return f"{y} by {x}"[:MAX_TITLE_CHARS]
        if x or y:
            return x or y
    return None


def _urls(node: Any, depth: int = 0) -> bool:
    """Whether any `data` of the spec names a `url` (anywhere in its views)."""
    if depth > 40:
        return False
    if isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, dict) and "url" in data:
            return True
        return any(_urls(v, depth + 1) for k, v in node.items() if k not in ("datasets", "values"))
    if isinstance(node, list):
        return any(_urls(v, depth + 1) for v in node)
    return False


def _rows(spec: dict[str, Any]) -> int:
    datasets = spec.get("datasets") if isinstance(spec.get("datasets"), dict) else {}
    rows = sum(len(v) for v in datasets.values() if isinstance(v, list))
    data = spec.get("data")
    if isinstance(data, dict) and isinstance(data.get("values"), list):
        rows += len(data["values"])
    return rows


def checked_spec(chart: ChartOutput, limit: int = MAX_SPEC_BYTES) -> tuple[bytes, dict[str, Any]]:
    """The spec as compact JSON and as a dict; ChartRefused naming what is wrong with it."""
    spec = chart.spec
    if isinstance(spec, (str, bytes)):
        if len(spec) > limit * 2:
            raise ChartRefused(f"a Vega-Lite chart was not shown: its spec is {len(spec):,} bytes with the data "
                               f"inline (limit {limit:,}); aggregate or sample the data first, then chart that")
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ChartRefused(f"a Vega-Lite chart was not shown: its spec is not valid JSON ({exc})") from None
    if not isinstance(spec, dict):
        raise ChartRefused("a Vega-Lite chart was not shown: its spec must be a JSON object, "
                           f"not {type(spec).__name__}")
    if not any(k in spec for k in VIEW_KEYS):
        raise ChartRefused("a Vega-Lite chart was not shown: the spec has no mark, layer, concat, facet or "
                           "repeat, so it is not a Vega-Lite view")
    if _urls(spec):
        raise ChartRefused("a Vega-Lite chart was not shown: its data names a url; put the data inline "
                           "(alt.Chart(df), or data: {values: [...]}) from a file under /data")
    data = json.dumps(spec, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str).encode()
    if len(data) > limit:
        raise ChartRefused(
            f"a Vega-Lite chart was not shown: its spec is {len(data):,} bytes with {_rows(spec):,} data rows "
            f"inline (limit {limit:,} bytes); aggregate first (group by and sum or count, bin, or sample "
            "in pandas or duckdb) and chart the smaller result, or draw a static matplotlib figure")
    return data, spec


SaveFn = Callable[[bytes, str, str, str, str | None], Artifact]  # data, ext, media, format, title


def save_charts(charts: list[ChartOutput], save: SaveFn) -> tuple[list[Artifact], list[str]]:
    """Save each acceptable chart as a `vega-lite` artifact; the artifacts, and a line per chart
    for the model (saved, or why not)."""
    saved: list[Artifact] = []
    lines: list[str] = []
    for chart in charts:
        try:
            data, spec = checked_spec(chart)
        except ChartRefused as exc:
            lines.append(str(exc))
            continue
        except ValueError as exc:  # NaN or infinity in the data: not JSON
            lines.append(f"a Vega-Lite chart was not shown: its spec is not valid JSON ({exc}); "
                         "replace NaN and infinite values (e.g. df.fillna) first")
            continue
        title = chart_title(spec)
        try:
            art = save(data, CHART_EXT, chart.mime, CHART_FORMAT, title)
        except (OSError, QuotaExceeded) as exc:  # the quota, the disk: the model hears it
            lines.append(f"a Vega-Lite chart was produced but not saved: {exc}")
            continue
        saved.append(art)
        named = f" \"{title}\"" if title else ""
        lines.append(f"chart: artifact {art.id}{named} (Vega-Lite, {_rows(spec):,} data rows), shown to the user "
                     "in the chat as an interactive chart (hover values, zoom, PNG/SVG download)")
    return saved, lines
