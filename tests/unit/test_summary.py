"""Thread summaries: incremental refresh, constraint keeping, guards, caps, serialization.

The summarizer model is a `ScriptedModel` whose steps are a small, deterministic
fake summarizer: it reads the previous summary JSON and the new records from
the request and updates the fields from the user's words ("constraint: ...",
"exclude ...", "withdraw ..."/"no longer ...").
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import msgspec
import pytest
from filelock import FileLock

from datadesk.domain.records import Record, ToolCall
from datadesk.llm.base import ModelUnavailable
from datadesk.llm.scripted import ScriptedModel, ScriptStep
from datadesk.llm.tokens import count_tokens
from datadesk.settings import SummarySettings
from datadesk.store.files import write_json
from datadesk.store.threadlog import ThreadLog
from datadesk.store.threads import Thread
from datadesk.summary.model import ThreadSummary, normalize_item, render_summary
from datadesk.summary.service import SummaryService
from datadesk.summary.store import SummaryStore
from datadesk.summary.summarizer import (
    Summarizer,
    SummaryError,
    build_request,
    parse_fields,
    render_records,
)

# -- helpers -------------------------------------------------------------------------------


def make_thread(root: Path, name: str = "t1") -> Thread:
    path = root / name
    path.mkdir(parents=True)
    write_json(path / "meta.json", {"id": name, "workspace": "demo", "owner": "u", "title": "t",
                                    "created": 0, "updated": 0, "epoch": 0})
    return Thread.at(path)


def bump_epoch(tdir: Thread) -> None:
    """What a clear does to meta.json (under the thread lock)."""
    with tdir.lock():
        meta = json.loads((tdir.dir / "meta.json").read_text())
        meta["epoch"] += 1
        write_json(tdir.dir / "meta.json", meta)


def add(tdir: Thread, role: str, content: str = "", **kw: Any) -> Record:
    return tdir.log.append(
        lambda seq: Record(seq=seq, role=role, ts=time.time(), content=content, **kw))


def chat(tdir: Thread, *pairs: tuple[str, str]) -> int:
    """Append user/assistant pairs; return the last seq."""
    last = 0
    for user, reply in pairs:
        add(tdir, "user", user)
        last = add(tdir, "assistant", reply).seq
    return last


EMPTY = {"goal": "", "active_constraints": [], "decisions": [], "superseded": [], "data_refs": [],
         "state": "", "open_items": [], "next_steps": []}
_PREV = re.compile(r"PREVIOUS SUMMARY \(JSON[^\n]*\):\n([^\n]+)")
_REC = re.compile(r"^\[#(\d+) (user|assistant|tool)[^\]]*\] ?(.*)$", re.M)
_ARTIFACT = re.compile(r"^  artifact: (.+)$", re.M)


def _add(items: list[str], item: str) -> None:
    if item.lower() not in (i.lower() for i in items):
        items.append(item)


def fake_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The fake summarizer: previous summary + user phrases in the new records -> fields."""
    request = messages[1]["content"]
    m = _PREV.search(request)
    out = json.loads(m.group(1)) if m else json.loads(json.dumps(EMPTY))
    for _seq, role, text in _REC.findall(request):
        if role != "user":
            continue
        low = text.lower()
        if "withdraw" in low or "no longer" in low:
            for c in list(out["active_constraints"]):
                if c.lower() in low:
                    out["active_constraints"].remove(c)
                    _add(out["superseded"], c)
            continue
        for phrase in re.findall(r"constraint: ([^.;\n]+)", text, re.I):
            _add(out["active_constraints"], phrase.strip())
        for phrase in re.findall(r"\b(exclude [^.;,\n]+)", text, re.I):
            _add(out["active_constraints"], phrase.strip())
        out["goal"] = out["goal"] or text
        out["state"] = text
    for ids in _ARTIFACT.findall(request):
        for ident in ids.split(", "):
            _add(out["data_refs"], ident)
    return out


