"""Model profiles: how a request is shaped for a model family.

A profile says: the context window and the output reserved in it; vision;
where the summary and memory go (a second system message, or a labelled
user-role preamble for chat templates that reject a later system message);
whether reasoning fields are replayed; and the starting token-count
correction (cl100k miscounts other families; calibration refines it).
Defaults cover common families; `context.profiles` overrides by glob pattern.
"""

from __future__ import annotations

import fnmatch
from typing import Literal

import msgspec

from datadesk.settings import ContextSettings, ModelProfileSettings


class ModelProfile(msgspec.Struct, frozen=True):
    name: str
    window_tokens: int = 128_000
    reserved_output_tokens: int = 4_096
    vision: bool = False
    preamble: Literal["system", "user"] = "system"
    replay_reasoning: bool = False
    token_factor: float = 1.0


# First match wins (patterns are matched against the lower-cased model name).
FAMILY_DEFAULTS: list[tuple[str, ModelProfile]] = [
    ("gpt-4o*", ModelProfile("gpt-4o", 128_000, 16_384, vision=True)),
    ("gpt-4.1*", ModelProfile("gpt-4.1", 1_000_000, 32_768, vision=True)),
    ("gpt-5*", ModelProfile("gpt-5", 400_000, 32_768, vision=True)),
    ("o[134]*", ModelProfile("o-series", 200_000, 32_768, vision=True)),
    ("claude*", ModelProfile("claude", 200_000, 8_192, vision=True, token_factor=1.15)),
    ("*deepseek*", ModelProfile("deepseek", 128_000, 8_192, preamble="user", replay_reasoning=False,
                                token_factor=1.1)),
    ("*qwen*vl*", ModelProfile("qwen-vl", 32_768, 4_096, vision=True, preamble="user", token_factor=1.15)),
    ("*qwen*", ModelProfile("qwen", 32_768, 4_096, preamble="user", token_factor=1.15)),
    ("*llama*", ModelProfile("llama", 128_000, 4_096, preamble="user", token_factor=1.15)),
    ("*mistral*", ModelProfile("mistral", 32_768, 4_096, preamble="user", token_factor=1.15)),
    ("*gemma*", ModelProfile("gemma", 8_192, 2_048, preamble="user", token_factor=1.15)),
    ("demo*", ModelProfile("demo", 128_000, 4_096)),
    ("scripted*", ModelProfile("scripted", 128_000, 4_096)),
]
DEFAULT = ModelProfile("default", 32_768, 4_096, preamble="user", token_factor=1.1)


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
    return msgspec.structs.replace(base, name=f"{base.name}+{pattern}", **changes)
