"""A Vega-Lite chart in the thread's static exports (Markdown, the printable page and the copy for
readers run no script): its title and a table of its inline data, never a bare file name, and
never the dark-theme copy of a figure as a second image. A real local kernel."""

from __future__ import annotations

import json

from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.integration.test_sandbox import sandbox_settings

SPEC = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "title": "Energy by building",
        "data": {"values": [{"building": f"B{i:02d}", "kwh": 1000.0 * i} for i in range(1, 26)]},
        "mark": "bar", "encoding": {"x": {"field": "building", "type": "nominal"},
                                    "y": {"field": "kwh", "type": "quantitative"}}}
CODE = ("import matplotlib.pyplot as plt\n"
        "plt.bar(['a', 'b'], [1, 2]); plt.title('Two bars'); plt.show()\n"
        f"display({{'application/vnd.vegalite.v5+json': {json.dumps(SPEC)}}}, raw=True)\nprint('drawn')")


def test_a_vega_lite_chart_is_a_titled_table_in_every_static_export(harness_factory) -> None:
    model = ScriptedModel([tool_step("python", {"code": CODE}, call_id="call_chart"), "Here is the chart."])
    h = harness_factory(model, sandbox=sandbox_settings("local", allow_unsafe_local=True))
    with h.client(served=True, timeout=120) as api:
        events = api.turn("chart energy by building")
        assert events[-1][1]["status"] == "ok", events[-3:]
        rec = [r for r in api.client.get(f"/api/threads/{api.tid}").json()["records"] if r["role"] == "tool"][0]
        pages = {(fmt, aud): api.client.get(f"/api/threads/{api.tid}/export",
                                            params={"format": fmt, "audience": aud})
                 for fmt in ("md", "html") for aud in ("full", "readers")}
    assert rec["meta"].get("images") and rec["meta"].get("dark_images"), rec
    for (fmt, aud), r in pages.items():
        assert r.status_code == 200, (fmt, aud, r.text[:300])
        text = r.text
        assert "Energy by building" in text and "Interactive chart: open the thread in DataDesk" in text, (fmt, aud)
        assert "B01" in text and "1,000" in text and "B20" in text, (fmt, aud)
        if aud == "readers":  # (the transcript also has the code, which names every row)
            assert "B21" not in text, (fmt, aud)
        assert "first 20 of 25 data rows" in text, (fmt, aud)
        assert ".vljson" not in text, (fmt, aud)  # never offered as a bare file
        # one figure (the light one): its dark-theme copy is no second image
        assert text.count("data:image/png;base64,") == 1, (fmt, aud, text.count("data:image/png;base64,"))
