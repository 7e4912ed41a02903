"""Model profiles: how a request is shaped for a model family.

A profile says: the context window and the output reserved in it; vision;
where the summary and memory go (a second system message, or a labelled
user-role preamble for chat templates that reject a later system message);
whether reasoning fields are replayed; the starting token-count
correction (cl100k miscounts other families; calibration refines it); and how
a JSON answer (the thread summary) can be asked for:

- `json_schema`: structured outputs, `response_format={"type": "json_schema", ...}`
  with the schema (OpenAI, vLLM's guided decoding, Ollama >= 0.5);
- `json_object`: JSON mode only, `response_format={"type": "json_object"}`
  (DeepSeek, Qwen on DashScope, most other OpenAI-compatible servers);
- `none`: the prompt alone asks for JSON; the tolerant reader (`llm.reply_json`) and the
  validation retry do the rest.

The model name says the family; the provider (`llm.provider`, or guessed from the base
URL) says what its server supports, and wins over the family for `structured_output`.
Defaults cover common families; `context.profiles` overrides by glob pattern.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from datadesk.settings import ContextSettings, ModelProfileSettings, Settings


StructuredOutput = Literal["json_schema", "json_object", "none"]
OUTPUT_MODES: tuple[str, ...] = ("json_schema", "json_object", "none")  # strongest first


class ModelProfile(msgspec.Struct, frozen=True):
    name: str
    window_tokens: int = 128_000
    reserved_output_tokens: int = 4_096
    vision: bool = False
    preamble: Literal["system", "user"] = "system"
    replay_reasoning: bool = False
    token_factor: float = 1.0
    structured_output: StructuredOutput = "json_object"


# First match wins (patterns are matched against the lower-cased model name).
FAMILY_DEFAULTS: list[tuple[str, ModelProfile]] = [
    ("gpt-4o*", ModelProfile("gpt-4o", 128_000, 16_384, vision=True, structured_output="json_schema")),
    ("gpt-4.1*", ModelProfile("gpt-4.1", 1_000_000, 32_768, vision=True, structured_output="json_schema")),
    ("gpt-5*", ModelProfile("gpt-5", 400_000, 32_768, vision=True, structured_output="json_schema")),
    ("o[134]*", ModelProfile("o-series", 200_000, 32_768, vision=True, structured_output="json_schema")),
    ("claude*", ModelProfile("claude", 200_000, 8_192, vision=True, token_factor=1.15, structured_output="none")),
    ("*deepseek*", ModelProfile("deepseek", 128_000, 8_192, preamble="user", replay_reasoning=False,
                                token_factor=1.1)),
    ("*qwen*vl*", ModelProfile("qwen-vl", 32_768, 4_096, vision=True, preamble="user", token_factor=1.15)),
    ("*qwen*", ModelProfile("qwen", 32_768, 4_096, preamble="user", token_factor=1.15)),
    ("*llama*", ModelProfile("llama", 128_000, 4_096, preamble="user", token_factor=1.15)),
    ("*mistral*", ModelProfile("mistral", 32_768, 4_096, preamble="user", token_factor=1.15)),
    ("*gemma*", ModelProfile("gemma", 8_192, 2_048, preamble="user", token_factor=1.15)),
    ("demo*", ModelProfile("demo", 128_000, 4_096, structured_output="none")),
    ("scripted*", ModelProfile("scripted", 128_000, 4_096, structured_output="none")),
]
DEFAULT = ModelProfile("default", 32_768, 4_096, preamble="user", token_factor=1.1)


# What each provider's server supports for a JSON answer (`llm.provider`).
PROVIDER_OUTPUT: dict[str, StructuredOutput] = {
    "openai": "json_schema",  # structured outputs (strict schema)
    "vllm": "json_schema",  # guided decoding from the schema
    "ollama": "json_schema",  # Ollama >= 0.5: grammar-constrained from the schema
    "deepseek": "json_object",  # JSON mode only (the prompt must say "json": it does)
    "qwen": "json_object",  # DashScope's compatible mode: JSON mode
}
PROVIDERS = ("auto", "generic", *PROVIDER_OUTPUT)


def provider_for(configured: str, base_url: str | None) -> str:
    """`configured` unless it is "auto"; then a guess from the base URL ("generic" when unknown)."""
    if configured not in PROVIDERS:
        raise ValueError(f"llm.provider must be one of {', '.join(PROVIDERS)}, not {configured!r}")
    if configured != "auto":
        return configured
    parts = urlsplit(base_url or "")
    host = (parts.hostname or "").lower()
    if host == "api.openai.com" or host.endswith(".openai.azure.com"):
        return "openai"
    if "deepseek" in host:
        return "deepseek"
    if "dashscope" in host or "aliyuncs" in host:
        return "qwen"
    if "ollama" in host or parts.port == 11434:
        return "ollama"
    return "generic"


def structured_output_for(model: str, settings: ContextSettings, provider: str = "auto",
                          base_url: str | None = None) -> StructuredOutput:
    """How to ask `model` for a JSON answer: a `context.profiles` override that sets
    `structured_output` wins, then the provider's support, then the model family's default."""
    name = model.lower()
    for pattern, override in settings.profiles.items():
        if fnmatch.fnmatch(name, pattern.lower()):
            if override.structured_output is not None:
                return _check_output(pattern, override.structured_output)
            break  # the first matching override is the one that applies (as in profile_for)
    known = PROVIDER_OUTPUT.get(provider_for(provider, base_url))
    return known if known is not None else profile_for(model, settings).structured_output


def summary_output(model: Any, settings: Settings) -> StructuredOutput:
    """`structured_output_for` the summarizer's model: its name, and the provider of the configured
    LLM when it is that endpoint's client (a separately built summary model keeps its family default)."""
    name = str(getattr(model, "name", "") or "")
    base_url = getattr(model, "base_url", None)  # an OpenAI-compatible client's endpoint
    provider = settings.llm.provider if base_url is not None else "generic"
    return structured_output_for(name, settings.context, provider, base_url)


def _check_output(pattern: str, value: str) -> StructuredOutput:
    if value not in OUTPUT_MODES:
        raise ValueError(f"context.profiles.{pattern}.structured_output must be one of "
                         f"{', '.join(OUTPUT_MODES)}, not {value!r}")
    return value  # type: ignore[return-value]


def profile_for(model: str, settings: ContextSettings) -> ModelProfile:
    """The family default for `model`, with the first matching configured override applied."""
    name = model.lower()
    base = next((p for pat, p in FAMILY_DEFAULTS if fnmatch.fnmatch(name, pat)), DEFAULT)
    for pattern, override in settings.profiles.items():
        if fnmatch.fnmatch(name, pattern.lower()):
            return _apply(base, pattern, override)
    return base


def _apply(base: ModelProfile, pattern: str, o: ModelProfileSettings) -> ModelProfile:
    changes = {k: v for k, v in msgspec.structs.asdict(o).items() if v is not None}
    if changes.get("preamble") not in (None, "system", "user"):
        raise ValueError(f"context.profiles.{pattern}.preamble must be 'system' or 'user'")
    if "structured_output" in changes:
        _check_output(pattern, changes["structured_output"])
    return msgspec.structs.replace(base, name=f"{base.name}+{pattern}", **changes)