def faithful(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    return json.dumps(fake_fields(messages))


def forgetful(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """Loses every active constraint (and does not list them as superseded)."""
    return json.dumps({**fake_fields(messages), "active_constraints": []})


def requests(model: ScriptedModel) -> list[str]:
    """The first user message of each summarizer call (previous summary + new records)."""
    return [call[1]["content"] for call in model.calls]


def seqs_seen(request: str) -> list[int]:
    return [int(s) for s, _r, _t in _REC.findall(request)]


def service_for(model: ScriptedModel, **overrides: Any) -> tuple[SummaryService, SummaryStore]:
    settings = SummarySettings(**overrides)
    store = SummaryStore(revisions_kept=settings.revisions_kept)
    return SummaryService(store, Summarizer(model, settings, count_tokens), settings), store


class Gated:
    """A step that signals when the model was called, then waits for `gate`."""

    def __init__(self, make: Callable[[list[dict[str, Any]]], str] = lambda m: faithful(m, [])) -> None:
        self.make = make
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ScriptStep:
        self.entered.set()
        return ScriptStep(text=self.make(messages), gate=self.gate)


# -- model and rendering -----------------------------------------------------------------


def test_render_omits_empty_sections_and_states_coverage() -> None:
    s = ThreadSummary(goal="Monthly consumption", active_constraints=["exclude holidays"],
                      superseded=["only 2023"], covers_through_seq=12)
    text = render_summary(s)
    assert text.splitlines()[0] == "Thread summary (covers records up to #12):"
    assert "Goal: Monthly consumption" in text
    assert "Active constraints:\n- exclude holidays" in text
    assert "Superseded (do not apply):\n- only 2023" in text
    for empty in ("Decisions", "Data references", "State", "Open items", "Next steps"):
        assert empty not in text


def test_normalize_item() -> None:
    assert normalize_item("  Exclude   Holidays. ") == normalize_item("exclude holidays")
    assert normalize_item("“exclude holidays”;") == "exclude holidays"
    assert normalize_item("exclude holidays") != normalize_item("exclude weekends")


def test_records_are_rendered_compactly_with_tools_and_artifacts() -> None:
    call = ToolCall(id="c1", name="sql_query", arguments=json.dumps({"sql": "SELECT * FROM readings"}))
    records = [
        Record(seq=5, role="user", ts=0, content="Here is my file", meta={"kind": "upload", "artifact": "art_up"}),
        Record(seq=6, role="assistant", ts=0, content="Querying.", tool_calls=[call]),
        Record(seq=7, role="tool", ts=0, tool_call_id="c1", name="sql_query", content="x" * 5000,
               meta={"artifact": {"id": "art_q1", "rows": 10}}),
    ]
    text = render_records(records)
    assert "[#5 user] Here is my file\n  artifact: art_up" in text
    assert "(calls: sql_query)" in text
    assert "[#7 tool sql_query(sql='SELECT * FROM readings')]" in text
    assert "artifact: art_q1" in text
    assert "x" * 600 in text and "x" * 601 not in text and "4400 more chars" in text
    request = build_request(None, records, "the holiday effect")
    assert "PREVIOUS SUMMARY: none" in request and "FOCUS (what matters now, from the user): the holiday effect" in request


def test_parse_tolerates_a_fence_and_refuses_unknown_fields() -> None:
    body = json.dumps({**EMPTY, "goal": "g", "active_constraints": ["a", " A. ", ""]})
    fields = parse_fields(f"Here it is:\n```json\n{body}\n```\n")
    assert fields.goal == "g" and fields.active_constraints == ["a"]
    with pytest.raises(ValueError):
        parse_fields(json.dumps({**EMPTY, "extra": "no"}))
    with pytest.raises(ValueError):
        parse_fields(json.dumps({**EMPTY, "decisions": [1, 2]}))
    with pytest.raises(ValueError):
        parse_fields(json.dumps({"goal": "only"}))
    with pytest.raises(ValueError):
        parse_fields("I could not summarize this.")


# -- incremental -----------------------------------------------------------------------------


def test_incremental_model_sees_only_new_records_and_previous_summary(tmp_path: Path, monkeypatch) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Monthly consumption per city. Constraint: exclude holidays.", "Sure."),
         ("Use kWh.", "OK."), ("Plot it.", "Plotted."), ("Blue bars.", "Done."))
    model = ScriptedModel(then=faithful)
    service, store = service_for(model)

    read: list[tuple[int, int | None]] = []
    real_since = ThreadLog.since

    def spy_since(self, first_seq, last_seq=None):
        read.append((first_seq, last_seq))
        return real_since(self, first_seq, last_seq)

    def no_full_scan(self):
        raise AssertionError("the summarizer must not read the whole log")

    monkeypatch.setattr(ThreadLog, "since", spy_since)
    monkeypatch.setattr(ThreadLog, "__iter__", no_full_scan)

    async def main() -> None:
        first = await service.refresh(tdir, 4, 0)
        assert first is not None and first.covers_through_seq == 4
        second = await service.refresh(tdir, 8, 0)
        assert second is not None and second.covers_through_seq == 8

    asyncio.run(main())
    assert read == [(1, 4), (5, 8)]
    first_req, second_req = requests(model)
    assert seqs_seen(first_req) == [1, 2, 3, 4]
    assert seqs_seen(second_req) == [5, 6, 7, 8]  # never the records already covered
    assert "PREVIOUS SUMMARY (JSON, covers records up to #4)" in second_req
    assert '"exclude holidays"' in second_req  # the previous summary is the memory of #1..#4
    assert "Monthly consumption per city" not in second_req.split("NEW RECORDS")[1]
    summary = store.load(tdir)
    assert summary.active_constraints == ["exclude holidays"]
    assert summary.epoch == 0 and summary.model == "scripted" and summary.created > 0


@pytest.mark.parametrize("lossy", [False, True])
def test_seed_constraint_survives_fifteen_refreshes_about_chart_colours(tmp_path: Path, lossy: bool) -> None:
    tdir = make_thread(tmp_path)
    last = chat(tdir, ("Show monthly consumption per city. Constraint: exclude holidays.", "Here it is."),
                ("Add a chart.", "Added."))
    calls = {"n": 0}

    def sometimes_forgets(messages, tools):
        calls["n"] += 1
        is_retry = len(messages) > 2
        return forgetful(messages, tools) if calls["n"] % 3 == 0 and not is_retry else faithful(messages, tools)

    model = ScriptedModel(then=sometimes_forgets if lossy else faithful)
    service, store = service_for(model)
    colours = ["blue", "red", "green", "teal", "orange", "purple", "grey", "navy", "olive", "pink",
               "gold", "cyan", "black", "brown", "lime"]

    async def main() -> None:
        assert (await service.refresh(tdir, last, 0)) is not None
        for colour in colours:
            end = chat(tdir, (f"Make the bars {colour}.", f"The bars are {colour} now."),
                       (f"And the title {colour} too.", "Done."))
            summary = await service.refresh(tdir, end, 0)
            assert summary is not None and summary.covers_through_seq == end
            assert "exclude holidays" in summary.active_constraints
            assert "- exclude holidays" in render_summary(summary)

    asyncio.run(main())
    assert store.load(tdir).active_constraints == ["exclude holidays"]
    if lossy:  # every forgetful answer was caught and retried with the constraint named
        retries = [c for c in model.calls if len(c) > 2]
        assert retries and all("exclude holidays" in c[-1]["content"] for c in retries)
    else:
        assert len(model.calls) == 16  # one call per refresh, no retries


def test_withdrawn_constraint_moves_to_superseded_and_stays_out(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    model = ScriptedModel(then=faithful)
    service, store = service_for(model)

    async def main() -> None:
        end = chat(tdir, ("Consumption per month. Constraint: exclude holidays.", "OK."),
                   ("Constraint: kWh only.", "OK."))
        s = await service.refresh(tdir, end, 0)
        assert s.active_constraints == ["exclude holidays", "kWh only"]
        end = chat(tdir, ("Actually we no longer exclude holidays, keep them in.", "Understood."),
                   ("Show the table.", "Here."))
        s = await service.refresh(tdir, end, 0)
        assert s.active_constraints == ["kWh only"] and s.superseded == ["exclude holidays"]
        for colour in ("red", "blue", "green"):
            end = chat(tdir, (f"Bars {colour}.", "Done."), ("Thanks.", "Welcome."))
            s = await service.refresh(tdir, end, 0)
            assert "exclude holidays" not in s.active_constraints
            assert s.superseded == ["exclude holidays"]

    asyncio.run(main())
    assert len(model.calls) == 5  # moving to superseded is not a drop: no retries
    assert "Superseded (do not apply):\n- exclude holidays" in render_summary(store.load(tdir))


# -- the constraint check ------------------------------------------------------------------------


def _seed(store: SummaryStore, tdir: Thread, covers: int, **fields: Any) -> ThreadSummary:
    summary = ThreadSummary(covers_through_seq=covers, epoch=0, **fields)
    assert store.write(tdir, summary, 0)
    return summary


def test_dropped_constraint_is_caught_retried_then_carried_over(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("a", "b"), ("c", "d"), ("Make it red.", "Red."), ("Bigger font.", "Done."))
    model = ScriptedModel(then=forgetful)  # forgets on the retry as well
    service, store = service_for(model)
    _seed(store, tdir, 4, goal="g", active_constraints=["exclude holidays", "kWh only"])

    result = asyncio.run(service.refresh(tdir, 8, 0))
    assert len(model.calls) == 2
    retry = model.calls[1]
    assert retry[-2]["role"] == "assistant"  # the model sees its own first answer
    assert retry[-1]["role"] == "user"
    assert "dropped these active constraints" in retry[-1]["content"]
    assert "- exclude holidays" in retry[-1]["content"] and "- kWh only" in retry[-1]["content"]
    assert result is not None and result.covers_through_seq == 8
    assert result.active_constraints == ["exclude holidays", "kWh only"]  # carried over


def test_dropped_constraint_fixed_by_the_retry(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("a", "b"), ("c", "d"), ("Make it red.", "Red."), ("Bigger font.", "Done."))
    model = ScriptedModel([forgetful, faithful])
    service, store = service_for(model)
    _seed(store, tdir, 4, active_constraints=["exclude holidays"])
    result = asyncio.run(service.refresh(tdir, 8, 0))
    assert len(model.calls) == 2 and result.active_constraints == ["exclude holidays"]


def test_constraint_rephrased_only_in_case_and_punctuation_is_kept(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("a", "b"), ("c", "d"), ("e", "f"), ("g", "h"))
    model = ScriptedModel(then=lambda m, t: json.dumps({**fake_fields(m), "active_constraints": ["Exclude  Holidays."]}))
    service, store = service_for(model)
    _seed(store, tdir, 4, active_constraints=["exclude holidays"])
    result = asyncio.run(service.refresh(tdir, 8, 0))
    assert len(model.calls) == 1 and result.active_constraints == ["Exclude Holidays."]


# -- guards ----------------------------------------------------------------------------------------


def test_epoch_guard_drops_a_summary_when_the_chat_was_cleared_meanwhile(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    end = chat(tdir, ("Constraint: exclude holidays.", "OK."), ("More.", "More."))
    step = Gated()
    model = ScriptedModel(then=step)
    service, store = service_for(model)

    async def main() -> ThreadSummary | None:
        task = service.schedule(tdir, end, 0)
        await step.entered.wait()  # the model is working on it
        bump_epoch(tdir)  # the chat is cleared
        step.gate.set()
        await service.drain()
        return task.result()

    assert asyncio.run(main()) is None
    assert len(model.calls) == 1
    assert not (tdir.dir / "summary.json").exists()
    assert store.load(tdir) is None


def test_stale_coverage_the_older_job_finishing_late_is_dropped(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, *[(f"Constraint: rule {i}.", "OK.") for i in range(6)])
    records = tdir.log.since(1, 12)
    store = SummaryStore()
    old_step, new_step = Gated(), Gated()
    old = Summarizer(ScriptedModel(then=old_step), SummarySettings())
    new = Summarizer(ScriptedModel(then=new_step), SummarySettings())

    async def job(summarizer: Summarizer, upto: int) -> bool:
        summary = await summarizer.summarize(None, [r for r in records if r.seq <= upto], 0)
        return store.write(tdir, summary, 0)

    async def main() -> tuple[bool, bool]:
        older = asyncio.create_task(job(old, 8))
        newer = asyncio.create_task(job(new, 12))
        await old_step.entered.wait()
        await new_step.entered.wait()
        new_step.gate.set()  # the later-covering job finishes first
        newer_ok = await newer
        old_step.gate.set()  # the older one finishes late
        return newer_ok, await older

    assert asyncio.run(main()) == (True, False)
    stored = store.load(tdir)
    assert stored.covers_through_seq == 12 and len(stored.active_constraints) == 6
    assert store.revisions(tdir) == []  # the dropped one did not even become a revision


def test_stale_coverage_guard_in_a_service_job(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, *[(f"Constraint: rule {i}.", "OK.") for i in range(4)])
    step = Gated()
    service, store = service_for(ScriptedModel(then=step))

    async def main() -> ThreadSummary | None:
        task = service.schedule(tdir, 4, 0)
        await step.entered.wait()
        # meanwhile a summary covering farther lands (e.g. written by another worker)
        assert store.write(tdir, ThreadSummary(active_constraints=["rule 0"], covers_through_seq=8, epoch=0), 0)
        step.gate.set()
        await service.drain()
        return task.result()

    assert asyncio.run(main()) is None
    assert store.load(tdir).covers_through_seq == 8


def test_store_write_guards(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    store = SummaryStore()
    s = ThreadSummary(covers_through_seq=4, epoch=0)
    assert not store.write(tdir, s, 1)  # job from another epoch
    assert not store.write(tdir, msgspec.structs.replace(s, epoch=1), 1)  # meta says epoch 0
    assert store.write(tdir, s, 0)
    assert not store.write(tdir, s, 0)  # covers as far already
    gone = tmp_path / "gone"
    assert not store.write(Thread(gone), s, 0) and not gone.exists()
    (tdir.dir / "summary.json").write_text("{not json")
    assert store.load(tdir) is None


# -- failures and caps -------------------------------------------------------------------------


def test_invalid_output_keeps_the_previous_version(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"), ("d", "e"), ("f", "g"))
    bad_shape = json.dumps({**EMPTY, "mood": "happy"})
    model = ScriptedModel([faithful, "Sorry, here is a summary: it was about holidays.", bad_shape,
                           ScriptStep(error=ModelUnavailable("endpoint down"))])
    service, store = service_for(model)

    async def main() -> None:
        assert (await service.refresh(tdir, 4, 0)) is not None
        before = (tdir.dir / "summary.json").read_bytes()
        assert (await service.refresh(tdir, 8, 0)) is None  # invalid twice: previous kept
        assert len(model.calls) == 3
        assert "not a valid summary" in model.calls[2][-1]["content"]
        assert (tdir.dir / "summary.json").read_bytes() == before
        assert store.revisions(tdir) == []
        assert (await service.refresh(tdir, 8, 0)) is None  # the model fails: previous kept
        assert (tdir.dir / "summary.json").read_bytes() == before

    asyncio.run(main())


def test_invalid_then_valid_output_is_used(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    model = ScriptedModel(["{ broken", lambda m, t: "```json\n" + faithful(m, t) + "\n```"])
    service, store = service_for(model)
    result = asyncio.run(service.refresh(tdir, 4, 0))
    assert result is not None and result.active_constraints == ["exclude holidays"]


def test_summarizer_raises_summary_error_when_nothing_valid() -> None:
    model = ScriptedModel(then="not json")
    rec = Record(seq=1, role="user", ts=0, content="hello")
    with pytest.raises(SummaryError):
        asyncio.run(Summarizer(model, SummarySettings()).summarize(None, [rec], 0))


def _bloated(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    fields = fake_fields(messages)
    fields["decisions"] = [f"decision {i}: use the seasonal baseline with a long justification text here"
                           for i in range(300)]
    fields["open_items"] = [f"open question {i} about the holiday calendar source" for i in range(100)]
    return json.dumps(fields)


def test_output_over_the_token_cap_is_retried_then_trimmed(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Monthly consumption. Constraint: exclude holidays.", "OK."), ("Constraint: kWh only.", "OK."))
    model = ScriptedModel(then=_bloated)
    service, store = service_for(model)
    result = asyncio.run(service.refresh(tdir, 4, 0))
    assert len(model.calls) == 2
    assert "the limit is 1,500" in model.calls[1][-1]["content"]
    assert result is not None
    assert count_tokens(render_summary(result)) <= 1_500
    assert result.active_constraints == ["exclude holidays", "kWh only"]  # never trimmed
    assert result.decisions[0].startswith("decision 0:")  # trimmed from the end
    assert result.goal and result.state


def test_output_over_the_cap_fixed_by_the_retry(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    model = ScriptedModel([_bloated, faithful])
    service, _ = service_for(model)
    result = asyncio.run(service.refresh(tdir, 4, 0))
    assert len(model.calls) == 2 and result.decisions == []


def test_revisions_are_bounded(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    service, store = service_for(ScriptedModel(then=faithful), revisions_kept=3)

    async def main() -> list[int]:
        covers = []
        for i in range(6):
            end = chat(tdir, (f"Constraint: rule {i}.", "OK."), ("more", "ok"))
            covers.append((await service.refresh(tdir, end, 0)).covers_through_seq)
        return covers

    covers = asyncio.run(main())
    assert covers == [4, 8, 12, 16, 20, 24]
    revs = store.revisions(tdir)
    assert [r.covers_through_seq for r in revs] == [12, 16, 20]  # oldest first, newest 3 kept
    assert store.load(tdir).covers_through_seq == 24
    assert len((tdir.dir / "summary.revisions.jsonl").read_text().splitlines()) == 3


# -- scheduling --------------------------------------------------------------------------------


def test_concurrent_refreshes_of_one_thread_call_the_model_one_at_a_time(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, *[(f"Constraint: rule {i}.", "OK.") for i in range(6)])
    first = Gated()
    model = ScriptedModel([first], then=faithful)
    service, store = service_for(model)

    async def main() -> None:
        a = service.schedule(tdir, 8, 0)
        b = service.schedule(tdir, 12, 0)
        await first.entered.wait()
        for _ in range(50):  # give the second job every chance to run
            await asyncio.sleep(0)
        assert len(model.calls) == 1  # the second job waits for the first
        first.gate.set()
        await service.drain()
        assert a.result().covers_through_seq == 8
        assert b.result().covers_through_seq == 12

    asyncio.run(main())
    assert len(model.calls) == 2
    assert seqs_seen(requests(model)[1]) == [9, 10, 11, 12]  # the second continued from the first
    assert service.pending == 0


def test_another_process_job_makes_a_background_refresh_skip(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    end = chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    model = ScriptedModel(then=faithful)
    service, store = service_for(model)
    other = FileLock(str(tdir.dir / "summary.lock"))
    other.acquire()
    try:
        assert asyncio.run(service.refresh(tdir, end, 0)) is None
    finally:
        other.release()
    assert model.calls == [] and store.load(tdir) is None


def test_synchronous_refresh_waits_for_another_process_and_returns_its_summary(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    end = chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    model = ScriptedModel(then=faithful)
    service, store = service_for(model)
    other = FileLock(str(tdir.dir / "summary.lock"))

    async def main() -> ThreadSummary | None:
        other.acquire()
        task = asyncio.create_task(service.refresh(tdir, end, 0, synchronous=True))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done()
        store.write(tdir, ThreadSummary(active_constraints=["exclude holidays"], covers_through_seq=end, epoch=0), 0)
        other.release()
        return await task

    result = asyncio.run(main())
    assert result is not None and result.covers_through_seq == end
    assert model.calls == []  # the other process's summary already covers it


def test_focus_is_passed_to_the_summarizer(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    end = chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    model = ScriptedModel(then=faithful)
    service, _ = service_for(model)
    assert asyncio.run(service.refresh(tdir, end, 0, focus="the winter peak")) is not None
    assert "FOCUS (what matters now, from the user): the winter peak" in requests(model)[0]


def test_due(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, *[(f"m{i}", "ok") for i in range(8)])  # seqs 1..16
    service, store = service_for(ScriptedModel(then=faithful))
    assert not service.due(tdir, 3, "ok")
    assert service.due(tdir, 4, "ok")
    assert service.due(tdir, 1, "compact")
    assert not service.due(tdir, 0, "compact")
    _seed(store, tdir, 4)
    assert not service.due(tdir, 7, "warn")
    assert service.due(tdir, 8, "ok")
    assert service.due(tdir, 5, "compact")
    assert not service.due(tdir, 4, "compact")  # nothing newly trimmed
    disabled, _ = service_for(ScriptedModel(then=faithful), enabled=False)
    assert not disabled.due(tdir, 16, "compact")
    assert asyncio.run(disabled.refresh(tdir, 16, 0)) is None
    bump_epoch(tdir)  # after a clear the old summary does not count
    assert service.due(tdir, 4, "ok")


def test_refresh_never_raises(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("a", "b"), ("c", "d"))

    class Boom:
        name = "boom"
        is_demo = False

        def stream(self, messages, tools):
            raise RuntimeError("bug")

    settings = SummarySettings()
    service = SummaryService(SummaryStore(), Summarizer(Boom(), settings), settings)
    assert asyncio.run(service.refresh(tdir, 4, 0)) is None
    assert asyncio.run(service.refresh(Thread(tmp_path / "missing"), 4, 0)) is None
    assert not (tmp_path / "missing").exists()


def test_a_huge_state_is_cut_but_constraints_stay(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Constraint: exclude holidays.", "OK."), ("b", "c"))
    huge = lambda m, t: json.dumps({**fake_fields(m), "state": "results were computed " * 2000})  # noqa: E731
    service, _ = service_for(ScriptedModel(then=huge))
    result = asyncio.run(service.refresh(tdir, 4, 0))
    assert result is not None and result.active_constraints == ["exclude holidays"]
    assert count_tokens(render_summary(result)) <= 1_500 and result.state.endswith("…")
