"""Kernels any host can reach (issue 29 item 2): two `datadesk serve` hosts with separate homes
on one PostgreSQL, one bucket and one real Jupyter Enterprise Gateway (process kernels), with
`sandbox.gateway_files = "presigned"` (the cluster default): no volume is shared by the app
and the kernels.

- a variable set through host A is read through host B (B attaches by the table's gateway id);
- an artifact offloaded on A is read by python on a kernel started via B after A's home is
  wiped (the kernel fetched it by a presigned GET and checked its sha256);
- a file the kernel writes to /outputs comes back by a presigned PUT and downloads byte-equal
  through the other host;
- the kernel holds no store credentials and cannot list the bucket;
- when A dies, B adopts A's kernel: the variables survive, no fresh-kernel notice.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_two_hosts import Cluster, client, contextlib_exit
from tests.conftest import free_port, parse_sse
from tests.egkit import KERNEL_USER, start_gateway
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.fakes.tool_loop import SUMMARY_MARK
from tests.serving import serving, stop_serve
from tests.unit.test_summary import faithful

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
SQL = "SELECT building_id, ts, kwh FROM readings ORDER BY building_id, ts LIMIT 5000"


def respond(req: dict[str, Any]) -> FakeReply:
    """'query ...': SQL; 'py: <code>': python with that code; after a tool result, its content
    echoed back (so the test reads what the kernel printed from the answer)."""
    messages = req.get("messages") or []
    if messages and SUMMARY_MARK in str(messages[0].get("content", "")):
        return FakeReply(text=faithful(messages, []), chunks=1)
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return FakeReply(text="TOOL:" + str(last.get("content")), chunks=1)
    user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    if user.startswith("query"):
        return FakeReply(tool_calls=[{"name": "sql_query", "arguments": {"sql": SQL}}])
    if user.startswith("py: "):
        return FakeReply(tool_calls=[{"name": "python", "arguments": {"code": user[4:]}}])
    return FakeReply(text="ok", chunks=1)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("eg"), "127.0.0.1", free_port())
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def gw_hosts(tmp_path, cluster_db_url, s3, gateway):
    with FakeOpenAIServer() as fake:
        fake.responder = respond
        env = {**os.environ, **s3.env(), "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}",
               "DATADESK_CLUSTER_DATABASE_URL": cluster_db_url, "DATADESK_SECRET_KEY": "test-secret-" + "x" * 32,
               "DATADESK_LLM_BASE_URL": fake.base_url, "DATADESK_LLM_API_KEY": "sk-test",
               "DATADESK_LLM_MODEL": "fake-model", "DATADESK_GATEWAY_TOKEN": gateway.token}
        cluster = Cluster(tmp_path, env)
        kernel_root = tempfile.mkdtemp(prefix="ddk-")  # where the process kernels keep their files
        hosts = []
        with contextlib_exit() as stack:
            for name in ("a", "b"):
                home = tmp_path / f"home-{name}"
                home.mkdir()
                (home / "datadesk.toml").write_text(
                    f'[cluster]\nhost_id = "host-{name}"\n'
                    f'[sandbox]\nbackend = "gateway"\npool_size = 0\ngateway_url = "{gateway.url}"\n'
                    f'gateway_files = "presigned"\ngateway_kernel_files_dir = "{kernel_root}"\n'
                    f'exec_timeout_s = 60\nowner_stale_s = 6\nheartbeat_s = 1\n'
                    f'[sandbox.gateway_kernel_env]\nKERNEL_USERNAME = "{KERNEL_USER}"\n')
                host_env = {**env, "DATADESK_HOME": str(home), "DATADESK_CONFIG": str(home / "datadesk.toml")}
                base, proc = stack.enter_context(serving(home, host_env, tmp_path / f"serve-{name}.log"))
                hosts.append((base, home, proc))
            cluster.hosts = hosts
            cluster.kernel_root = Path(kernel_root)
            yield cluster
        shutil.rmtree(kernel_root, ignore_errors=True)


def ask(c, tid: str, text: str) -> tuple[str, list]:
    """One turn; what its python or SQL call returned (the last tool record) and the events."""
    events = parse_sse(c.post(f"/api/threads/{tid}/messages", json={"content": text}).text)
    assert events[-1][0] == "done" and events[-1][1]["status"] == "ok", events
    records = c.get(f"/api/threads/{tid}").json()["records"]
    tools = [r for r in records if r.get("role") == "tool"]
    return (tools[-1].get("content", "") if tools else ""), events


def test_a_variable_set_via_a_is_read_via_b_and_b_adopts_the_kernel_when_a_dies(gw_hosts, gateway):
    (a, _, proc_a), (b, _, _) = gw_hosts.hosts
    token = gw_hosts.add_user("carol", "--can-execute-code")
    with client(a, token) as ca, client(b, token) as cb:
        tid = ca.post("/api/threads", json={}).json()["id"]
        ask(ca, tid, "py: x = 41")
        answer, _ = ask(cb, tid, "py: print(x + 1)")
        assert "42" in answer and "fresh" not in answer.lower(), answer
        proc_a.send_signal(signal.SIGKILL)  # A dies; its kernel lives on the gateway
        proc_a.wait(10)
        answer, _ = ask(cb, tid, "py: print(x * 2)")
        assert "82" in answer and "fresh" not in answer.lower(), answer


def test_a_host_stopped_for_a_rollout_leaves_its_kernels_to_the_others(gw_hosts, gateway):
    (a, _, proc_a), (b, _, _) = gw_hosts.hosts
    token = gw_hosts.add_user("gina", "--can-execute-code")
    with client(a, token) as ca, client(b, token) as cb:
        tid = ca.post("/api/threads", json={}).json()["id"]
        ask(ca, tid, "py: y = 'kept'")
        stop_serve(proc_a)  # SIGTERM: a clean shutdown, as a rolling update does
        answer, _ = ask(cb, tid, "py: print(y.upper())")
    assert "KEPT" in answer and "fresh" not in answer.lower(), answer


def test_an_artifact_offloaded_on_a_is_read_by_a_kernel_started_via_b(gw_hosts):
    (a, home_a, _), (b, _, _) = gw_hosts.hosts
    token = gw_hosts.add_user("dave", "--can-execute-code")
    with client(a, token) as ca:
        tid = ca.post("/api/threads", json={}).json()["id"]
        ask(ca, tid, "query the readings")
        art = ca.get(f"/api/threads/{tid}/artifacts").json()
        art = (art if isinstance(art, list) else art["artifacts"])[0]
        original = ca.get(f"/api/artifacts/{art['id']}/download").content
    shutil.rmtree(home_a / "workspaces", ignore_errors=True)  # nothing of A's disk can help now
    code = ("import hashlib, os, pyarrow.parquet as pq; "
            f"p = '/data/{art['id']}.parquet'; "
            "print('ROWS', pq.read_table(p).num_rows, 'SHA', hashlib.sha256(open(p, 'rb').read()).hexdigest(), "
            "'RO', not os.access(p, os.W_OK) or oct(os.stat(p).st_mode & 0o222) == '0o0')")
    with client(b, token) as cb:
        answer, _ = ask(cb, tid, "py: " + code)
    assert "ROWS 5000" in answer, answer
    assert f"SHA {hashlib.sha256(original).hexdigest()}" in answer, answer
    assert "RO True" in answer, answer


def test_outputs_come_back_through_presigned_puts_and_download_via_the_other_host(gw_hosts):
    (a, _, _), (b, _, _) = gw_hosts.hosts
    token = gw_hosts.add_user("erin", "--can-execute-code")
    payload = random.Random(7).randbytes(600_000)  # what the kernel writes (the same generator)
    with client(b, token) as cb, client(a, token) as ca:
        tid = cb.post("/api/threads", json={}).json()["id"]
        ask(cb, tid, "py: import random; open('/outputs/report.bin', 'wb').write(random.Random(7).randbytes(600000))")
        arts = ca.get(f"/api/threads/{tid}/artifacts").json()
        arts = arts if isinstance(arts, list) else arts["artifacts"]
        assert len(arts) == 1, arts
        got = ca.get(f"/api/artifacts/{arts[0]['id']}/download")
        assert got.status_code == 200 and got.content == payload, (got.status_code, len(got.content))
        # unchanged, it is not collected again by the next cell (the kernel keeps what it sent),
        # and no staged upload is left in the store
        ask(ca, tid, "py: print('again')")
        again = ca.get(f"/api/threads/{tid}/artifacts").json()
        assert len(again if isinstance(again, list) else again["artifacts"]) == 1


def test_the_kernel_holds_no_store_credentials(gw_hosts, s3):
    (a, _, _), _ = gw_hosts.hosts
    token = gw_hosts.add_user("fred", "--can-execute-code")
    code = ("import os, urllib.request, urllib.error; "
            "print('KEYS', sorted(k for k in os.environ if k.startswith(('AWS', 'DATADESK')))); "
            f"r = None\ntry:\n    r = urllib.request.urlopen({s3.endpoint!r} + '/' + {s3.bucket!r}).status\n"
            "except urllib.error.HTTPError as e:\n    r = e.code\nprint('LIST', r)")
    with client(a, token) as ca:
        tid = ca.post("/api/threads", json={}).json()["id"]
        answer, _ = ask(ca, tid, "py: " + code)
    assert "KEYS []" in answer, answer
    assert "LIST 403" in answer or "LIST 401" in answer, answer
