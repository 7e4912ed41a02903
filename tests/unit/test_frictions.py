"""Issue 32's small frictions, below the browser: search snippets read as rendered text, the
per-model price setting and the cost of a turn, and the demo's answer off its script."""

from __future__ import annotations

import pytest

from datadesk.chat.costs import reply_cost, thread_costs
from datadesk.domain.records import Record, Usage
from datadesk.domain.snippet_text import MARK_END, MARK_START, readable_snippet, readable_spans
from datadesk.llm.demo import demo_step
from datadesk.llm.demo_plans import SUGGESTED_QUESTIONS
from datadesk.settings import ModelPrice, Settings, SettingsError, load_settings
from datadesk.threads.titles import upload_title


def marked(text: str, word: str) -> str:
    return text.replace(word, f"{MARK_START}{word}{MARK_END}", 1)


@pytest.mark.parametrize("raw, word, want", [
    ("The top meter is **B07** with `12.5` MWh", "B07", "The top meter is B07 with 12.5 MWh"),
    ('{"ratio": 1.98, "meter": "B07", "rows": [1, 2]}', "ratio", "ratio: 1.98, meter: B07, rows: 1, 2"),
    ("| meter | kwh |\n|---|---:|\n| B07 | 12 |", "B07", "meter · kwh · B07 · 12"),
    ("## Results\n- see [the report](https://x.test/r.html) for *B07*", "B07", "Results see the report for B07"),
    ("```python\nprint(df.B07)\n```", "B07", "print(df.B07)"),
    ("plain words, 2*3 and \"quoted\" stay", "quoted", 'plain words, 2*3 and "quoted" stay'),
])
def test_a_snippet_reads_as_rendered_text_and_keeps_its_highlight(raw, word, want) -> None:
    text, spans = readable_snippet(marked(raw, word))
    assert text == want
    assert [text[a:b] for a, b in spans] == [word]


def test_the_cluster_snippet_goes_through_the_same_cleaning() -> None:
    raw = '…"ratio": 1.98, "meter": "B07"'
    start = raw.index("B07")
    text, spans = readable_spans(raw, [(start, start + 3)])
    assert text == "…ratio: 1.98, meter: B07" and [text[a:b] for a, b in spans] == ["B07"]


def test_search_hits_show_rendered_text(tmp_path) -> None:
    from datadesk.store.layout import Layout
    from datadesk.store.search import ThreadSearch
    from datadesk.store.threads import Thread, ThreadStore

    store = ThreadStore(Layout(tmp_path))
    t = store.create("demo", "alice", "Meters")
    t.append(lambda seq: Record(seq=seq, role="assistant", ts=1.0, content="The worst meter is **B07** (`ratio` 1.98)."))
    t.append(lambda seq: Record(seq=seq, role="tool", ts=2.0, name="sql_query", content='{"meter": "B07", "ratio": 1.98}'))
    hits = ThreadSearch(Layout(tmp_path), Thread).search("alice", ["demo"], "B07")
    snippets = sorted(h.snippet for h in hits)
    assert all("**" not in s and '"' not in s and "`" not in s for s in snippets), snippets
    assert any("meter: B07, ratio: 1.98" in s for s in snippets), snippets
    assert all(h.snippet[a:b] == "B07" for h in hits for a, b in h.highlights)


def test_an_upload_names_an_untitled_chat_only() -> None:
    assert upload_title("New chat", "meters 2024.csv") == "meters 2024.csv"
    assert upload_title("New chat", "C:\\Users\\x\\sales.xlsx") == "sales.xlsx"
    assert upload_title("Budget review", "sales.csv") is None
    assert upload_title("New chat", "") is None


def test_prices_are_read_per_model_and_validated(tmp_path) -> None:
    (tmp_path / "datadesk.toml").write_text(
        '[llm.prices."gpt-4o-mini"]\ninput_per_mtok = 0.15\noutput_per_mtok = 0.6\ncached_input_per_mtok = 0.075\n')
    s = load_settings(env={"DATADESK_HOME": str(tmp_path)})
    assert s.llm.prices["gpt-4o-mini"] == ModelPrice(input_per_mtok=0.15, output_per_mtok=0.6, cached_input_per_mtok=0.075)
    for bad, named in [("input_per_mtok = -1\noutput_per_mtok = 1", "input_per_mtok"),
                       ("input_per_mtok = 1", "output_per_mtok"),
                       ("input_per_mtok = 1\noutput_per_mtok = 1\ncurrency = \"dollars\"", "currency"),
                       ("input_per_mtok = 1\noutput_per_mtok = 1\nper_request = 2", "per_request")]:
        (tmp_path / "datadesk.toml").write_text(f'[llm.prices."m"]\n{bad}\n')
        with pytest.raises(SettingsError, match=named) as err:
            load_settings(env={"DATADESK_HOME": str(tmp_path)})
        assert "llm.prices" in str(err.value)
    assert Settings(home=tmp_path).llm.prices == {}


def _reply(seq: int, turn: str, model: str, prompt: int, cached: int, out: int) -> Record:
    return Record(seq=seq, role="assistant", ts=float(seq), turn_id=turn, model=model,
                  usage=Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=out, total_tokens=prompt + out))


def test_cost_per_turn_and_thread_from_recorded_usage() -> None:
    price = ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0, cached_input_per_mtok=0.5)
    assert reply_cost(1_000_000, 400_000, 100_000, price) == pytest.approx(0.6 * 2 + 0.4 * 0.5 + 0.1 * 8)
    records = [
        Record(seq=1, role="user", ts=1, turn_id="t1", content="q"),
        _reply(2, "t1", "m", 1_000, 0, 100),
        Record(seq=3, role="tool", ts=3, turn_id="t1", name="sql_query", content="{}"),
        _reply(4, "t1", "m", 1_500, 1_000, 50),
        Record(seq=5, role="user", ts=5, turn_id="t2", content="again"),
        _reply(6, "t2", "unpriced", 2_000, 0, 10),
    ]
    turns, total = thread_costs(records, {"m": price}, "m")
    t1, t2 = turns
    assert (t1.first_seq, t1.last_seq, t1.requests, t1.prompt_tokens, t1.cached_tokens, t1.completion_tokens) == \
        (1, 4, 2, 2_500, 1_000, 150)
    assert t1.cost == pytest.approx((1_000 * 2 + 100 * 8 + 500 * 2 + 1_000 * 0.5 + 50 * 8) / 1e6)
    assert t1.priced and t1.currency == "USD"
    assert t2.cost is None and not t2.priced and t2.prompt_tokens == 2_000  # never a guessed cost
    assert total.prompt_tokens == 4_500 and total.cost is None and total.models == ["m", "unpriced"]


def test_the_demo_says_what_it_can_answer_off_its_script() -> None:
    tools = [{"function": {"name": "sql_query"}}, {"function": {"name": "python"}}]
    first = [{"role": "user", "content": SUGGESTED_QUESTIONS[0]},
             {"role": "assistant", "content": "The answer with its numbers."}]
    step = demo_step(first + [{"role": "user", "content": "Why did that happen, and what should we do?"}], tools)
    assert not step.tool_calls  # no unrelated canned table
    for q in SUGGESTED_QUESTIONS:
        assert q in step.text
    assert "DATADESK_LLM_BASE_URL" in step.text and "DATADESK_LLM_MODEL" in step.text
    on_topic = demo_step(first + [{"role": "user", "content": "and per city?"}], tools)
    assert on_topic.tool_calls and on_topic.tool_calls[0].name == "sql_query"
