"""Checking a tool call's arguments against the tool's input schema before anything is sent.

The model is told each tool's JSON Schema; arguments that break it are the model's mistake and
become a ToolError the model sees, so no request leaves with them. Every tool kind (http, mcp,
python) uses this one checker. It must never change the arguments (no defaults filled in, no
coercion): what is checked is exactly what is sent and what the idempotency key was derived from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols

from keelgate.errors import InputError, ToolError

MESSAGE_CAP = 300


class ArgsSchema:
    """A compiled input schema. A schema that is itself invalid is an InputError at build time."""

    def __init__(self, schema: Mapping[str, Any], *, field: str = "inputSchema") -> None:
        self.schema = dict(schema)
        if self.schema.get("type", "object") != "object":
            raise InputError(field, "a tool's input schema must describe an object")
        cls = jsonschema.validators.validator_for(
            self.schema, default=jsonschema.Draft202012Validator
        )
        try:
            _checked(cls, json.dumps(self.schema, sort_keys=True, default=str))
        except jsonschema.exceptions.SchemaError as error:
            raise InputError(
                field, f"not a valid JSON Schema: {_one_line(error.message)}"
            ) from None
        self._validator: jsonschema.protocols.Validator = cls(
            self.schema, format_checker=cls.FORMAT_CHECKER
        )

    def check(self, tool: str, args: Mapping[str, Any]) -> None:
        """Raise ToolError naming the first offending argument; return if the arguments fit."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(dict(args)))
        if error is None:
            return
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ToolError(
            f"{tool}: arguments do not match the input schema: "
            f"{'args' + where + ': ' if where else ''}{_one_line(error.message)}"
        )


@functools.lru_cache(maxsize=256)
def _checked(cls: type[jsonschema.protocols.Validator], schema: str) -> None:
    """Check a schema against its meta-schema (a few milliseconds each: a step builds every
    tool, and most tools share a schema or two); only a schema that passed is remembered."""
    cls.check_schema(json.loads(schema))


def check_args(tool: str, schema: Mapping[str, Any], args: Mapping[str, Any]) -> None:
    """One-off form of ``ArgsSchema(schema).check(tool, args)`` (compiles each time)."""
    ArgsSchema(schema).check(tool, args)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CAP else text[: MESSAGE_CAP - 3] + "..."
