"""The structural OpenAPI schema of each kind, generated from its manifest model, and its CRD.

Why it exists: the manifest models are the single source of truth, so the API server must refuse
what ``keelgate run`` refuses, as far as an OpenAPI schema and CEL rules can say it, and must
keep (never prune) anything the models accept. A GitOps pipeline then fails at ``kubectl apply``
rather than at the operator's first step. pydantic writes JSON Schema (draft 2020-12); a CRD
speaks OpenAPI v3.0 and the API server's structural rules (``keelgate.kube.crds.structural``).
``CrdJsonSchema`` speaks that dialect where pydantic offers a hook (nullable values, enums);
``openapi_schema`` translates the rest ($refs inlined, bounds, formats, unknown fields) and
checks the result. It must never drop a JSON-schema keyword it does not understand (that is an
error, so a new model construct cannot silently loosen the CRD), and never talk to a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from keelgate.core.values import INT64_MAX
from keelgate.errors import KeelgateError
from keelgate.kube.crds.kinds import CATEGORY, Kind, cel_rule
from keelgate.kube.crds.structural import (
    INT_OR_STRING,
    KEY_ORDER,
    KNOWN_FORMATS,
    TYPES,
    structural_problems,
)
from keelgate.kube.naming import GROUP, VERSION

_KEPT = frozenset(KEY_ORDER) - {"properties", "items", "additionalProperties", "anyOf"}


class CrdError(KeelgateError):
    """A model cannot be expressed as a structural CRD schema (a generator bug or a model
    construct to translate first): generation stops rather than emit a looser schema."""


class CrdJsonSchema(GenerateJsonSchema):
    """pydantic's JSON schema in a CRD's dialect, where pydantic has a hook for it.

    ``X | None`` is X marked ``nullable`` (OpenAPI v3.0 has no ``null`` type, and a structural
    schema no ``anyOf`` for it). A nullable enum becomes a CEL rule: the API server checks
    ``enum`` against a null value even when the field is nullable (kube-openapi's enum
    validator), and a CEL rule is not evaluated on null. (``kubectl apply --server-side``
    refuses a null on a non-nullable field, so leaving the field non-nullable is no way out.) A
    single allowed value is an ``enum`` of one (OpenAPI v3.0 has no ``const``).
    """

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        inner = self.generate_inner(schema["schema"])
        if inner == {"type": "null"}:
            return inner  # None alone: no structural form, the translation says so
        enum = self._enum_behind(inner)
        values = None if enum is None else enum["enum"]
        if values is None or not all(
            isinstance(v, str) and re.fullmatch(r"[\w.:/-]+", v) for v in values
        ):
            # Not an enum, or one no CEL rule can list: a nullable enum left as it is is
            # refused by the structural check, naming the field.
            return {**inner, "nullable": True}
        # Comparisons, not `self in [...]`: the API server estimates a rule's cost times how
        # often it can run (per script entry, unbounded), and a list literal costs too much.
        # The length bound (longer is invalid anyway) keeps each comparison cheap.
        same = " || ".join(f"self == '{value}'" for value in values)
        kept = {k: v for k, v in (enum or {}).items() if k not in ("enum", "title", "description")}
        return {
            **kept,
            "nullable": True,
            "maxLength": max(len(value) for value in values),
            "x-kubernetes-validations": [cel_rule(same, f"must be one of {', '.join(values)}")],
        }

    def _enum_behind(self, node: JsonSchemaValue) -> JsonSchemaValue | None:
        """The enum ``node`` is, itself or through its $ref; None if it is none."""
        ref = node.get("$ref")
        if ref is not None:
            defs_ref = self.json_to_defs_refs.get(ref)
            node = self.definitions.get(defs_ref, {}) if defs_ref is not None else {}
        return node if "enum" in node else None

    def sort(self, value: JsonSchemaValue, parent_key: str | None = None) -> JsonSchemaValue:
        # Keys keep the order they were written in: nodes are ordered by KEY_ORDER afterwards,
        # and a CEL rule reads rule first, then its message.
        return value

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        return _enum_not_const(super().literal_schema(schema))

    def enum_schema(self, schema: core_schema.EnumSchema) -> JsonSchemaValue:
        return _enum_not_const(super().enum_schema(schema))


def _enum_not_const(node: JsonSchemaValue) -> JsonSchemaValue:
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}
    return node


def _description(text: str) -> str:
    # Docstrings wrap at the source's line length; `kubectl explain` re-wraps anyway.
    return " ".join(text.split())


def _resolve(ref: str, defs: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    name = ref.removeprefix("#/$defs/")
    if name == ref or name not in defs:
        raise CrdError(f"{where}: cannot resolve {ref}")
    target = defs[name]
    if not isinstance(target, Mapping):
        raise CrdError(f"{where}: {ref} is not a schema")
    return target


def _convert(
    node: Mapping[str, Any], defs: Mapping[str, Any], where: str, seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One pydantic schema node as a structural node; ``where`` names it in errors."""
    node = dict(node)
    if "$ref" in node:
        ref = node.pop("$ref")
        if ref in seen:
            raise CrdError(f"{where}: {ref} is recursive; a structural schema cannot be")
        # The field's own keys (its description, its default) win over the referenced model's.
        return _convert({**_resolve(ref, defs, where), **node}, defs, where, (*seen, ref))
    if "anyOf" in node:
        options = node.pop("anyOf")
        if options == INT_OR_STRING and node.get("x-kubernetes-int-or-string") is True:
            converted = _convert(node, defs, where, seen)
            converted["anyOf"] = [dict(option) for option in INT_OR_STRING]
            return converted
        raise CrdError(f"{where}: a union of {options} has no structural form")

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue  # titles are pydantic's class names; $defs were inlined
        if key == "description":
            out[key] = _description(value)
        elif key == "type":
            if value not in TYPES:
                raise CrdError(f"{where}: type {value!r} has no structural form")
            out[key] = value
        elif key == "format":
            if value not in KNOWN_FORMATS:
                raise CrdError(f"{where}: the API server does not know format {value!r}")
            out[key] = value
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # Draft 2020-12 gives the bound; OpenAPI v3.0 (and Kubernetes) a flag on the bound.
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if bound in node:
                raise CrdError(f"{where}: both {bound} and {key}")
            out[bound] = value
            out[key] = True
        elif key == "maximum" and node.get("type") == "integer" and value == INT64_MAX:
            # The API server cannot hold int64's largest value as a bound (it reads bounds as
            # float64 and refuses the CRD); format int64 says the same, and it refuses a larger
            # number while decoding.
            out["format"] = "int64"
        elif key == "default":
            if value is not None:  # null is what absent means already
                out[key] = value
        elif key == "properties":
            out[key] = {
                name: _convert(sub, defs, f"{where}.{name}", seen) for name, sub in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, f"{where}[]", seen)
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out[key] = _convert(value, defs, f"{where}.*", seen)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # False: the model refuses unknown fields. The API server prunes them, and refuses
            # them under kubectl's (default) strict field validation; a structural schema
            # cannot say `false` next to properties.
        elif key in _KEPT:
            out[key] = value
        else:
            raise CrdError(f"{where}: the JSON-schema keyword {key!r} has no structural form")

    free = node.get("additionalProperties") is not False
    if out.get("type") == "object" and "additionalProperties" not in out and free:
        # A model that ignores unknown fields (a status, which kopf also writes) or a
        # free-form object: keep what the models keep.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("required") == []:
        del out["required"]
    return out


