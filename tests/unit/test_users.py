from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from datadesk.store.layout import Layout
from datadesk.store.users import UserError, UserStore


def test_tokens_are_hashed_and_revocable(tmp_path: Path) -> None:
    users = UserStore(Layout(tmp_path))
    user, token = users.add("alice", ["demo"], ["code_execution"])
    raw = (tmp_path / "users.json").read_text()
    assert token not in raw and token[4:] not in raw
    assert users.by_token(token).id == "alice"
    extra = users.new_token("alice")
    assert users.by_token(extra).id == "alice"
    users.revoke("alice")
    assert users.by_token(token) is None and users.by_token(extra) is None
    assert (tmp_path / "users.json").stat().st_mode & 0o077 == 0


def test_bad_user_operations(tmp_path: Path) -> None:
    users = UserStore(Layout(tmp_path))
    users.add("alice", ["demo"])
    with pytest.raises(UserError, match="already exists"):
        users.add("alice", ["demo"])
    with pytest.raises(UserError, match="unknown permission"):
        users.add("bob", ["demo"], ["root"])
    with pytest.raises(ValueError, match="invalid user name"):
        users.add("../bob", ["demo"])
    with pytest.raises(UserError, match="no user"):
        users.revoke("nobody")


def test_login_codes_are_one_time_and_expire(tmp_path: Path) -> None:
    users = UserStore(Layout(tmp_path))
    users.add("alice", ["demo"])
    code = users.new_login_code("alice", 60)
    assert code not in (tmp_path / "users.json").read_text()
    assert users.redeem_login_code(code).id == "alice"
    assert users.redeem_login_code(code) is None
    old = users.new_login_code("alice", -1)
    assert users.redeem_login_code(old) is None
    sid = users.new_session("alice", 60)
    assert sid not in (tmp_path / "sessions.json").read_text()
    assert users.by_session(sid).id == "alice"
    users.end_session(sid)
    assert users.by_session(sid) is None


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datadesk.cli", *args], capture_output=True, text=True,
                          env={"DATADESK_HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[2] / "platform"),
                               "PATH": "/usr/bin:/bin"}, timeout=60)


def test_users_cli(tmp_path: Path) -> None:
    r = cli(tmp_path, "users", "add", "dana", "--workspace", "demo", "--workspace", "sales",
            "--can-execute-code", "--admin")
    assert r.returncode == 0, r.stderr
    token = r.stdout.split("shown once, store it now): ")[1].strip()
    assert UserStore(Layout(tmp_path)).by_token(token).permissions == ["admin", "code_execution"]
    listing = cli(tmp_path, "users", "list").stdout
    assert "dana\tactive\tdemo,sales\tadmin,code_execution" in listing
    assert token not in listing
    assert cli(tmp_path, "users", "add", "dana", "--workspace", "demo").returncode == 2
    assert "login?code=" in cli(tmp_path, "users", "login-url", "dana").stdout
    assert cli(tmp_path, "users", "revoke", "dana").returncode == 0
    assert "dana\trevoked" in cli(tmp_path, "users", "list").stdout
    assert UserStore(Layout(tmp_path)).by_token(token) is None
    bad = cli(tmp_path, "users", "revoke", "ghost")
    assert bad.returncode == 2 and "no user named 'ghost'" in bad.stderr
    doc = json.loads((tmp_path / "users.json").read_text())
    assert all("hash" in t for t in doc["users"]["dana"]["tokens"])
