"""The documentation: the README is a landing page, `docs/` holds the rest (built with MkDocs).

Every setting has its own heading in docs/reference.md, every environment variable and every
built-in tool is documented, every relative link in README.md and docs/ resolves (to a file and,
with `#anchor`, to a heading of it, slugged as MkDocs does), every page is in the nav, and
`mkdocs build --strict` passes. The README keeps the two set-up commands.
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from datadesk.settings import ENV_VARS, FALLBACK_ENV_VARS, iter_setting_names

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = sorted(DOCS.rglob("*.md"))
ALL_TEXT = "\n".join([README, *(p.read_text(encoding="utf-8") for p in PAGES)])
REFERENCE = DOCS / "reference.md"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slugify(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading: inline markup dropped,
    ASCII only, word characters, spaces and hyphens kept, lower case, runs of spaces and
    hyphens joined into one hyphen."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(path: Path) -> list[tuple[int, str]]:
    """(level, text) of every heading of a Markdown file, outside code blocks."""
    return [(len(m.group(1)), m.group(2)) for m in _HEADING.finditer(_FENCE.sub("", path.read_text("utf-8")))]


def anchors(path: Path) -> set[str]:
    """The ids MkDocs gives the headings of `path` (a repeated one gets `_1`, `_2`, ...)."""
    seen: set[str] = set()
    for _, text in headings(path):
        slug = base = slugify(text)
        n = 1
        while slug in seen:
            slug, n = f"{base}_{n}", n + 1
        seen.add(slug)
    return seen


def test_readme_is_a_landing_page() -> None:
    lines = README.count("\n")
    assert lines < 300, f"README.md has {lines} lines; move the detail to docs/"
    assert "](docs/images/chat.png)" in README, "the README shows the screenshot"
    image = DOCS / "images" / "chat.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size < 300_000


def test_every_setting_has_its_own_heading_in_the_reference() -> None:
    names = iter_setting_names()
    counts: dict[str, int] = {}
    group = ""
    stale: list[str] = []
    misplaced: list[str] = []
    for level, text in headings(REFERENCE):
        if level == 2:
            group = text
        elif level == 3 and re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", text):
            counts[text] = counts.get(text, 0) + 1
            if text not in names:
                stale.append(text)
            want = f"[{text.split('.')[0]}]" if "." in text else "Top level"
            if group != want:
                misplaced.append(f"{text} under {group!r}, not {want!r}")
    missing = [n for n in names if n not in counts]
    assert not missing, f"settings without a '### <name>' heading in docs/reference.md: {missing}"
    assert not stale, f"headings in docs/reference.md for settings that do not exist: {stale}"
    assert not [n for n, c in counts.items() if c > 1], "a setting has more than one heading"
    assert not misplaced, misplaced


def test_every_environment_variable_is_documented() -> None:
    names = [*ENV_VARS, *FALLBACK_ENV_VARS, "DATADESK_HOME", "DATADESK_CONFIG"]
    ref = REFERENCE.read_text(encoding="utf-8")
    missing = [v for v in names if f"`{v}`" not in ref]
    assert not missing, f"environment variables missing from docs/reference.md: {missing}"


def test_every_builtin_tool_is_documented(tmp_path: Path) -> None:
    from datadesk.composition import Runtime
    from datadesk.llm.scripted import ScriptedModel
    from datadesk.settings import Settings

    rt = Runtime(settings=Settings(home=tmp_path), model=ScriptedModel([]))
    missing = [n for n in rt.tools.names() if f"`{n}`" not in ALL_TEXT]
    assert not missing, f"tools missing from README.md and docs/: {missing}"


def test_readme_names_the_two_setup_commands_and_ci_uses_the_test_one() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README, flags=re.S)
    assert "pip install -e . && datadesk serve" in blocks
    # both lanes: the parallel one (pytest-xdist), then the serial one
    test_cmd = """pip install -e '.[test]' && python -m pytest -n auto -m "not serial" && python -m pytest -m serial"""
    assert test_cmd in blocks
    assert test_cmd in (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in (DOCS / "getting-started.md").read_text()


def test_every_pytest_marker_is_in_the_table_of_the_test_docs() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    names = [m.split(":")[0] for m in config["markers"]]
    page = (DOCS / "getting-started.md").read_text()
    missing = [n for n in names if f"| `{n}` |" not in page]
    assert "serial" in names and not missing, f"markers missing from docs/getting-started.md: {missing}"


def test_slugs_match_python_markdown() -> None:
    assert slugify("The `sql_query` tool") == "the-sql_query-tool"
    assert slugify("Offload shapes: what a tool's text may look like") == (
        "offload-shapes-what-a-tools-text-may-look-like")
    assert slugify("Kernels on Jupyter Enterprise Gateway (Kubernetes)") == (
        "kernels-on-jupyter-enterprise-gateway-kubernetes")
    assert slugify("llm.model") == "llmmodel" and slugify("[llm]") == "llm"
    toc = pytest.importorskip("markdown.extensions.toc", reason="Python-Markdown (comes with mkdocs)")
    for page in PAGES:
        for _, text in headings(page):
            if "`" not in text and "[" not in text:  # markup is stripped before its slugify
                assert slugify(text) == toc.slugify(text, "-"), (page.name, text)


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_file():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.name}")
        elif path and not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif page != ROOT / "README.md" and path and not dest.is_relative_to(DOCS):
            broken.append(f"{target}: outside docs/ (MkDocs cannot link it)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_every_page_is_in_the_nav() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"

    def walk(items: list) -> list[str]:
        out: list[str] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += walk(value) if isinstance(value, list) else [value]
        return out

    nav = walk(config["nav"])
    pages = [p.relative_to(DOCS).as_posix() for p in PAGES]
    assert sorted(nav) == sorted(pages), f"nav {sorted(nav)} != pages {sorted(pages)}"


def test_mkdocs_build_is_strict_and_clean(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (it is in the [test] extras: pip install -e '.[test]')")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stderr, r.stderr
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def test_platform_has_no_init_file() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()
