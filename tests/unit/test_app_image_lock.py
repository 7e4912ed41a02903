"""The app image is built offline from a lock (app_image/requirements.txt) plus what pyproject.toml
declares: a pin that contradicts a declared dependency would make that build fail."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def test_the_app_image_lock_agrees_with_the_declared_dependencies() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins: dict[str, str] = {}
    for line in (ROOT / "app_image" / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"app_image/requirements.txt: {line!r} is not an exact pin (name==version)"
            pins[_name(name)] = version
    problems = []
    for spec in declared:
        req = Requirement(spec)
        version = pins.get(_name(req.name))
        if version is not None and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version} does not satisfy {spec!r}")
    assert not problems, ("app_image/requirements.txt is out of date with pyproject.toml: "
                          + "; ".join(problems))