def _at(schema: dict[str, Any], path: Sequence[str], kind: str) -> dict[str, Any]:
    node = schema
    for part in path:
        node = node["items"] if part == "[]" else node.get("properties", {}).get(part)
        if not isinstance(node, dict):
            raise CrdError(f"{kind}: no field at {'.'.join(path)} for a schema rule")
    return node


def _ordered(node: Mapping[str, Any]) -> dict[str, Any]:
    """Schema nodes with their keys in KEY_ORDER (properties keep the model's order)."""
    out: dict[str, Any] = {}
    for key in KEY_ORDER:
        if key not in node:
            continue
        value = node[key]
        if key == "properties":
            value = {name: _ordered(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            value = _ordered(value)
        out[key] = value
    if set(out) != set(node):
        raise CrdError(f"keys without a place in KEY_ORDER: {sorted(set(node) - set(out))}")
    return out


def openapi_schema(kind: Kind) -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of one kind, from its model."""
    raw = kind.model.model_json_schema(by_alias=True, schema_generator=CrdJsonSchema)
    schema = _convert(raw, raw.get("$defs", {}), kind.kind)
    schema["description"] = kind.description
    props = schema["properties"]
    for name in ("apiVersion", "kind"):
        props[name].pop("enum", None)  # the API server sets and checks them itself
    # The server owns metadata's schema: a CRD may not constrain more than name/generateName.
    props["metadata"] = {"type": "object"}
    schema["required"] = [
        name for name in schema["required"] if name not in ("apiVersion", "kind", "metadata")
    ]
    _no_defaults_in_lists(schema)
    for path, extra in kind.extras.items():
        node = _at(schema, path, kind.kind)
        for key, value in extra.items():
            node[key] = [*node.get(key, []), *value] if key == "x-kubernetes-validations" else value
    schema = _ordered(schema)
    problems = structural_problems(schema)
    if problems:
        raise CrdError(f"{kind.kind}: the generated schema is not structural: {problems[0]}")
    return schema


def _no_defaults_in_lists(node: dict[str, Any], *, in_list: bool = False) -> None:
    """Drop ``default`` from everything inside a list's items.

    ``kubectl apply`` patches custom resources with a JSON merge patch, which replaces a list
    whole: had the API server filled defaults into list items, every re-apply of an unchanged
    manifest would see the live list differ and report "configured" (GitOps tools would see
    drift). The models fill those defaults when the operator reads the object, so nothing is
    lost; defaults outside lists stay (a merge patch leaves a map's extra keys alone).
    """
    if in_list:
        node.pop("default", None)
    for child in (node.get("properties") or {}).values():
        _no_defaults_in_lists(child, in_list=in_list)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        _no_defaults_in_lists(extra, in_list=in_list)
    items = node.get("items")
    if isinstance(items, dict):
        _no_defaults_in_lists(items, in_list=True)


def crd(kind: Kind) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": {"app.kubernetes.io/part-of": "keelgate"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [column.to_dict() for column in kind.columns],
                    "schema": {"openAPIV3Schema": openapi_schema(kind)},
                }
            ],
        },
    }
