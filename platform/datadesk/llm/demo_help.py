"""What the demo model says to a question off its script: what it can answer (its suggested
questions, the topics of its canned queries, an uploaded table) and how to connect a real
model, instead of running an unrelated canned query (llm/demo.py)."""

from __future__ import annotations

from datadesk.llm.demo_plans import SUGGESTED_QUESTIONS

TOPICS = ("totals per month", "holidays versus other days", "consumption by outdoor temperature",
          "by occupancy level", "per m² by HVAC type", "per city", "the top buildings")
CONNECT = ("To ask anything else, connect a model: set `DATADESK_LLM_BASE_URL`, `DATADESK_LLM_API_KEY` and "
           "`DATADESK_LLM_MODEL` (any OpenAI-compatible endpoint: OpenAI, vLLM, Ollama, ...) and restart "
           "DataDesk; see docs/getting-started.md.")


def off_script_answer(question: str, connect: bool = True) -> str:
    """The demo's answer to `question`, which none of its scripts covers; `connect` False leaves
    out how to connect a model (the thread's first answer carries the demo banner, which says it)."""
    asked = " ".join(question.split())
    asked = asked if len(asked) <= 80 else asked[:79] + "…"
    lines = [f"I am the demo model, not a real one, so I cannot answer “{asked}”: I only run a few scripted "
             "analyses on the demo data. I can answer:", ""]
    lines += [f"- {q}" for q in SUGGESTED_QUESTIONS]
    lines += ["", f"and simple questions about {', '.join(TOPICS[:-1])} and {TOPICS[-1]}; an uploaded table "
              "(CSV, Excel, Parquet, JSON) I can profile."]
    if connect:
        lines += ["", CONNECT]
    return "\n".join(lines)
