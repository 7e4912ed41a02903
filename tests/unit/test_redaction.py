"""The one redaction rule (datadesk.domain.redaction) that logs, MCP, the LLM client and memory share."""

from __future__ import annotations

import pytest

from datadesk.api.guards.auth import redact as auth_redact
from datadesk.domain.redaction import REDACTED, find_secrets, redact
from datadesk.memory.secrets import redact_secrets
from datadesk.tools.mcp.config import redact as mcp_redact

# what the access-log filter and the MCP stderr filter each removed before they were one rule
LOG_LINES = {
    "login code": ("GET /login?code=SECRETCODE&next=/ HTTP/1.1", "SECRETCODE", "&next=/"),
    "api token": ("token ddt_abcdef used", "ddt_abcdef", "used"),
    "bearer": ("Authorization: Bearer xyz", "xyz", "Authorization: Bearer"),
    "key param": ("GET /x?api_key=k3y&key=other", "k3y", "/x?"),
    "json key": ('{"api_key": "abc", "rows": 3}', "abc", '"rows": 3'),
    "password colon": ("password: hunter2", "hunter2", "password"),
    "basic": ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA", "Basic"),
    "openai": ("starting with sk-live-abcdef123456", "abcdef123456", "starting with sk-"),
    "github": ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c838347Ae178B4a", "ghp_"),
    "slack": ("xoxb-2048-4096-AbCdEfGh", "AbCdEfGh", "xoxb-"),
    "aws": ("key AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE", "AKIA"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_nature", "eyJzdWIiOiIxIn0", ""),
    "url credentials": ("postgres://analyst:s3cr3t@db:5432/x", "s3cr3t", "postgres://analyst:"),
}


@pytest.mark.parametrize("name", list(LOG_LINES))
def test_every_call_site_removes_the_union_of_the_old_patterns(name: str) -> None:
    line, secret, kept = LOG_LINES[name]
    for fn in (redact, auth_redact, mcp_redact):
        out = fn(line)
        assert secret not in out and REDACTED in out and kept in out, (fn, out)


def test_known_values_go_wherever_they_appear() -> None:
    out = redact("server said: wrong key plain-s3cret-value (expected x)", ("plain-s3cret-value", "ab"))
    assert "plain-s3cret-value" not in out and "[REDACTED]" in out
    assert redact("a tab", ("ab",)) == "a tab"  # values under 4 characters are never searched


def test_a_log_line_loses_any_assigned_value_but_prose_keeps_words() -> None:
    assert redact("Token = per-building") == "Token = [REDACTED]"
    assert redact("Token = per-building", prose=True) == "Token = per-building"
    assert find_secrets("Token = per-building") == []
    assert redact("the token budget is 32000") == "the token budget is 32000"
    assert redact("the bearer of the report", prose=True) == "the bearer of the report"
    assert redact("basic statistics first", prose=True) == "basic statistics first"


def test_prose_redaction_uses_the_memory_placeholder() -> None:
    out = redact_secrets("my password is Summer2024! and the key AKIAIOSFODNN7EXAMPLE")
    assert "Summer2024" not in out and "IOSFODNN7EXAMPLE" not in out and out.count("[secret]") == 2
    assert redact_secrets("card 4111 1111 1111 1111 exp 12/27") == "card [secret] exp 12/27"
    assert redact_secrets("meter 1234567890123 reads 42 kWh") == "meter 1234567890123 reads 42 kWh"  # not Luhn
