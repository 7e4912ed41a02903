"""Tool arguments declared once, as msgspec Structs: the JSON schema the model gets and the
validation of what it sends are both derived from the same class.

A field's type and `Meta(description=...)` make its schema; a default makes it optional;
`X | None = None` is an optional field that also accepts an explicit null (the schema says
just X). The schema sent to the model is kept plain, as hand-written ones were: `$defs`
inlined, no titles, no defaults (descriptions say them in words), `type` first and
`description` last in each property, and `additionalProperties: false`. Unknown keys are
ignored on input, as before: the model's extra keys never fail a call.

`hints` (a class attribute) adds a sentence per field to its validation error, telling the
model what the field must hold.
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, TypeVar

import msgspec

A = TypeVar("A", bound="ToolArguments")
_AT_FIELD = re.compile(r"- at `\$\.(\w+)")  # the top-level field a msgspec error points at


class ToolArguments(msgspec.Struct, kw_only=True):
    """Base of the arguments Structs of built-in tools."""

    hints: ClassVar[dict[str, str]] = {}

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The JSON schema sent to the model as the tool's `parameters`."""
        return arguments_schema(cls)


class InvalidArguments(ValueError):
    """The arguments do not match the tool's declaration; the message names the bad field."""


@functools.cache
def arguments_schema(kind: type[ToolArguments]) -> dict[str, Any]:
    """The JSON schema of `kind`'s fields, as sent to the model (see the module docstring)."""
    raw = msgspec.json.schema(kind)
    defs = raw.get("$defs", {})
    return _plain(_resolve(raw, defs), top=True)


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            siblings = {k: v for k, v in node.items() if k != "$ref"}  # e.g. the field's description
            return {**_resolve(defs[ref.removeprefix("#/$defs/")], defs), **_resolve(siblings, defs)}
        return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _plain(schema: dict[str, Any], top: bool = False) -> dict[str, Any]:
    options = schema.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        schema = {**next(o for o in options if o != {"type": "null"}),
                  **{k: v for k, v in schema.items() if k != "anyOf"}}
    if schema.get("type") == "object" and "properties" in schema:
        out: dict[str, Any] = {"type": "object",
                               "properties": {k: _plain(v) for k, v in schema["properties"].items()}}
        if schema.get("required"):
            out["required"] = list(schema["required"])
        out["additionalProperties"] = False
        if not top and "description" in schema:  # the top Struct's docstring is for the code's readers
            out["description"] = schema["description"]
        return out
    body = {k: v for k, v in schema.items() if k not in ("title", "default", "description")}
    ordered = {"type": body.pop("type")} if "type" in body else {}
    ordered.update(body)
    if "description" in schema:
        ordered["description"] = schema["description"]
    return ordered


def parse_arguments(tool: str, args: dict[str, Any], kind: type[A]) -> A:
    """`args` (decoded JSON) as `kind`, or InvalidArguments naming the field and what it must hold."""
    try:
        return msgspec.convert(args, kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        at = _AT_FIELD.search(text)
        hint = kind.hints.get(at.group(1)) if at else None
        raise InvalidArguments(f"invalid arguments for {tool!r}: {text}" + (f"; {hint}" if hint else "")) from None
