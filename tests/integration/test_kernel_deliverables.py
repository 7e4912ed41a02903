"""What a python step leaves behind: an empty file under /outputs is never a deliverable (the
tool result says so), and a step stopped by the user keeps what it printed before the Stop, in
its record (so a reload shows it). Real local kernels."""

from __future__ import annotations

import threading

from datadesk.llm.scripted import ScriptedModel, tool_step
from datadesk.sandbox.files import plan_outputs, read_new_outputs
from tests.conftest import wait_until
from tests.integration.test_sandbox import sandbox_settings
from tests.integration.test_turn_control import SSEReader, records
from tests.sandbox_kit import ctx, py, run_with, runtime_with_sandbox


def test_an_empty_output_file_is_not_offered_and_the_result_says_so(tmp_path) -> None:
    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("local"))
    c = ctx(rt, tid="empty")
    code = ("open('/outputs/report.md', 'w').close()\n"
            "open('/outputs/kept.md', 'w').write('# kept')\n"
            "print('wrote')")
    r = run_with(rt, lambda: py(rt, c, code))
    assert not r.is_error, r.content
    assert "report.md is empty (0 bytes): not saved" in r.content
    names = [a.file or "" for a in r.meta.artifacts or ()]
    assert any(n.endswith("kept.md") for n in names), names
    assert not any(n.endswith("report.md") for n in names), names


def test_a_json_file_the_code_writes_keeps_its_bytes_beside_its_metadata(tmp_path) -> None:
    """`<aid>.json` is an artifact's metadata: a JSON output stored under that name was
    overwritten by it (the analyst's file lost, its sha256 wrong)."""
    import hashlib

    rt = runtime_with_sandbox(tmp_path / "var", sandbox_settings("local"))
    c = ctx(rt, tid="jsonout")
    code = ("import json\njson.dump({'total_kwh': 1234.5, 'buildings': ['B01', 'B07']}, open('/outputs/summary.json', 'w'))\n"
            "print('wrote')")
    r = run_with(rt, lambda: py(rt, c, code))
    assert not r.is_error, r.content
    arts = [a for a in rt.artifacts.list(c.thread) if a.origin.filename == "summary.json"]
    assert len(arts) == 1, [a.file for a in rt.artifacts.list(c.thread)]
    art = arts[0]
    data = rt.artifacts.data_path(c.thread, art).read_bytes()
    assert art.file == f"{art.id}.data.json"
    assert data == b'{"total_kwh": 1234.5, "buildings": ["B01", "B07"]}'
    assert hashlib.sha256(data).hexdigest() == art.sha256
    assert [a.id for a in rt.artifacts.list(c.thread)].count(art.id) == 1  # the data file is no metadata


def test_the_empty_rule_holds_for_a_listing_and_a_walk(tmp_path) -> None:
    listing = b"f 0 1700000000.0 empty.md\0f 3 1700000000.0 full.md\0"
    seen: dict = {}
    wanted, problems = plan_outputs(listing, seen, 1000)
    assert [w.relpath for w in wanted] == ["full.md"]
    assert problems == ["/outputs/empty.md is empty (0 bytes): not saved, not offered as a file; "
                        "write its content first"]
    assert plan_outputs(listing, seen, 1000)[1] == []  # reported once, until it changes
    (tmp_path / "empty.md").write_bytes(b"")
    (tmp_path / "full.md").write_bytes(b"abc")
    found, problems = read_new_outputs(str(tmp_path), {}, 1000)
    assert [f.relpath for f in found] == ["full.md"] and "empty.md is empty" in problems[0]


def test_a_stopped_python_step_keeps_what_it_printed(harness_factory) -> None:
    # the printed text never appears in the code itself: the wait below must see the output, not
    # the tool.started event's arguments
    code = ("import time\nprint('row', 1, 'done', flush=True)\nprint('row', 2, 'done', flush=True)\n"
            "while True:\n    time.sleep(0.05)")
    model = ScriptedModel([tool_step("python", {"code": code, "timeout_s": 60}, call_id="call_spin"), "done"])
    h = harness_factory(model, sandbox=sandbox_settings("local"))
    with h.client(served=True, timeout=120) as api:
        c, tid = api.client, api.tid
        with c.stream("POST", f"/api/threads/{tid}/messages", json={"content": "spin"}) as resp:
            sse = SSEReader(resp)
            printed = threading.Event()

            def saw_output() -> bool:
                sse.until("tool.progress")
                if "row 2 done" in "\n".join(sse.text):
                    printed.set()
                return printed.is_set()
            wait_until(saw_output, timeout=60)
            assert c.post(f"/api/threads/{tid}/cancel").json()["cancelled"] is True
            sse.rest()
        rec = {r.get("tool_call_id"): r for r in records(c, tid)}["call_spin"]
        assert rec["status"] == "cancelled"
        assert "stopped the turn" in rec["content"]
        assert "row 1 done\nrow 2 done" in rec["content"], rec["content"]
