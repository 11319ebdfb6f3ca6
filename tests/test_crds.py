"""The generated CRDs (``crds/``): in sync with the models, structural, and faithful to them.

What a user would notice if these broke: ``kubectl apply -f crds/`` refused (a non-structural
schema), a manifest that ``keelgate run`` accepts refused or pruned by the API server, a model
change that never reached the cluster's schema, or a server default that changes what a run
means. The API server itself is exercised in ``e2e/tests/test_crds_e2e.py``; here the committed
schemas are checked with a JSON-schema validator (draft 4, whose ``exclusiveMinimum`` flag is
OpenAPI v3.0's) after turning ``nullable`` into a ``null`` type, as the server reads it.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, Field, create_model
from pydantic_core import PydanticUndefined as Undefined

from keelgate.kube import crds
from keelgate.kube.crds import KINDS, CrdError, Kind, draft4, drift, structural_problems
from keelgate.manifest import AgentRun, AgentRunSpec, Approval, Reconciliation, parse, read_yaml
from keelgate.manifest.load import _inner_model
from test_manifest import CASES, DELETE, full, set_at

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
DATA = Path(__file__).parent / "data"
BY_NAME = {kind.kind.lower(): kind for kind in KINDS}
MODELS: dict[str, type[BaseModel]] = {
    "agentrun": AgentRun,
    "reconciliation": Reconciliation,
    "approval": Approval,
}
# Every manifest in the repository that the models accept: the API server must accept them too.
VALID = sorted(
    [
        *DATA.glob("contract-*.yaml"),
        *DATA.glob("full-*.yaml"),
        *DATA.glob("runner-*.yaml"),
        *ROOT.glob("examples/*/agentrun.yaml"),
    ]
)


def committed(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``crds/<plural>.keelgate.dev.yaml`` as committed."""
    doc = yaml.safe_load((CRDS / BY_NAME[kind].file_name).read_text())
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def load(path: Path) -> dict[str, Any]:
    data = read_yaml(path.read_text(), source=str(path))
    assert isinstance(data, dict)
    return data


def schema_errors(kind: str, obj: Any) -> list[jsonschema.ValidationError]:
    """What the API server's schema validation (with kubectl's strict field validation) says."""
    validator = jsonschema.Draft4Validator(draft4(committed(kind), strict=True))
    return sorted(validator.iter_errors(obj), key=lambda error: list(error.absolute_path))


def error_path(error: jsonschema.ValidationError) -> str:
    """The field an error is about, spelled as Keelgate spells it (``spec.tools[1].name``):
    a missing or unknown field is named itself, not its parent."""
    parts: list[str | int] = list(error.absolute_path)
    if error.validator == "required":
        found = re.match(r"'([^']+)' is a required property", error.message)
        assert found, error.message
        parts.append(found.group(1))
    elif error.validator == "additionalProperties":
        found = re.search(r"\('([^']+)' was unexpected\)", error.message)
        assert found, error.message
        parts.append(found.group(1))
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def kind_of(data: dict[str, Any]) -> str:
    return str(data["kind"]).lower()


# --- in sync with the models ------------------------------------------------------------------


def test_the_committed_crds_are_the_ones_the_models_generate() -> None:
    """``crds/`` holds exactly what the models generate today: a model changed without
    regenerating fails here (and in CI)."""
    assert sorted(path.name for path in CRDS.glob("*.yaml")) == sorted(k.file_name for k in KINDS)
    assert drift(CRDS) == []


class _ChangedSpec(AgentRunSpec):
    priority: int = Field(default=0, description="A field added to the model.")


class _ChangedRun(AgentRun):
    spec: _ChangedSpec = Field(description="What to run.")


CHANGED = tuple(
    dataclasses.replace(kind, model=_ChangedRun) if kind.kind == "AgentRun" else kind
    for kind in KINDS
)


