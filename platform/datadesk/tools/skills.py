"""Skills: `workspaces/<ws>/skills/<name>/SKILL.md`, loaded on demand.

The first line (or a `description:` in front matter) is the one-line
description; the rest is the body. The catalog (names and descriptions) goes
in the stable system message; `load_skill(name)` returns the body, and
`load_skill(name, file)` a text file next to it (regular files only, no
paths outside the skill's folder, size-capped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

from datadesk.domain.records import ToolRecordMeta
from datadesk.sandbox.files import read_regular
from datadesk.store.layout import Layout
from datadesk.tools.arguments import ToolArguments
from datadesk.tools.registry import ToolContext, ToolError, ToolRegistry, ToolResult, ToolSpec

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
MAX_FILE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str
    folder: Path


def parse_skill(text: str) -> tuple[str, str]:
    """(description, body) of a SKILL.md: front matter `description:` or the first line."""
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end > 0:
            head, body = text[4:end], text[end + 4:].lstrip("\n")
            m = re.search(r"^description:\s*(.+)$", head, re.M)
            if m:
                return m.group(1).strip().strip('"'), body
    first, _, rest = text.partition("\n")
    return first.lstrip("# ").strip(), rest.lstrip("\n")


class SkillCatalog:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def skills(self, ws: str) -> list[Skill]:
        root = self.layout.workspace_dir(ws) / "skills"
        found = []
        for folder in sorted(root.iterdir()) if root.is_dir() else ():
            path = folder / "SKILL.md"
            if folder.is_symlink() or not folder.is_dir() or not _NAME.fullmatch(folder.name):
                continue
            try:
                text = read_regular(path, MAX_FILE_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            desc, body = parse_skill(text)
            found.append(Skill(folder.name, desc[:200], body, folder))
        return found

    def catalog_text(self, ws: str) -> str:
        skills = self.skills(ws)
        if not skills:
            return ""
        lines = [f"- {s.name}: {s.description}" for s in skills]
        return "## Skills\nLoad a skill's instructions with `load_skill(name)` before doing that kind of work.\n" + \
            "\n".join(lines)

    def get(self, ws: str, name: str) -> Skill | None:
        return next((s for s in self.skills(ws) if s.name == name), None)


class LoadSkill(ToolArguments):
    """Arguments of `load_skill`."""

    name: str
    file: Annotated[str, msgspec.Meta(description="optional file next to it")] | None = None

    hints = {"name": "`name` must be the name of a skill from the catalog",
             "file": "`file` must be the plain name of a file next to the skill"}


def register_skill_tool(registry: ToolRegistry, catalog: SkillCatalog) -> None:
    async def load_skill(args: LoadSkill, ctx: ToolContext) -> ToolResult:
        name, file = args.name, args.file
        if not name:
            raise ToolError(LoadSkill.hints["name"])
        skill = catalog.get(ctx.workspace, name)
        if skill is None:
            names = ", ".join(s.name for s in catalog.skills(ctx.workspace)) or "none"
            raise ToolError(f"no skill named {name!r} in this workspace; skills: {names}")
        if file is None:
            files = sorted(p.name for p in skill.folder.iterdir() if p.name != "SKILL.md" and p.is_file()
                           and not p.is_symlink())
            extra = f"\n\n(files next to this skill: {', '.join(files)}; load one with load_skill(name, file))" \
                if files else ""
            return ToolResult(content=f"# Skill: {skill.name}\n{skill.body}{extra}",
                              meta=ToolRecordMeta(skill=skill.name))
        if "/" in file or "\\" in file or file.startswith(".") or file == "SKILL.md":
            raise ToolError(LoadSkill.hints["file"])
        try:
            data = read_regular(skill.folder / file, MAX_FILE_BYTES)
        except OSError as exc:
            raise ToolError(f"cannot read {file!r} of skill {name!r}: {exc.strerror or exc}") from None
        return ToolResult(content=data.decode("utf-8", "replace"), meta=ToolRecordMeta(skill=skill.name, file=file))

    registry.register(
        ToolSpec(
            name="load_skill",
            description="Load the instructions of a workspace skill listed in the system message (or a file "
                        "next to it).",
            parameters=LoadSkill.schema(),
            offloadable=False, read_only=True,
        ),
        load_skill,
        LoadSkill,
    )
