"""The demo's scripted analyses: what the demo model runs for its suggested questions.

Each `DemoPlan` is the real flow of the product on the demo warehouse: one SQL query whose
result is large enough to be offloaded (a Parquet artifact), one python run over the *full*
artifact that draws a chart, writes a Markdown report to /outputs and prints its numbers as one
`DEMO_RESULT {json}` line, and a final answer that cites those numbers. The code is written for
the sandbox (`/data`, `/outputs`); `{path}` is the artifact's sandbox path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

RESULT_MARK = "DEMO_RESULT "


def _n(v: Any, digits: int = 0) -> str:
    try:
        return f"{float(v):,.{digits}f}"
    except (TypeError, ValueError):
        return str(v)


@dataclass(frozen=True)
class DemoPlan:
    """A suggested question and its scripted analysis."""

    question: str
    keywords: tuple[str, ...]  # a free question with one of these words gets this plan
    what: str  # what the query fetches, for the first message
    sql: str
    code: str  # python over the artifact at {path}
    answer: Callable[[dict[str, Any]], str]  # the final answer from the DEMO_RESULT numbers


_SEASONS_CODE = '''import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_parquet("{path}")
df["month"] = pd.to_datetime(df["day"]).dt.strftime("%Y-%m")
monthly = df.groupby("month")["kwh"].sum().round(0)
by_hvac = df.assign(winter=df["month"].isin(["2024-01", "2024-02", "2024-12", "2025-01"])) \\
    .groupby(["hvac_type", "winter"])["kwh"].mean().unstack()
winter_ratio = (by_hvac[True] / by_hvac[False]).round(2).sort_values(ascending=False)

fig, ax = plt.subplots(figsize=(8, 3.4))
monthly.plot(kind="bar", ax=ax, color="#3b6ea5")
ax.set_title("Electricity use per month, 20 buildings (kWh)")
ax.set_xlabel("")
ax.spines[["top", "right"]].set_visible(False)
ax.grid(axis="y", alpha=0.3)
fig.tight_layout()
plt.show()

peak, low = monthly.idxmax(), monthly.idxmin()
lines = ["# Energy use through the year", "",
         f"{{len(df):,}} building-days analysed; total {{df['kwh'].sum():,.0f}} kWh.", "",
         "| month | kWh |", "|---|---:|"] + [f"| {{m}} | {{v:,.0f}} |" for m, v in monthly.items()] + [
         "", "Winter days use this many times the kWh of other days, by HVAC type:", ""] + [
         f"- {{k}}: {{v}}x" for k, v in winter_ratio.items()]
with open("/outputs/energy_through_the_year.md", "w") as fh:
    fh.write("\\n".join(lines) + "\\n")
print("DEMO_RESULT " + json.dumps({{"rows": len(df), "total_kwh": float(df["kwh"].sum()), "peak_month": peak,
    "peak_kwh": float(monthly[peak]), "low_month": low, "low_kwh": float(monthly[low]),
    "top_winter_hvac": winter_ratio.index[0], "top_winter_ratio": float(winter_ratio.iloc[0])}}))
'''


def _seasons_answer(r: dict[str, Any]) -> str:
    return (f"Over the {_n(r['rows'])} building-days, the 20 buildings used **{_n(r['total_kwh'])} kWh**. "
            f"The peak month is **{r['peak_month']}** ({_n(r['peak_kwh'])} kWh), the lowest **{r['low_month']}** "
            f"({_n(r['low_kwh'])} kWh). Winter hits **{r['top_winter_hvac']}** buildings hardest: their winter "
            f"days use {r['top_winter_ratio']}× the kWh of other days (they heat with electricity). "
            "The chart is above; the month-by-month table is in the report `energy_through_the_year.md`.")


_INTENSITY_CODE = '''import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_parquet("{path}")
year = df[df["month"].str.startswith("2024")]
per_b = year.groupby(["building_id", "name", "hvac_type", "floor_area_m2"], as_index=False)["kwh"].sum()
per_b["kwh_per_m2"] = (per_b["kwh"] / per_b["floor_area_m2"]).round(1)
per_b = per_b.sort_values("kwh_per_m2", ascending=False)
by_hvac = per_b.groupby("hvac_type")["kwh_per_m2"].mean().round(1).sort_values(ascending=False)

fig, ax = plt.subplots(figsize=(8, 5))
ax.barh(per_b["building_id"] + " " + per_b["name"], per_b["kwh_per_m2"], color="#3b6ea5")
ax.invert_yaxis()
ax.set_title("Electricity use per m² in 2024 (kWh/m²)")
ax.spines[["top", "right"]].set_visible(False)
ax.grid(axis="x", alpha=0.3)
fig.tight_layout()
plt.show()

top, bottom = per_b.iloc[0], per_b.iloc[-1]
lines = ["# Electricity use per m² (2024)", "", "| building | HVAC | m² | kWh | kWh/m² |", "|---|---|---:|---:|---:|"]
lines += [f"| {{r.building_id}} {{r.name}} | {{r.hvac_type}} | {{r.floor_area_m2:,}} | {{r.kwh:,.0f}} | {{r.kwh_per_m2}} |"
          for r in per_b.itertuples()]
lines += ["", "Average by HVAC type: " + ", ".join(f"{{k}} {{v}} kWh/m²" for k, v in by_hvac.items())]
with open("/outputs/energy_per_m2.md", "w") as fh:
    fh.write("\\n".join(lines) + "\\n")
print("DEMO_RESULT " + json.dumps({{"rows": len(df), "buildings": len(per_b), "top": top["building_id"] + " " + top["name"],
    "top_kwh_m2": float(top["kwh_per_m2"]), "bottom": bottom["building_id"] + " " + bottom["name"],
    "bottom_kwh_m2": float(bottom["kwh_per_m2"]), "top_hvac": by_hvac.index[0], "top_hvac_kwh_m2": float(by_hvac.iloc[0]),
    "low_hvac": by_hvac.index[-1], "low_hvac_kwh_m2": float(by_hvac.iloc[-1])}}))
'''


def _intensity_answer(r: dict[str, Any]) -> str:
    return (f"Per m² of floor area in 2024, **{r['top']}** uses the most: **{r['top_kwh_m2']} kWh/m²**, against "
            f"{r['bottom_kwh_m2']} kWh/m² for {r['bottom']} (the lowest of the {r['buildings']} buildings). "
            f"By HVAC type, {r['top_hvac']} buildings average {r['top_hvac_kwh_m2']} kWh/m² and {r['low_hvac']} "
            f"{r['low_hvac_kwh_m2']} kWh/m². The ranking is charted above; every building is in `energy_per_m2.md`.")


_TEMPERATURE_CODE = '''import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_parquet("{path}")
df["band"] = (df["temperature_c"] // 5 * 5).astype(int)
curve = df.groupby(["band", "hvac_type"])["kwh"].mean().unstack().round(1)
daily = df.groupby([df["ts"].dt.date, "hvac_type"]).agg(kwh=("kwh", "sum"), temp=("temperature_c", "mean"))
corr = pd.Series({{k: g["kwh"].corr(g["temp"]) for k, g in daily.groupby("hvac_type")}}).round(2).sort_values()

fig, ax = plt.subplots(figsize=(8, 3.6))
curve.plot(ax=ax, marker="o")
ax.set_title("Average kWh per building-hour by outdoor temperature")
ax.set_xlabel("outdoor temperature band (°C)")
ax.spines[["top", "right"]].set_visible(False)
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

lines = ["# Outdoor temperature and electricity use", "",
         f"{{len(df):,}} hourly readings ({{df['kwh'].isna().sum()}} missing kWh values skipped).", "",
         "Correlation of daily kWh with daily mean temperature, by HVAC type:", ""]
lines += [f"- {{k}}: {{v}}" for k, v in corr.items()]
lines += ["", "Average kWh per building-hour by 5 °C band:", "",
          "| °C | " + " | ".join(curve.columns) + " |", "|---:|" + "---:|" * len(curve.columns)]
lines += [f"| {{band}} | " + " | ".join(f"{{v:.1f}}" for v in row) + " |" for band, row in curve.iterrows()]
with open("/outputs/temperature_effect.md", "w") as fh:
    fh.write("\\n".join(lines) + "\\n")
print("DEMO_RESULT " + json.dumps({{"rows": len(df), "missing_kwh": int(df["kwh"].isna().sum()),
    "strongest_hvac": corr.index[0], "strongest_corr": float(corr.iloc[0]),
    "weakest_hvac": corr.index[-1], "weakest_corr": float(corr.iloc[-1])}}))
'''


def _temperature_answer(r: dict[str, Any]) -> str:
    return (f"Across all **{_n(r['rows'])} hourly readings** ({r['missing_kwh']} missing values skipped), cold weather "
            f"drives consumption most in **{r['strongest_hvac']}** buildings: their daily kWh correlates "
            f"**{r['strongest_corr']}** with the day's mean temperature, against {r['weakest_corr']} for "
            f"{r['weakest_hvac']}. The curve per temperature band is above; the numbers are in `temperature_effect.md`.")


_NIGHT_CODE = '''import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_parquet("{path}")
df["day"] = pd.to_datetime(df["day"])
wide = df.pivot(index="day", columns="building_id", values="night_kwh")
before = wide.loc["2024-09-01":"2024-09-30"].median()
after = wide.loc["2024-11-01":"2024-11-30"].median()
jump = (after / before).round(2).sort_values(ascending=False)
worst = jump.index[0]
base = wide[worst].rolling(28, min_periods=14).median().shift(1)
start = wide.index[(wide[worst] > 1.5 * base).to_numpy()].min()

fig, ax = plt.subplots(figsize=(8, 3.4))
wide[worst].plot(ax=ax, label=worst, color="#c0392b")
wide.drop(columns=[worst]).median(axis=1).plot(ax=ax, label="median of the other buildings", color="#7f8c8d")
ax.axvline(start, linestyle="--", color="#c0392b", alpha=0.6)
ax.set_title("Night-time electricity (00:00-05:00), kWh per night")
ax.spines[["top", "right"]].set_visible(False)
ax.legend()
fig.tight_layout()
plt.show()

lines = ["# Night-time consumption check", "",
         f"{{len(df):,}} building-nights analysed (00:00-05:00).", "",
         f"**{{worst}}**: night use rose {{jump.iloc[0]}}x from September to November 2024, starting {{start:%Y-%m-%d}}.", "",
         "| building | Sep median | Nov median | ratio |", "|---|---:|---:|---:|"]
lines += [f"| {{b}} | {{before[b]:.1f}} | {{after[b]:.1f}} | {{jump[b]}} |" for b in jump.index]
with open("/outputs/night_consumption.md", "w") as fh:
    fh.write("\\n".join(lines) + "\\n")
print("DEMO_RESULT " + json.dumps({{"rows": len(df), "building": worst, "ratio": float(jump.iloc[0]),
    "start": f"{{start:%Y-%m-%d}}", "next_ratio": float(jump.iloc[1]), "next_building": jump.index[1]}}))
'''


def _night_answer(r: dict[str, Any]) -> str:
    return (f"Yes: **{r['building']}** stands out. Its night-time use (00:00-05:00) rose **{r['ratio']}×** from "
            f"September to November 2024, starting on **{r['start']}**, while the next building changed only "
            f"{r['next_ratio']}× ({r['next_building']}). That pattern (nights as high as working hours) points to a "
            f"ventilation schedule that stopped switching off. Chart above; all {_n(r['rows'])} building-nights are "
            "summarised in `night_consumption.md`.")


PLANS: list[DemoPlan] = [
    DemoPlan(
        "How does energy use change through the year?", ("through the year", "season", "per day", "daily"),
        "daily consumption of every building",
        "SELECT r.building_id, b.city, b.hvac_type, CAST(r.ts AS DATE) AS day,\n"
        "       round(sum(r.kwh), 2) AS kwh, round(avg(r.temperature_c), 1) AS avg_temp_c\n"
        "FROM readings r JOIN buildings b USING (building_id)\n"
        "GROUP BY ALL ORDER BY day, r.building_id",
        _SEASONS_CODE, _seasons_answer),
    DemoPlan(
        "Which buildings use the most electricity per m²?", ("per m²", "per m2", "m²", "square met", "intensity"),
        "monthly consumption of every building with its floor area",
        "SELECT b.building_id, b.name, b.city, b.hvac_type, b.floor_area_m2,\n"
        "       strftime(r.ts, '%Y-%m') AS month, round(sum(r.kwh), 1) AS kwh\n"
        "FROM readings r JOIN buildings b USING (building_id)\n"
        "GROUP BY ALL ORDER BY b.building_id, month",
        _INTENSITY_CODE, _intensity_answer),
    DemoPlan(
        "How strongly does outdoor temperature drive consumption?", ("drive consumption", "outdoor"),
        "every hourly reading with the building's HVAC type",
        "SELECT r.building_id, b.hvac_type, r.ts, r.kwh, r.temperature_c, r.occupancy\n"
        "FROM readings r JOIN buildings b USING (building_id)\n"
        "ORDER BY r.building_id, r.ts",
        _TEMPERATURE_CODE, _temperature_answer),
    DemoPlan(
        "Is anything unusual in the night-time consumption?", ("night", "unusual", "anomal", "fault", "odd"),
        "night-time consumption (00:00-05:00) per building and day",
        "SELECT building_id, CAST(ts AS DATE) AS day, round(sum(kwh), 2) AS night_kwh\n"
        "FROM readings WHERE hour(ts) < 5\n"
        "GROUP BY ALL ORDER BY building_id, day",
        _NIGHT_CODE, _night_answer),
]

SUGGESTED_QUESTIONS = [p.question for p in PLANS]


def pick_plan(question: str) -> DemoPlan | None:
    """The plan for a question: a suggested question as asked, or one naming a plan's topic."""
    q = " ".join(question.lower().split())
    for plan in PLANS:
        if q == plan.question.lower():
            return plan
    for plan in PLANS:
        if any(w in q for w in plan.keywords):
            return plan
    return None