def test_a_model_change_without_regenerating_is_reported_as_drift() -> None:
    """Adding a field to the AgentRun model makes the committed AgentRun CRD out of date, and
    only that one; the changed schema carries the new field."""
    problems = drift(CRDS, CHANGED)
    assert len(problems) == 1
    assert re.fullmatch(r"agentruns\.keelgate\.dev\.yaml differs \(\+\d+ -\d+ lines\)", problems[0])
    spec = crds.openapi_schema(CHANGED[0])["properties"]["spec"]["properties"]
    assert spec["priority"] == {
        "description": "A field added to the model.",
        "type": "integer",
        "default": 0,
    }


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keelgate.kube.crds", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_check_exits_1_with_one_line_naming_each_stale_file_and_write_repairs_it(
    tmp_path: Path,
) -> None:
    """``--check`` on a directory with an edited, a missing and a stray CRD file exits 1 with
    one line naming them and the command to run; ``--write`` fixes it (removing a generated
    file no model makes, never a hand-written one), then ``--check`` exits 0."""
    target = tmp_path / "crds"
    written = run_cli("--write", str(target))
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in target.iterdir()) == sorted(k.file_name for k in KINDS)
    assert run_cli("--check", str(target)).returncode == 0

    edited = target / crds.AGENTRUN.file_name
    edited.write_text(edited.read_text().replace("minLength: 1", "minLength: 2", 1))
    (target / crds.APPROVAL.file_name).unlink()
    stray = target / "widgets.keelgate.dev.yaml"  # as if a kind had been removed from KINDS
    stray.write_text(crds.HEADER + "kind: CustomResourceDefinition\n")
    handwritten = target / "extra.keelgate.dev.yaml"
    handwritten.write_text("# written by hand\nkind: CustomResourceDefinition\n")
    checked = run_cli("--check", str(target))
    assert checked.returncode == 1
    assert checked.stdout == ""
    lines = checked.stderr.splitlines()
    assert len(lines) == 1, checked.stderr
    assert "agentruns.keelgate.dev.yaml differs (+1 -1 lines)" in lines[0]
    assert "approvals.keelgate.dev.yaml is missing" in lines[0]
    assert "widgets.keelgate.dev.yaml is not generated by any model" in lines[0]
    assert crds.REGENERATE in lines[0]

    assert run_cli("--write", str(target)).returncode == 0
    assert not stray.exists()
    assert handwritten.exists()  # never removed: it is not a generated file
    handwritten.unlink()
    assert run_cli("--check", str(target)).returncode == 0
    assert not list(target.glob(".*.partial"))


def test_without_flags_it_prints_every_crd_for_kubectl() -> None:
    """``python -m keelgate.kube.crds | kubectl apply -f -`` gets the three CRDs, as written
    to ``crds/``."""
    printed = run_cli()
    assert printed.returncode == 0, printed.stderr
    docs = list(yaml.safe_load_all(printed.stdout))
    assert docs == [crds.crd(kind) for kind in KINDS]
    assert docs == [yaml.safe_load((CRDS / kind.file_name).read_text()) for kind in KINDS]


def test_a_bad_flag_is_one_usage_error_with_exit_2() -> None:
    """Two actions at once is refused by the argument parser (exit 2), writing nothing."""
    result = run_cli("--write", "x", "--check", "y")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr
    assert not (ROOT / "x").exists()


# --- structural ---------------------------------------------------------------------------------


