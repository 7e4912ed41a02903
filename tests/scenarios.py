"""The seed scenario shared by the context and summary tests: an analysis whose constraint
("exclude holidays") must survive fifteen turns of large chart specs."""

from __future__ import annotations

from datadesk.tools.registry import ToolResult, ToolSpec

SEED = "analyse last month's office energy use, exclude holidays"


def chart_specs(repeat: int) -> dict[int, str]:
    """Sixteen large, distinct tool results (`repeat` sets their size)."""
    return {i: (f"chart spec {i}: " + "colour=#%06x; " % (i * 4999) * repeat) for i in range(16)}


def register_chart_spec(rt, big: dict[int, str]) -> None:
    """A `chart_spec(variant)` tool returning `big[variant]` whole (never offloaded)."""

    async def chart_spec(args, ctx):
        return ToolResult(big[args["variant"]])

    rt.tools.register(ToolSpec(name="chart_spec", description="chart", parameters={"type": "object"},
                               offloadable=False), chart_spec)
