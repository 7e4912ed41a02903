"""A summary never carries an earlier branch into the new one (summary/service.py at a branch):
a summary that covered records an edit abandoned is re-derived from the active records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from datadesk.domain.records import Record
from datadesk.llm.scripted import ScriptedModel
from tests.unit.test_summary import chat, faithful, make_thread, requests, seqs_seen, service_for


def test_a_branch_before_the_summary_coverage_re_derives_it(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Monthly consumption per city.", "Sure."), ("Constraint: exclude holidays.", "OK."))
    model = ScriptedModel(then=faithful)
    service, store = service_for(model)

    async def main() -> None:
        first = await service.refresh(tdir, 4, 0)
        assert first is not None and "exclude holidays" in json.dumps(first.active_constraints)
        # the analyst edits question #3: the thread continues from #2 (#3, #4: the earlier branch)
        tdir.log.append(lambda seq: Record(seq=seq, role="user", ts=5.0, content="Constraint: exclude weekends.",
                                           meta={"kind": "edit", "rewinds_to": 2, "branch_of": 3}))
        tdir.log.append(lambda seq: Record(seq=seq, role="assistant", ts=6.0, content="Weekends out."))
        second = await service.refresh(tdir, 6, 0)
        assert second is not None and second.covers_through_seq == 6
        constraints = json.dumps(second.active_constraints)
        assert "exclude weekends" in constraints and "exclude holidays" not in constraints

    asyncio.run(main())
    first_req, second_req = requests(model)
    assert seqs_seen(first_req) == [1, 2, 3, 4]
    assert seqs_seen(second_req) == [1, 2, 5, 6]  # from scratch, the active branch only
    assert "PREVIOUS SUMMARY: none" in second_req and "exclude holidays" not in second_req


def test_a_branch_after_the_coverage_keeps_the_summary_incremental(tmp_path: Path) -> None:
    tdir = make_thread(tmp_path)
    chat(tdir, ("Constraint: exclude holidays.", "OK."), ("Plot it.", "Plotted."))
    model = ScriptedModel(then=faithful)
    service, _ = service_for(model)

    async def main() -> None:
        await service.refresh(tdir, 2, 0)
        tdir.log.append(lambda seq: Record(seq=seq, role="user", ts=5.0, content="Plot it as bars.",
                                           meta={"kind": "edit", "rewinds_to": 2, "branch_of": 3}))
        tdir.log.append(lambda seq: Record(seq=seq, role="assistant", ts=6.0, content="Bars."))
        second = await service.refresh(tdir, 6, 0)
        assert "exclude holidays" in json.dumps(second.active_constraints)

    asyncio.run(main())
    second_req = requests(model)[1]
    assert seqs_seen(second_req) == [5, 6]  # the abandoned #3, #4 never summarised
    assert "PREVIOUS SUMMARY (JSON, covers records up to #2)" in second_req