def walk(node: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{where}.{name}" if where else name)
    if "items" in node:
        yield from walk(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{where}.*")


@pytest.mark.parametrize("kind", sorted(BY_NAME))
def test_every_committed_schema_is_structural(kind: str) -> None:
    """Each committed schema keeps every structural rule the checker knows (one type per node,
    no $ref/anyOf/title, properties and additionalProperties apart, valid defaults ...)."""
    schema = committed(kind)
    assert structural_problems(schema) == []
    nodes = list(walk(schema))
    assert len(nodes) > (100 if kind == "agentrun" else 15)


def _set(path: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(schema: dict[str, Any]) -> None:
        node = schema
        for part in path.split("."):
            node = node["items"] if part == "[]" else node["properties"][part]
        if value is DELETE:
            del node[key]
        else:
            node[key] = value

    return change


BROKEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("ref", _set("spec.goal", "$ref", "#/$defs/X"), "spec.goal: $ref is not supported"),
    ("no type", _set("spec.goal", "type", DELETE), "spec.goal: type must not be empty"),
    ("null type", _set("spec.goal", "type", "null"), "spec.goal: type 'null' is not one of"),
    ("title", _set("spec.goal", "title", "Goal"), "spec.goal: title is not kept"),
    ("const", _set("spec.goal", "const", "x"), "spec.goal: const is not OpenAPI v3.0"),
    (
        "anyOf",
        _set("spec.budget.tokens", "anyOf", [{"type": "integer"}, {"type": "string"}]),
        "spec.budget.tokens: anyOf is only allowed as int-or-string",
    ),
    (
        "closed object",
        _set("spec.budget", "additionalProperties", False),
        "spec.budget: properties and additionalProperties are mutually exclusive",
    ),
    (
        "map and fields",
        _set("spec.budget", "additionalProperties", {"type": "string"}),
        "spec.budget: properties and additionalProperties are mutually exclusive",
    ),
    ("nullable enum", _set("spec.loop", "nullable", True), "spec.loop: a nullable enum"),
    (
        "2020 bound",
        _set("spec.budget.tokens", "exclusiveMinimum", 0),
        "spec.budget.tokens: exclusiveMinimum must be a flag",
    ),
    ("no items", _set("spec.tools", "items", DELETE), "spec.tools: an array needs items"),
    (
        "bad default",
        _set("spec.loop", "default", "forever"),
        "spec.loop: the default does not validate",
    ),
    (
        "undescribed",
        _set("spec.goal", "description", DELETE),
        "spec.goal: a field needs a description",
    ),
    (
        "required ghost",
        _set("spec", "required", ["goal", "gaol"]),
        "spec: required field 'gaol' is not a property",
    ),
    (
        "preserve false",
        _set("spec.tools.[].inputSchema", "x-kubernetes-preserve-unknown-fields", False),
        "must be true or absent",
    ),
    (
        "metadata",
        lambda s: s["properties"].__setitem__(
            "metadata", {"type": "object", "properties": {"name": {"type": "string"}}}
        ),
        "metadata: must be {type: object}",
    ),
    ("bad pattern", _set("spec.goal", "pattern", "(["), "spec.goal: pattern does not compile"),
    ("unknown keyword", _set("spec.goal", "format_", "x"), "unknown keywords ['format_']"),
]


@pytest.mark.parametrize(("name", "change", "problem"), BROKEN, ids=[case[0] for case in BROKEN])
def test_the_structural_checker_catches_each_broken_rule(
    name: str, change: Callable[[dict[str, Any]], None], problem: str
) -> None:
    """Each rule the checker enforces is reported when one node of a real schema breaks it, so
    a clean result above means something."""
    schema = copy.deepcopy(committed("agentrun"))
    change(schema)
    problems = structural_problems(schema)
    assert any(problem in found for found in problems), problems


def _tiny_kind(spec_type: Any) -> Kind:
    spec = create_model("TinySpec", x=(spec_type, Field(description="x")))
    model = create_model(
        "Tiny",
        apiVersion=(str, Field(description="v")),
        kind=(str, Field(description="k")),
        metadata=(dict[str, Any], Field(description="m")),
        spec=(spec, Field(description="s")),
        status=(dict[str, Any] | None, Field(default=None, description="st")),
    )
    return Kind(model, "Tiny", "tinies", (), "tiny", ())


class _Node(BaseModel):
    children: list[_Node] = Field(default_factory=list, description="more")


@pytest.mark.parametrize(
    ("spec_type", "words"),
    [
        (int | str, "has no structural form"),
        (set[str], "'uniqueItems' has no structural form"),
        (_Node, "is recursive"),
        (tuple[int, str], "has no structural form"),
    ],
    ids=["union", "set", "recursive", "tuple"],
)
def test_the_generator_refuses_a_model_it_cannot_translate(spec_type: Any, words: str) -> None:
    """A construct without a structural form stops generation with a CrdError naming the field,
    instead of a schema looser than the model."""
    with pytest.raises(CrdError) as caught:
        crds.openapi_schema(_tiny_kind(spec_type))
    assert words in str(caught.value)
    assert str(caught.value).startswith("Tiny.spec.x")


# --- faithful to the models ---------------------------------------------------------------------


@pytest.mark.parametrize("path", VALID, ids=[p.relative_to(ROOT).as_posix() for p in VALID])
def test_every_manifest_the_models_accept_the_schema_accepts(path: Path) -> None:
    """Every manifest in the repository (the contract's examples, the full ones, the runner
    and example manifests) passes both the models and the CRD schema: the API server refuses
    nothing that ``keelgate run`` accepts, and prunes nothing (unknown fields would fail)."""
    data = load(path)
    parse(MODELS[kind_of(data)], data)
    assert [error_path(e) + ": " + e.message for e in schema_errors(kind_of(data), data)] == []


def test_the_contract_agentrun_validates_against_the_crd_schema() -> None:
    """The user contract's AgentRun example (tests/data/contract-agentrun.yaml) is valid under the
    AgentRun CRD's schema, and a broken side effect there is refused at its path."""
    data = load(DATA / "contract-agentrun.yaml")
    assert schema_errors("agentrun", data) == []
    data["spec"]["tools"][1]["sideEffect"] = "WRTE"
    errors = schema_errors("agentrun", data)
    assert [error_path(e) for e in errors] == ["spec.tools[1].sideEffect"]
    assert "'WRTE' is not one of ['READ', 'PROPOSE', 'WRITE']" in errors[0].message


# The API server checks apiVersion, kind and metadata itself; a CRD may not constrain them.
SERVER_OWNED = ("apiVersion", "kind", "metadata")
SCHEMA_CASES = [case[:4] for case in CASES if not case[1].startswith(SERVER_OWNED)]


@pytest.mark.parametrize(
    ("kind", "path", "value", "field"),
    SCHEMA_CASES,
    ids=[f"{c[0]}:{c[1]}={c[2]!r}" for c in SCHEMA_CASES],
)
def test_where_the_schema_refuses_a_bad_value_it_names_the_field_keelgate_names(
    kind: str, path: str, value: Any, field: str
) -> None:
    """For each bad value of tests/test_manifest.py: if the CRD schema refuses it too, it
    names the same field as Keelgate does; the schema never refuses the valid original."""
    data = full(kind)
    assert schema_errors(kind, data) == []
    set_at(data, path, value)
    errors = schema_errors(kind, data)
    if errors:
        assert {error_path(e) for e in errors} == {field}


def test_a_good_share_of_the_models_bad_values_are_refused_by_the_schema() -> None:
    """Most single-field mistakes are caught server-side, not only by Keelgate (the rest are
    cross-field rules and server-owned metadata, listed in docs/crds.md)."""
    caught = 0
    for kind, path, value, _ in SCHEMA_CASES:
        data = full(kind)
        set_at(data, path, value)
        caught += bool(schema_errors(kind, data))
    assert caught >= 0.8 * len(SCHEMA_CASES), f"{caught} of {len(SCHEMA_CASES)}"


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: in every object present, a missing
    field with a default gets it (then its own fields are defaulted)."""
    if isinstance(obj, dict):
        out = dict(obj)
        for name, sub in schema.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(out[name], sub)
        if isinstance(schema.get("additionalProperties"), dict):
            for key in set(out) - set(schema.get("properties", {})):
                out[key] = apply_defaults(out[key], schema["additionalProperties"])
        return out
    if isinstance(obj, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


@pytest.mark.parametrize("path", VALID, ids=[p.relative_to(ROOT).as_posix() for p in VALID])
def test_server_defaults_never_change_what_a_manifest_means(path: Path) -> None:
    """The API server fills the schema's defaults into what a user applied; the models read
    the defaulted object exactly as they read the original (the defaults are the models')."""
    data = load(path)
    kind = kind_of(data)
    defaulted = apply_defaults(data, committed(kind))
    assert defaulted != data or kind != "agentrun"
    assert parse(MODELS[kind], defaulted) == parse(MODELS[kind], data)
    assert schema_errors(kind, defaulted) == []


def _nullable_with_default(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """Fields that take null and whose default is not null: there null and absent differ."""
    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        if type(None) in get_args(info.annotation) and info.default not in (None, Undefined):
            yield path
        inner = _inner_model(info.annotation)
        if inner is not None:
            yield from _nullable_with_default(inner, path)


def test_null_means_absent_everywhere_but_one_documented_field() -> None:
    """``kubectl apply`` (client-side) drops a null before the server sees it, so a null can
    only mean the same as leaving the field out. The one field where null means something
    else (``maxVerifierRejections: null``: no limit; absent: 3) is listed in docs/crds.md; a
    new one must be documented too."""
    found = sorted(set(_nullable_with_default(AgentRun, "")))
    assert found == [".spec.budget.maxVerifierRejections"]
    assert "maxVerifierRejections: null" in (ROOT / "docs" / "crds.md").read_text()


def test_a_null_optional_field_is_accepted_where_the_models_accept_it() -> None:
    """Optional fields set to null (as ``kubectl get -o yaml`` may show them) pass the schema,
    enums included; a wrong verdict is still refused (server-side by a CEL rule)."""
    data = full("agentrun")
    data["spec"]["pricing"] = None
    data["spec"]["model"]["apiKeySecretRef"] = None
    data["spec"]["model"]["script"][0]["verdict"] = None
    data["spec"]["tools"][0]["inputSchema"] = None
    data["status"]["answer"] = None
    parse(AgentRun, data)
    assert schema_errors("agentrun", data) == []
    verdict = committed("agentrun")["properties"]["spec"]["properties"]["model"]["properties"][
        "script"
    ]["items"]["properties"]["verdict"]
    assert verdict["nullable"] is True
    assert verdict["x-kubernetes-validations"] == [
        {"rule": "self == 'accept' || self == 'reject'", "message": "must be one of accept, reject"}
    ]


# --- columns, rules and floors ------------------------------------------------------------------


def _resolve_path(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in json_path.strip(".").split("."):
        node = (node or {}).get("properties", {}).get(part)
    return node


@pytest.mark.parametrize("kind", KINDS, ids=[k.kind for k in KINDS])
def test_every_printer_column_shows_a_field_of_the_schema(kind: Kind) -> None:
    """``kubectl get`` columns point at fields that exist with the column's type, so a renamed
    field cannot leave a column silently empty."""
    doc = yaml.safe_load((CRDS / kind.file_name).read_text())
    version = doc["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            continue
        node = _resolve_path(schema, column["jsonPath"])
        assert node is not None, column
        assert node["type"] == column["type"], column
    names = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    expected = {
        "AgentRun": ["Phase", "Reason", "Iteration", "Age"],
        "Reconciliation": ["Run", "Action", "Tool", "Phase", "Verdict", "Age"],
        "Approval": ["Run", "Action", "Tool", "Phase", "Approvals", "Verdict", "Age"],
    }
    assert names == expected[kind.kind]
    assert doc["spec"]["names"]["categories"] == ["keelgate"]
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", sorted(BY_NAME))
def test_every_cel_rule_names_fields_of_the_node_it_sits_on(kind: str) -> None:
    """Each CEL rule's ``self.x`` / ``oldSelf.x`` is a field of its node (so a renamed model
    field cannot leave a rule that the API server would refuse or that never matches)."""
    rules = 0
    for where, node in walk(committed(kind)):
        for rule in node.get("x-kubernetes-validations", []):
            rules += 1
            for name in re.findall(r"(?:self|oldSelf)\.([A-Za-z_]\w*)", rule["rule"]):
                if name not in ("all", "filter", "size", "trim"):
                    assert name in node.get("properties", {}), (where, rule)
            if "fieldPath" in rule:
                named = node
                for part in rule["fieldPath"].lstrip(".").split("."):
                    assert part in named.get("properties", {}), (where, rule)
                    named = named["properties"][part]
    assert rules >= (3 if kind == "agentrun" else 4)


@pytest.mark.parametrize("kind", ["reconciliation", "approval"])
def test_a_decision_is_final_by_schema_rule(kind: str) -> None:
    """Reconciliation and Approval specs carry the transition rules that freeze a decision and
    its ``by``, and the rule that a decision names who made it; a Reconciliation's decision is
    frozen by a rule on the object (it sees the status: false may become true before it is
    settled, nothing else)."""
    decision = "executed" if kind == "reconciliation" else "approved"
    schema = committed(kind)
    rules = {r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]}
    assert f"!has(self.{decision}) || (has(self.by) && self.by.trim() != '')" in rules
    assert any("self.by == oldSelf.by" in rule for rule in rules)
    if kind == "approval":
        assert any(f"self.{decision} == oldSelf.{decision}" in rule for rule in rules)
    else:
        (frozen,) = schema["x-kubernetes-validations"]
        assert "self.spec.executed == oldSelf.spec.executed" in frozen["rule"]
        assert "oldSelf.status.phase == 'Settled'" in frozen["rule"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_kube_floor_is_imported_by_nothing_below_it() -> None:
    """manifest/ and core/ never import keelgate.kube (imports point down), and the CRD
    generator imports no Kubernetes client."""
    package = ROOT / "operator" / "keelgate"
    below = [*package.glob("core/*.py"), *package.glob("manifest/*.py")]
    assert len(below) > 10
    for path in below:
        assert not any(m.startswith("keelgate.kube") for m in _imports(path)), path
    generator = set().union(*(_imports(path) for path in package.glob("kube/crds/*.py")))
    assert len(generator) > 10
    assert not any(m.split(".")[0] in ("kubernetes", "kopf", "httpx") for m in generator)


def test_the_reconciliation_example_from_the_contract_is_undecided_and_valid() -> None:
    """The contract's Reconciliation (``executed: null``) passes the schema, and setting
    ``executed`` to something other than a boolean does not."""
    data = load(DATA / "contract-reconciliation.yaml")
    assert schema_errors("reconciliation", data) == []
    data["spec"]["executed"] = "yes"
    assert [error_path(e) for e in schema_errors("reconciliation", data)] == ["spec.executed"]
