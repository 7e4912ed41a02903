from __future__ import annotations

from pathlib import Path

import pytest

from datadesk.settings import Settings, SettingsError, load_settings


def test_datadesk_variables_win_over_openai_fallbacks(tmp_path: Path) -> None:
    env = {"DATADESK_HOME": str(tmp_path), "OPENAI_BASE_URL": "http://a/v1", "OPENAI_API_KEY": "k1",
           "DATADESK_LLM_BASE_URL": "http://b/v1", "DATADESK_LLM_MODEL": "m"}
    s = load_settings(env)
    assert s.home == tmp_path
    assert s.llm.base_url == "http://b/v1"
    assert s.llm.api_key == "k1"
    assert s.llm.model == "m"
    assert s.llm_configured


def test_toml_file_then_environment(tmp_path: Path) -> None:
    (tmp_path / "datadesk.toml").write_text('[chat]\nmax_steps = 5\n[server]\nport = 9001\n')
    s = load_settings({"DATADESK_HOME": str(tmp_path), "DATADESK_PORT": "9002"})
    assert s.chat.max_steps == 5
    assert s.server.port == 9002
    assert not s.llm_configured


def test_bad_toml_key_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "datadesk.toml").write_text('[chat]\nmax_stepz = 5\n')
    with pytest.raises(SettingsError, match=r"datadesk.toml.*max_stepz"):
        load_settings({"DATADESK_HOME": str(tmp_path)})


def test_bad_value_type(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="port"):
        load_settings({"DATADESK_HOME": str(tmp_path), "DATADESK_PORT": "eighty"})


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        load_settings({"DATADESK_CONFIG": str(tmp_path / "nope.toml")})


def test_tests_build_settings_directly(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    assert s.chat.max_steps == 12 and s.chat.max_turns_per_user == 2


def test_the_gil_switch_interval_is_read_and_bounded(tmp_path: Path) -> None:
    assert load_settings({"DATADESK_HOME": str(tmp_path)}).server.gil_switch_interval_ms == 1.0
    (tmp_path / "datadesk.toml").write_text('[server]\ngil_switch_interval_ms = 5\n')
    assert load_settings({"DATADESK_HOME": str(tmp_path)}).server.gil_switch_interval_ms == 5.0
    for bad in ("0", "-1", "1000"):
        (tmp_path / "datadesk.toml").write_text(f'[server]\ngil_switch_interval_ms = {bad}\n')
        with pytest.raises(SettingsError, match="gil_switch_interval_ms"):
            load_settings({"DATADESK_HOME": str(tmp_path)})
