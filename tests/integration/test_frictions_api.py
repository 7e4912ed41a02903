"""Issue 32's frictions through the real app: a chat started with an upload is named after its
file, and GET /api/threads/{tid}/usage gives tokens and cost per turn and for the thread."""

from __future__ import annotations

import pytest

from datadesk.domain.records import Usage
from datadesk.llm.scripted import ScriptedModel, ScriptStep

PRICED = {"llm": {"model": "m-test", "prices": {"m-test": {"input_per_mtok": 2.0, "output_per_mtok": 8.0}}}}


@pytest.mark.parametrize("api", [{"model": ScriptedModel(then="ok", name="m-test"), **PRICED}], indirect=True)
def test_an_upload_names_the_chat_and_the_usage_is_priced(api) -> None:
    h, c = api.h, api.client
    tid = api.new_thread()
    r = c.post(f"/api/threads/{tid}/uploads", files={"file": ("meters 2024.csv", b"meter,kwh\nB07,12\nB08,9\n")},
               headers=h.auth("alice"))
    assert r.status_code == 201, r.text
    assert r.json()["thread_title"] == "meters 2024.csv"
    assert c.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["thread"]["title"] == "meters 2024.csv"
    # a second upload, or a question, keeps the title
    c.post(f"/api/threads/{tid}/uploads", files={"file": ("other.csv", b"a\n1\n")}, headers=h.auth("alice"))
    api.model.steps.append(ScriptStep(text="Two meters.", usage=Usage(prompt_tokens=1_000, completion_tokens=100,
                                                                      total_tokens=1_100)))
    api.turn("which meters?", tid=tid)
    assert c.get(f"/api/threads/{tid}", headers=h.auth("alice")).json()["thread"]["title"] == "meters 2024.csv"
    u = c.get(f"/api/threads/{tid}/usage", headers=h.auth("alice")).json()
    [turn] = u["turns"]
    assert (turn["prompt_tokens"], turn["completion_tokens"], turn["requests"]) == (1_000, 100, 1)
    assert turn["cost"] == pytest.approx((1_000 * 2 + 100 * 8) / 1e6) and turn["currency"] == "USD"
    assert u["total"]["cost"] == pytest.approx(turn["cost"]) and u["prices_set"] == ["m-test"]
    # another user's thread is not found
    assert c.get(f"/api/threads/{tid}/usage", headers=h.auth("bob")).status_code == 404


def test_an_unpriced_model_counts_tokens_and_no_cost(api) -> None:
    api.model.steps.append(ScriptStep(text="ok", usage=Usage(prompt_tokens=10, completion_tokens=2, total_tokens=12)))
    api.turn("hi")
    u = api.client.get(f"/api/threads/{api.tid}/usage", headers=api.h.auth("alice")).json()
    assert u["turns"][0]["prompt_tokens"] == 10 and u["turns"][0]["cost"] is None and not u["turns"][0]["priced"]
    assert api.client.get(f"/api/threads/{api.tid}", headers=api.h.auth("alice")).json()["thread"]["title"] == "hi"
