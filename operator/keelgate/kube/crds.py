"""The CustomResourceDefinitions of AgentRun, Reconciliation and Approval, generated from the
manifest models, and ``python -m keelgate.kube.crds`` to write them to ``crds/`` or check them.

Why it exists: the manifest models are the single source of truth, so the API server must refuse
what ``keelgate run`` refuses, as far as an OpenAPI schema and CEL rules can say it, and must
keep (never prune) anything the models accept. A GitOps pipeline then fails at ``kubectl apply``
rather than at the operator's first step. The schemas are *structural*, by the API server's own
rules (apiextensions-apiserver's ``ValidateStructural`` and its CRD OpenAPI schema validation):
every node has one type, no ``$ref``, no ``anyOf`` except int-or-string,
``properties`` and ``additionalProperties`` never together, no ``title``.

It must never hand-write a field the models do not declare, never drop a JSON-schema keyword it
does not understand (that is an error, so a new model construct cannot silently loosen the
CRD), and never talk to a cluster.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import BaseModel

from keelgate.core.values import INT64_MAX
from keelgate.errors import KeelgateError
from keelgate.manifest import AgentRun, Approval, Reconciliation

GROUP = "keelgate.dev"
VERSION = "v1alpha1"
CATEGORY = "keelgate"
REGENERATE = "python -m keelgate.kube.crds --write crds/"
HEADER = (
    "# Generated from the manifest models (operator/keelgate/manifest/) by keelgate.kube.crds.\n"
    f"# Do not edit: change the models, then run `{REGENERATE}` (make crds).\n"
    "# tests/test_crds.py fails while this file differs from the models.\n"
)

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
_KEPT = frozenset(KEY_ORDER) - {"properties", "items", "additionalProperties", "anyOf"}
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


class CrdError(KeelgateError):
    """A model cannot be expressed as a structural CRD schema (a generator bug or a model
    construct to translate first): generation stops rather than emit a looser schema."""


@dataclass(frozen=True)
class Column:
    """One ``kubectl get`` column (additionalPrinterColumns)."""

    name: str
    json_path: str
    description: str
    type: str = "string"
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description,
        }
        if self.priority:
            out["priority"] = self.priority
        return out


AGE = Column("Age", ".metadata.creationTimestamp", "Time since the object was created.", "date")


@dataclass(frozen=True)
class Kind:
    """One custom resource: its model, its names and what the schema enforces beyond the model's
    JSON schema (list types, CEL rules), keyed by a path of property names (``[]``: items)."""

    model: type[BaseModel]
    kind: str
    plural: str
    short_names: tuple[str, ...]
    description: str
    columns: tuple[Column, ...]
    extras: Mapping[tuple[str, ...], Mapping[str, Any]] = field(default_factory=dict)

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{self.crd_name}.yaml"


def _rule(rule: str, message: str, *, field_path: str = "") -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _settle_rules(decision: str) -> list[dict[str, str]]:
    """Rules of a Reconciliation (``executed``) or Approval (``approved``) spec.

    A decision names who made it, and once made neither it nor its ``by`` can change: rules
    with ``oldSelf`` are transition rules, checked on update only. The API server reads a null
    field as absent, so ``has()`` is false for ``executed: null``, and removing the field is a
    change like any other.
    """
    return [
        _rule(
            f"!has(self.{decision}) || (has(self.by) && self.by.trim() != '')",
            f"must name who decided when {decision} is set",
            field_path=".by",
        ),
        _rule(
            f"!has(oldSelf.{decision}) || (has(self.{decision}) && "
            f"self.{decision} == oldSelf.{decision})",
            "cannot change once set",
            field_path=f".{decision}",
        ),
        _rule(
            f"!has(oldSelf.{decision}) || (has(self.by) && has(oldSelf.by) && "
            "self.by == oldSelf.by)",
            f"cannot change once {decision} is set",
            field_path=".by",
        ),
    ]


def _identity_rule(fields: Sequence[str]) -> dict[str, str]:
    # The operator created the object for one action of one run: pointing it at another action
    # (or key) would let a decision about one WRITE settle a different one.
    same = " && ".join(f"self.{name} == oldSelf.{name}" for name in fields)
    return _rule(same, f"{', '.join(fields)} cannot change (the operator set them)")


AGENTRUN = Kind(
    model=AgentRun,
    kind="AgentRun",
    plural="agentruns",
    short_names=("ar",),
    description="An agent loop that Keelgate runs durably and safely: a WRITE never runs twice "
    "and never runs unapproved. The namespace is the tenant.",
    columns=(
        Column("Phase", ".status.phase", "Pending, Running, Stopped, Succeeded or Failed."),
        Column("Reason", ".status.stopReason", "Why the run stopped."),
        Column("Iteration", ".status.iteration", "Planning iterations so far.", "integer"),
        Column("Loop", ".spec.loop", "task, verification or monitor.", priority=1),
        Column("Message", ".status.message", "The stop, in words.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                _rule(
                    "self.loop != 'verification' || !has(self.allowedSideEffects) || "
                    "self.allowedSideEffects.all(e, e == 'READ')",
                    "a verification loop may only READ",
                    field_path=".allowedSideEffects",
                )
            ]
        },
        # Tool names are unique (the models refuse a duplicate); as a map list the API server
        # refuses one too, and server-side apply merges tools by name.
        ("spec", "tools"): {
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
        ("spec", "tools", "[]"): {
            "x-kubernetes-validations": [
                _rule(
                    "[has(self.http), has(self.python), has(self.mcp)].filter(k, k).size() == 1",
                    "a tool needs exactly one of http, python, mcp",
                )
            ]
        },
        ("spec", "allowedSideEffects"): {"x-kubernetes-list-type": "set"},
    },
)

RECONCILIATION = Kind(
    model=Reconciliation,
    kind="Reconciliation",
    plural="reconciliations",
    short_names=("rec",),
    description="A WRITE whose outcome is unknown: a person sets spec.executed (true: it ran; "
    "false: abandon it) and spec.by. Created by the operator, owned by its AgentRun.",
    columns=(
        Column("Run", ".spec.runName", "The AgentRun (or tick) the action belongs to."),
        Column("Action", ".spec.action", "The action's id within the run."),
        Column("Tool", ".spec.tool", "The tool the action called."),
        Column("Phase", ".status.phase", "Pending or Settled."),
        Column("Verdict", ".status.verdict", "executed or abandoned, once settled."),
        Column("By", ".spec.by", "Who decided.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                *_settle_rules("executed"),
                _identity_rule(("runName", "action", "tool", "idempotencyKey")),
            ]
        },
    },
)

APPROVAL = Kind(
    model=Approval,
    kind="Approval",
    plural="approvals",
    short_names=("apr",),
    description="An action that waits for a person's yes: a person sets spec.approved (true: "
    "run it; false: deny it) and spec.by. Created by the operator, owned by its AgentRun.",
    columns=(
        Column("Run", ".spec.runName", "The AgentRun (or tick) waiting for approval."),
        Column("Action", ".spec.action", "The action's id within the run."),
        Column("Tool", ".spec.tool", "The tool the action would call."),
        Column("Phase", ".status.phase", "Pending or Settled."),
        Column("Verdict", ".status.verdict", "approved or denied, once settled."),
        Column("By", ".spec.by", "Who decided.", priority=1),
        AGE,
    ),
    extras={
        ("spec",): {
            "x-kubernetes-validations": [
                *_settle_rules("approved"),
                _identity_rule(("runName", "action", "tool")),
            ]
        },
    },
)

KINDS: tuple[Kind, ...] = (AGENTRUN, RECONCILIATION, APPROVAL)


# --- JSON schema (pydantic, draft 2020-12) to structural OpenAPI v3 -------------------------


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


def _is_null(option: Any) -> bool:
    return isinstance(option, Mapping) and dict(option) == {"type": "null"}


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
        others = [option for option in options if not _is_null(option)]
        if len(options) == 2 and len(others) == 1:
            return _nullable({**others[0], **node}, defs, where, seen)
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
        elif key == "const":
            out["enum"] = [value]
        elif key == "type":
            if value not in _TYPES:
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


def _nullable(
    node: Mapping[str, Any], defs: Mapping[str, Any], where: str, seen: tuple[str, ...]
) -> dict[str, Any]:
    """``X | None``: X, nullable. An enum becomes a CEL rule: the API server checks ``enum``
    against a null value even when the field is nullable (kube-openapi's enum validator), and
    a CEL rule is not evaluated on null. (``kubectl apply --server-side`` refuses a null on a
    non-nullable field, so leaving the field non-nullable is no way out.)"""
    out = _convert(node, defs, where, seen)
    out["nullable"] = True
    if "enum" in out:
        values = out.pop("enum")
        if not all(isinstance(v, str) and re.fullmatch(r"[\w.:/-]+", v) for v in values):
            raise CrdError(f"{where}: enum values {values} cannot be written as a CEL list")
        # Comparisons, not `self in [...]`: the API server estimates a rule's cost times how
        # often it can run (per script entry, unbounded), and a list literal costs too much.
        # The length bound (longer is invalid anyway) keeps each comparison cheap.
        out["maxLength"] = max(len(value) for value in values)
        same = " || ".join(f"self == '{value}'" for value in values)
        out["x-kubernetes-validations"] = [
            _rule(same, f"must be one of {', '.join(map(str, values))}")
        ]
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
    raw = kind.model.model_json_schema(by_alias=True)
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


def render(kind: Kind) -> str:
    """One CRD as the text of its file in ``crds/``."""
    body = yaml.safe_dump(
        crd(kind), sort_keys=False, width=100, allow_unicode=True, default_flow_style=False
    )
    return HEADER + "---\n" + body


def rendered(kinds: Sequence[Kind] = KINDS) -> dict[str, str]:
    """File name to text, for every CRD."""
    return {kind.file_name: render(kind) for kind in kinds}


# --- the structural rules, checked on every generated schema --------------------------------

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
    elif kind not in _TYPES:
        problems.append(f"{at}: type {kind!r} is not one of {sorted(_TYPES)} (null: nullable)")
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


# --- crds/ on disk ----------------------------------------------------------------------------


def write(directory: Path, kinds: Sequence[Kind] = KINDS) -> list[Path]:
    """Write every CRD into ``directory`` (created if missing) and remove generated files no
    model makes any more (a hand-written file is never touched); returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    expected = rendered(kinds)
    written = []
    for name, text in expected.items():
        path = directory / name
        # Whole files only: an interrupted write must not leave half a CRD to apply.
        partial = path.with_name(f".{name}.partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
        written.append(path)
    for path in _stale(directory, expected):
        if path.read_text(encoding="utf-8").startswith(HEADER.splitlines()[0]):
            path.unlink()
    return written


def _stale(directory: Path, expected: Mapping[str, str]) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in sorted(directory.glob(f"*.{GROUP}.yaml")) if p.name not in expected]


def drift(directory: Path, kinds: Sequence[Kind] = KINDS) -> list[str]:
    """How ``directory`` differs from the models: one phrase per file, empty when in sync."""
    expected = rendered(kinds)
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        have = path.read_text(encoding="utf-8")
        if have != text:
            lines = difflib.ndiff(have.splitlines(), text.splitlines())
            added = removed = 0
            for line in lines:
                added += line.startswith("+ ")
                removed += line.startswith("- ")
            problems.append(f"{name} differs (+{added} -{removed} lines)")
    for path in _stale(directory, expected):
        problems.append(f"{path.name} is not generated by any model")
    return problems


def _documents(kinds: Sequence[Kind]) -> Iterator[str]:
    for index, kind in enumerate(kinds):
        text = render(kind)
        yield text if index == 0 else text.removeprefix(HEADER)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keelgate.kube.crds [--write DIR | --check DIR]``; without either, prints
    every CRD to stdout (``... | kubectl apply -f -``). Exit 1 when ``--check`` finds drift."""
    parser = argparse.ArgumentParser(
        prog="python -m keelgate.kube.crds",
        description="Generate Keelgate's CRDs from the manifest models.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", metavar="DIR", type=Path, help="write one file per CRD")
    action.add_argument(
        "--check", metavar="DIR", type=Path, help="exit 1 if DIR differs from the models"
    )
    args = parser.parse_args(argv)
    try:
        if args.write is not None:
            for path in write(args.write):
                print(f"wrote {path}")
            return 0
        if args.check is not None:
            problems = drift(args.check)
            if problems:
                print(
                    f"{args.check}: out of date with the models: {'; '.join(problems)}; "
                    f"run `{REGENERATE}`",
                    file=sys.stderr,
                )
                return 1
            print(f"{args.check}: up to date with the models ({len(KINDS)} CRDs)")
            return 0
        sys.stdout.write("".join(_documents(KINDS)))
        return 0
    except CrdError as error:
        print(f"keelgate.kube.crds: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"keelgate.kube.crds: {error.filename or ''}: {error.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
