"""The rules a CRD schema must keep to be *structural*, and a checker run on every schema made.

Why it exists: the API server refuses a CRD whose schema is not structural (apiextensions-
apiserver's ``ValidateStructural`` and its CRD OpenAPI schema validation): every node has one
type, no ``$ref``, no ``anyOf`` except int-or-string, ``properties`` and
``additionalProperties`` never together, no ``title``. This module states those rules, and the
ones Keelgate adds (a description on every field for ``kubectl explain``, defaults that
validate), so generation fails here rather than at ``kubectl apply``. ``draft4`` turns a
structural node into a JSON schema that validates what the API server validates, for tests. It
must never accept a node the API server would refuse, nor depend on how schemas are generated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jsonschema

# Formats the API server knows; any other would be refused or ignored with a warning.
KNOWN_FORMATS = frozenset(
    {"date-time", "date", "duration", "byte", "int32", "int64", "float", "double", "uuid"}
)
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
# Keys of a schema node in the order they are written, so the files diff well.
KEY_ORDER = (
    "description",
    "type",
    "format",
    "nullable",
    "enum",
    "default",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "anyOf",
    "required",
    "properties",
    "items",
    "additionalProperties",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)
TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


_FORBIDDEN = {
    "$ref": "$ref is not supported (inline it)",
    "$defs": "$defs is not supported",
    "definitions": "definitions is not supported",
    "title": "title is not kept",
    "const": "const is not OpenAPI v3.0 (use enum)",
    "oneOf": "oneOf is not structural",
    "allOf": "allOf is not structural",
    "not": "not is not structural",
    "patternProperties": "patternProperties is not supported",
    "dependencies": "dependencies is not supported",
    "additionalItems": "additionalItems is not supported",
    "uniqueItems": "uniqueItems is not supported (use x-kubernetes-list-type: set)",
    "id": "id is not supported",
}


def structural_problems(schema: Mapping[str, Any]) -> list[str]:
    """Every way ``schema`` breaks the rules this generator promises (the API server's
    structural-schema rules, plus: a description on every field for ``kubectl explain``, and
    defaults that validate); empty when it keeps them all."""
    problems: list[str] = []
    _check(schema, "", "root", problems)
    return problems


def _check(node: Any, where: str, level: str, problems: list[str]) -> None:
    at = where or "<root>"
    if not isinstance(node, Mapping):
        problems.append(f"{at}: a schema must be a mapping")
        return
    for key, why in _FORBIDDEN.items():
        if key in node:
            problems.append(f"{at}: {why}")
    unknown = set(node) - set(KEY_ORDER) - set(_FORBIDDEN)
    if unknown:
        problems.append(f"{at}: unknown keywords {sorted(unknown)}")
    kind = node.get("type")
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    int_or_string = node.get("x-kubernetes-int-or-string")
    if preserve is not None and preserve is not True:
        problems.append(f"{at}: x-kubernetes-preserve-unknown-fields must be true or absent")
    if kind is None:
        if not (preserve or int_or_string) or level == "root":
            problems.append(f"{at}: type must not be empty")
    elif kind not in TYPES:
        problems.append(f"{at}: type {kind!r} is not one of {sorted(TYPES)} (null: nullable)")
    if level == "root" and kind != "object":
        problems.append(f"{at}: the root must be an object")
    if "anyOf" in node and not (int_or_string and kind is None and node["anyOf"] == INT_OR_STRING):
        problems.append(f"{at}: anyOf is only allowed as int-or-string")
    if int_or_string and (kind is not None or preserve):
        problems.append(f"{at}: int-or-string takes no type and no preserve-unknown-fields")
    if "nullable" in node and node["nullable"] is not True:
        problems.append(f"{at}: nullable must be true or absent")
    if node.get("nullable") and "enum" in node:
        problems.append(f"{at}: a nullable enum refuses null on the API server")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            problems.append(f"{at}: {key} must be a flag on minimum/maximum (OpenAPI v3.0)")
    if level == "field" and not node.get("description"):
        problems.append(f"{at}: a field needs a description (kubectl explain shows it)")
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except re.error as error:
            problems.append(f"{at}: pattern does not compile: {error}")

    properties = node.get("properties")
    additional = node.get("additionalProperties")
    if properties is not None and additional is not None:
        problems.append(f"{at}: properties and additionalProperties are mutually exclusive")
    if additional is not None and not isinstance(additional, Mapping):
        problems.append(f"{at}: additionalProperties must be a schema (true: preserve fields)")
    if (properties is not None or additional is not None) and kind != "object":
        problems.append(f"{at}: properties need type: object")
    if kind == "array" and "items" not in node:
        problems.append(f"{at}: an array needs items")
    if "items" in node and kind != "array":
        problems.append(f"{at}: items need type: array")
    for key in node.get("required", []):
        if properties is None or key not in properties:
            problems.append(f"{at}: required field {key!r} is not a property")
    if "x-kubernetes-list-type" in node and kind != "array":
        problems.append(f"{at}: x-kubernetes-list-type needs type: array")
    if "default" in node:
        try:
            jsonschema.Draft4Validator(draft4(node)).validate(node["default"])
        except jsonschema.ValidationError as error:
            problems.append(f"{at}: the default does not validate: {error.message}")
        if level == "root":
            problems.append(f"{at}: no default at the root")

    if level == "root" and isinstance(properties, Mapping):
        metadata = properties.get("metadata")
        if metadata is not None and dict(metadata) != {"type": "object"}:
            problems.append("metadata: must be {type: object}: the API server owns its schema")
    for name, sub in (properties or {}).items():
        sub_level = "metadata" if level == "root" and name == "metadata" else "field"
        _check(sub, f"{where}.{name}" if where else name, sub_level, problems)
    if "items" in node:
        _check(node["items"], f"{where}[]", "items", problems)
    if isinstance(additional, Mapping):
        _check(additional, f"{where}.*", "items", problems)


def draft4(node: Mapping[str, Any], *, strict: bool = False) -> dict[str, Any]:
    """A structural node as a JSON schema (draft 4, whose exclusiveMinimum is a flag like
    OpenAPI v3.0's) that validates what the API server validates: ``nullable`` becomes a
    ``null`` type. With ``strict``, an object without preserve-unknown-fields refuses unknown
    fields, as ``kubectl apply``'s (default) strict field validation does."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: draft4(sub, strict=strict) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = draft4(value, strict=strict)
        elif key == "anyOf":
            out[key] = [draft4(option, strict=strict) for option in value]
        elif key == "x-kubernetes-validations" or key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    if strict and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out