def plan_code(plan: DemoPlan, path: str) -> str:
    """The plan's python, reading the artifact at `path`."""
    return plan.code.format(path=path)


UPLOAD_CODE = '''import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_parquet("{path}")
nulls = df.isna().sum()
numeric = df.select_dtypes("number")
print(f"{{len(df):,}} rows x {{df.shape[1]}} columns")
print(df.dtypes.to_string())
if len(numeric.columns):
    print(numeric.describe().T.round(3).to_string())
    col = numeric.columns[0]
    fig, ax = plt.subplots(figsize=(7, 3))
    numeric[col].dropna().plot(kind="hist", bins=30, ax=ax, color="#3b6ea5")
    ax.set_title(f"Distribution of {{col}}")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    plt.show()
summary = {{"rows": len(df), "columns": int(df.shape[1]), "names": [str(c) for c in df.columns[:12]],
    "null_cells": int(nulls.sum()), "most_nulls": str(nulls.idxmax()) if len(df.columns) else None,
    "numeric": {{str(c): {{"mean": float(numeric[c].mean()), "min": float(numeric[c].min()), "max": float(numeric[c].max())}}
                for c in numeric.columns[:4] if numeric[c].notna().any()}}}}
print("DEMO_RESULT " + json.dumps(summary))
'''


def upload_answer(filename: str, r: dict[str, Any]) -> str:
    """What the demo says about an uploaded table, from the profile its python printed."""
    parts = [f"**{filename}** has **{_n(r['rows'])} rows** and **{r['columns']} columns** "
             f"({', '.join(r['names'])}{', …' if r['columns'] > len(r['names']) else ''})."]
    if r.get("null_cells"):
        parts.append(f"{_n(r['null_cells'])} cells are empty, most of them in `{r['most_nulls']}`.")
    else:
        parts.append("No cell is empty.")
    stats = [f"`{c}` averages {_n(v['mean'], 2)} (from {_n(v['min'], 2)} to {_n(v['max'], 2)})"
             for c, v in (r.get("numeric") or {}).items()]
    if stats:
        parts.append("Numbers over the full file: " + "; ".join(stats) + ". The histogram is above.")
    parts.append("With a real model configured you could now ask anything about this file.")
    return " ".join(parts)
