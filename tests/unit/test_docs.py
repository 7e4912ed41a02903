"""The README documents every setting, every tool and the two set-up commands."""

from __future__ import annotations

import re
from pathlib import Path

from datadesk.settings import ENV_VARS, FALLBACK_ENV_VARS, iter_setting_names

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_setting_is_documented() -> None:
    missing = [name for name in iter_setting_names() if f"`{name}`" not in README]
    assert not missing, f"settings missing from README.md: {missing}"


def test_every_environment_variable_is_documented() -> None:
    names = [*ENV_VARS, *FALLBACK_ENV_VARS, "DATADESK_HOME", "DATADESK_CONFIG"]
    missing = [v for v in names if f"`{v}`" not in README]
    assert not missing, f"environment variables missing from README.md: {missing}"


def test_every_builtin_tool_is_documented(tmp_path: Path) -> None:
    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.settings import Settings

    rt = Runtime(settings=Settings(home=tmp_path), model=ScriptedModel([]))
    missing = [n for n in rt.tools.names() if f"`{n}`" not in README]
    assert not missing, f"tools missing from README.md: {missing}"


def test_readme_names_the_two_setup_commands_and_ci_uses_the_test_one() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README, flags=re.S)
    assert "pip install -e . && datadesk serve" in blocks
    test_cmd = "pip install -e '.[test]' && python -m pytest"
    assert test_cmd in blocks
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_platform_has_no_init_file() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()
