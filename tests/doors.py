"""The three doors of the real app (issue 26), for tests that feed one text through each:

  (a) a tool's result: a read-only MCP-like tool (`TOOL`) returns the text; the scripted model
      calls it in a real turn and the offload pipeline writes the artifact;
  (b) an upload: the bytes posted to `/api/threads/{tid}/uploads`;
  (c) a paste: the text as a message too long for the model (`context.max_message_tokens` is
      small here), staged as a file by `Attachments.message_text`.

    app = door_app(harness_factory)          # (harness, client, model, texts), a context manager
    art, table, told = through("upload", text, app, data=text.encode("cp1252"))

`told` is what the model was told of the artifact (the tool's preview, the upload's or paste's
record)."""

from __future__ import annotations

import io
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from datadesk.domain.tools import ToolResult, ToolSpec
from datadesk.llm.scripted import ScriptedModel, tool_step
from tests.conftest import AppClient, parse_sse
from tests.fakes.sandbox import FakeSandbox

TOOL = "crm__export_rows"
DOORS = ("tool", "upload", "paste")


@contextmanager
def door_app(harness_factory) -> Iterator[tuple]:
    """The app with `TOOL` returning `texts["now"]` and a sandbox that can read files (so a large
    result is offloaded): (harness, client, model, texts)."""
    model = ScriptedModel(then="ok")
    h = harness_factory(model, context={"max_message_tokens": 100}, offload={"threshold_chars": 1_000})
    FakeSandbox(h.rt)
    texts: dict[str, str] = {}

    async def export(args, ctx):
        return ToolResult(texts["now"])

    h.rt.tools.register(ToolSpec(name=TOOL, description="Rows of an export (an MCP server's text).",
                                 parameters={"type": "object", "properties": {}}, read_only=True,
                                 offloadable=True, source="mcp"), export)
    with h.client(thread=False) as api:
        yield h, api.client, model, texts


def new_thread(h, client) -> str:
    """A new thread of alice's (`AppClient.new_thread` on this client)."""
    return AppClient(h=h, client=client, user="alice").new_thread()


def through(door: str, text: str, app, data: bytes | None = None,
            filename: str = "export.txt") -> tuple[dict, pa.Table, str]:
    """The artifact `text` became through `door` (its API form), its data (downloaded as Parquet)
    and what the model was told. `data`: the upload's bytes (default: `text` in UTF-8)."""
    h, client, model, texts = app
    auth = h.auth("alice")
    tid = new_thread(h, client)
    if door == "tool":
        texts["now"] = text
        model.steps.extend([tool_step(TOOL, {}), "done"])
        r = client.post(f"/api/threads/{tid}/messages", json={"content": "export the rows"}, headers=auth)
        events = parse_sse(r.text)
        created = [d["artifact"] for e, d in events if e == "artifact.created"]
        assert created, [e for e, _ in events]
        art = created[0]
        told = next(d["preview"] for e, d in events if e == "tool.finished")
    elif door == "upload":
        body = data if data is not None else text.encode()
        r = client.post(f"/api/threads/{tid}/uploads", files={"file": (filename, body)}, headers=auth)
        assert r.status_code == 201, r.text
        art = r.json()["artifact"]
        told = client.get(f"/api/threads/{tid}", headers=auth).json()["records"][-1]["content"]
    else:
        r = client.post(f"/api/threads/{tid}/messages", json={"content": text}, headers=auth)
        assert r.status_code == 200, r.text
        told = client.get(f"/api/threads/{tid}", headers=auth).json()["records"][0]["content"]
        assert "pasted a table" in told, told[:300]
        (art,) = client.get(f"/api/threads/{tid}/artifacts", headers=auth).json()
    art = client.get(f"/api/artifacts/{art['id']}", headers=auth).json()
    got = client.get(f"/api/artifacts/{art['id']}/download", headers=auth)
    assert got.status_code == 200, got.text
    return art, pq.read_table(io.BytesIO(got.content)), told
