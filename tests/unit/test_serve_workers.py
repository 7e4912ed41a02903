"""`datadesk serve --workers N`: the settings snapshot the workers start from holds no secret."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from datadesk.cli import WORKER_SETTINGS_ENV, main, worker_settings, write_worker_settings
from datadesk.settings import Settings, SettingsError


def test_the_workers_snapshot_has_no_secrets_and_they_are_read_again(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    s.llm.api_key = "sk-live-secret-123"
    s.llm.base_url = "http://127.0.0.1:9/v1"
    s.sandbox.gateway_token = "gw-secret-456"
    s.server.workers, s.server.port, s.sandbox.allow_unsafe_local = 3, 8123, True  # from the command line
    path = write_worker_settings(s)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.parent == (tmp_path / "run").resolve()
    text = path.read_text()
    assert "sk-live-secret-123" not in text and "gw-secret-456" not in text
    env = {WORKER_SETTINGS_ENV: str(path), "DATADESK_HOME": str(tmp_path), "DATADESK_LLM_API_KEY": "sk-live-secret-123",
           "DATADESK_GATEWAY_TOKEN": "gw-secret-456"}
    got = worker_settings(env)
    assert got.llm.api_key == "sk-live-secret-123" and got.sandbox.gateway_token == "gw-secret-456"
    assert (got.server.workers, got.server.port, got.sandbox.allow_unsafe_local) == (3, 8123, True)
    assert got.llm.base_url == "http://127.0.0.1:9/v1" and got.home == tmp_path.resolve()


def test_bad_worker_settings_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with pytest.raises(SettingsError, match=WORKER_SETTINGS_ENV):
        worker_settings({})
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(SettingsError, match="unreadable settings snapshot"):
        worker_settings({WORKER_SETTINGS_ENV: str(tmp_path / "bad.json")})
    monkeypatch.setenv("DATADESK_HOME", str(tmp_path / "var"))
    assert main(["serve", "--workers", "0"]) == 2
    assert "--workers / server.workers must be at least 1, not 0" in capsys.readouterr().err
    assert not (tmp_path / "var").exists()  # refused before anything was created
