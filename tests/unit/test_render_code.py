"""Server-side highlighting (issue 19): Pygments token spans with classes only, kept by the
sanitizer only when they are token classes; tool inputs highlighted; offload previews split."""

from __future__ import annotations

from datadesk.api.render import code_html, markdown_html, sanitize, tool_html, tool_input_html


def test_fenced_code_is_highlighted_with_token_classes_only() -> None:
    out = markdown_html("```python\nimport pandas as pd\nprint('<b>')\n```")
    assert '<span class="pyg-kn">import</span>' in out and "&lt;b&gt;" in out
    assert "style=" not in out and "<b>" not in out
    assert 'class="language-python"' in out
    plain = markdown_html("```nosuchlang\nx <y>\n```")
    assert "x &lt;y&gt;" in plain and "<span" not in plain


def test_the_sanitizer_drops_classes_that_are_not_token_classes() -> None:
    out = sanitize('<span class="toast error">a</span><span class="pyg-k">b</span><span style="color:red">c</span>')
    assert out == '<span>a</span><span class="pyg-k">b</span><span>c</span>'


def test_tool_inputs_sql_and_python() -> None:
    sql = tool_input_html('{"sql": "SELECT kwh FROM readings WHERE x = \'<i>\'"}')
    assert sql.startswith('<pre><code class="language-sql">') and '<span class="pyg-k">SELECT</span>' in sql
    assert "&lt;i&gt;" in sql
    assert '<span class="pyg-k">def</span>' in tool_input_html('{"code": "def f():\\n    return 1"}')
    assert tool_input_html('{"artifact_id": "a1"}') is None and tool_input_html("not json") is None
    assert "<span" not in code_html("x" * 200_000, "python")


def test_offload_preview_is_shown_apart_from_what_the_model_was_told() -> None:
    text = ("[Result saved as artifact a1: the full data is NOT in this message.]\nsandbox path: /data/a1.parquet\n"
            "preview (first 1 of 9 rows):\n| x | y |\n|---|---|\n| 1 | 2 |\nNOTICE: this is a preview of 1 rows")
    out = tool_html(text)
    table, note = out.split('<div class="model-note">')
    assert table.startswith('<div class="preview-table"><table>') and "NOTICE" not in table
    assert "NOTICE: this is a preview" in note and "<table>" not in note and "sandbox path" in note
