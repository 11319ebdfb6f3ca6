"""Keelgate's CRDs on the real API server: ``kubectl apply -f crds/``, then what the server
accepts, keeps, refuses and prints.

Why: the schemas are generated from the manifest models, and only the real kube-apiserver can
say whether it takes them as structural, keeps every field the models accept (no pruning), and
enforces what they promise (enums and patterns, the CEL rules that make a settled decision
final, the printer columns). Every refusal checked here is also checked to be one the models
make, naming the same field.

These tests must never touch another test's namespace; the CRDs they install are cluster-wide
and stay for the rest of the session (installing them again is a no-op).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from keelgate.errors import InputError
from keelgate.kube.crds import GROUP, KINDS, VERSION
from keelgate.manifest import AgentRun, Approval, Reconciliation, parse, read_yaml
from pydantic import BaseModel

from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON, ApiError, Kube
from keelgate_e2e.testing import Kubectl, condition

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
DATA = ROOT / "tests" / "data"
MODELS: dict[str, type[BaseModel]] = {
    "AgentRun": AgentRun,
    "Reconciliation": Reconciliation,
    "Approval": Approval,
}
PLURALS = {kind.kind: kind.plural for kind in KINDS}
SKEW = "version difference between client"  # the machine's kubectl is older than the server


def manifest(name: str) -> JSON:
    """A manifest from tests/data, read as kubectl reads YAML."""
    data = read_yaml((DATA / name).read_text(), source=name)
    assert isinstance(data, dict)
    return data


def collection(namespace: str, kind: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURALS[kind]}"


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and SKEW not in line]


def is_subset(given: Any, stored: Any) -> bool:
    """Every field given is stored with the same value (the server may add defaults)."""
    if isinstance(given, dict):
        return isinstance(stored, dict) and all(
            key in stored and is_subset(value, stored[key]) for key, value in given.items()
        )
    if isinstance(given, list):
        return (
            isinstance(stored, list)
            and len(given) == len(stored)
            and all(is_subset(a, b) for a, b in zip(given, stored, strict=True))
        )
    return bool(given == stored and type(given) is type(stored))


@pytest.fixture(scope="module")
def installed(cluster: Cluster, kubectl_bin: Path) -> Iterator[Any]:
    """``kubectl apply -f crds/`` as admin, waited until every CRD is Established."""
    admin = Kubectl(kubectl_bin, cluster.kubeconfig, "admin")
    applied = admin("apply", "-f", str(CRDS))
    names = [f"crd/{kind.crd_name}" for kind in KINDS]
    admin("wait", "--for=condition=Established", "--timeout=60s", *names)
    yield applied


def test_the_crds_apply_cleanly_and_become_established(installed: Any, admin: Kube) -> None:
    """All three CRDs are accepted without a warning (the server found them structural, its
    CEL rules within cost), Established, and their names, short names and category accepted."""
    assert warnings(installed.stderr) == []
    for kind in KINDS:
        assert f"customresourcedefinition.apiextensions.k8s.io/{kind.crd_name}" in installed.stdout
        crd = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{kind.crd_name}")
        for ctype in ("Established", "NamesAccepted"):
            found = condition(crd, ctype)
            assert found is not None and found["status"] == "True", (ctype, found)
        accepted = crd["status"]["acceptedNames"]
        assert accepted["kind"] == kind.kind
        assert accepted["shortNames"] == list(kind.short_names)
        assert accepted["categories"] == ["keelgate"]


def test_the_contract_agentrun_is_applied_and_read_back_intact(
    installed: Any, kubectl: Kubectl, admin: Kube, namespace: str
) -> None:
    """The contract's AgentRun goes through ``kubectl apply`` and comes back with every field
    it set, unpruned; the models read it back as the same run. Its status, written through the
    status subresource as the operator will, is kept too, with a field kopf adds."""
    run = manifest("contract-agentrun.yaml")
    run["metadata"]["namespace"] = namespace
    status = run.pop("status")
    applied = kubectl("apply", "-f", "-", stdin=json.dumps(run))
    assert "agentrun.keelgate.dev/restock created" in applied.stdout
    assert warnings(applied.stderr) == []

    stored = admin.get(f"{collection(namespace, 'AgentRun')}/restock")
    assert is_subset(run["spec"], stored["spec"]), json.dumps(stored["spec"])
    assert parse(AgentRun, stored).spec == parse(AgentRun, run).spec

    kopf_status = {**status, "kopf": {"progress": {"restock": {"retries": 1}}}}
    kubectl(
        "patch",
        "agentrun",
        "restock",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": kopf_status}),
    )
    stored = admin.get(f"{collection(namespace, 'AgentRun')}/restock")
    assert is_subset(kopf_status, stored["status"]), json.dumps(stored["status"])
    back = parse(AgentRun, stored)
    assert back.status is not None and back.status.iteration == 2

    refused = kubectl(
        "patch",
        "agentrun",
        "restock",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Done"}}',
        check=False,
    )
    assert refused.returncode != 0
    assert 'status.phase: Unsupported value: "Done"' in refused.stderr


def test_a_full_manifest_with_nulls_survives_server_side_apply(
    installed: Any, kubectl: Kubectl, admin: Kube, namespace: str
) -> None:
    """Every field of an AgentRun (nulls for optional fields included, as ``kubectl get -o
    yaml`` can show them) goes through ``kubectl apply --server-side`` and reads back as the
    same run."""
    run = manifest("full-agentrun.yaml")
    run["metadata"] = {
        "name": "full",
        "labels": {"team": "stores"},
        # Its notify tool's approval rule says notCreator: the run names its creator.
        "annotations": {"keelgate.dev/created-by": "admin"},
    }
    run.pop("status")
    run["spec"]["model"]["script"][0]["verdict"] = None
    run["spec"]["tools"][0]["inputSchema"]["properties"]["qty"] = {"type": "integer", "minimum": 1}
    run["spec"]["budget"]["maxVerifierRejections"] = None
    applied = kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(run))
    assert "serverside-applied" in applied.stdout
    stored = admin.get(f"{collection(namespace, 'AgentRun')}/full")
    assert is_subset(run["spec"], stored["spec"]), json.dumps(stored["spec"])
    assert parse(AgentRun, stored).spec == parse(AgentRun, run).spec
    assert parse(AgentRun, stored).spec.budget.max_verifier_rejections is None


REPO_MANIFESTS = sorted(
    [
        *DATA.glob("contract-*.yaml"),
        *DATA.glob("full-*.yaml"),
        *DATA.glob("runner-*.yaml"),
        *ROOT.glob("examples/*/agentrun.yaml"),
    ]
)
SERVER_OWNED_META = ("uid", "resourceVersion", "generation", "creationTimestamp", "selfLink")


@pytest.mark.parametrize(
    "path", REPO_MANIFESTS, ids=[p.relative_to(ROOT).as_posix() for p in REPO_MANIFESTS]
)
def test_every_manifest_in_the_repository_is_accepted_and_kept(
    installed: Any, admin: Kube, namespace: str, path: Path
) -> None:
    """Each manifest the models accept is created (strict field validation, dry run) with no
    field dropped or warned about, and the models read the server's copy as the original."""
    data = read_yaml(path.read_text(), source=path.name)
    assert isinstance(data, dict)
    model = MODELS[data["kind"]]
    parse(model, data)
    meta = {k: v for k, v in data["metadata"].items() if k not in SERVER_OWNED_META}
    meta.pop("deletionTimestamp", None)
    meta.pop("deletionGracePeriodSeconds", None)
    meta.pop("ownerReferences", None)
    meta.pop("managedFields", None)
    body = {**data, "metadata": {**meta, "namespace": namespace}}
    stored = admin.request(
        "POST",
        collection(namespace, data["kind"]),
        body=body,
        params={"dryRun": "All", "fieldValidation": "Strict"},
    )
    assert is_subset(data["spec"], stored["spec"]), json.dumps(stored["spec"])
    assert parse(model, stored).model_dump()["spec"] == parse(model, data).model_dump()["spec"]


def _broken(change: str) -> JSON:
    run = manifest("contract-agentrun.yaml")
    run.pop("status")
    del run["metadata"]["namespace"]  # kubectl's namespace: the test's
    spec = run["spec"]
    if change == "sideEffect":
        spec["tools"][1]["sideEffect"] = "WRTE"
    elif change == "duplicate tool":
        spec["tools"][2]["name"] = "get_inventory"
    elif change == "two kinds":
        spec["tools"][1]["python"] = {"callable": "mytools.orders:place"}
    elif change == "no kind":
        del spec["tools"][0]["http"]
    elif change == "verification writes":
        spec["loop"] = "verification"
        spec["allowedSideEffects"] = ["READ", "WRITE"]
    elif change == "listed twice":
        spec["allowedSideEffects"] = ["READ", "READ"]
    elif change == "verdict":
        spec["model"]["script"][0]["verdict"] = "maybe"
    elif change == "typo":
        spec["tools"][1]["sideEfect"] = spec["tools"][1].pop("sideEffect")
    elif change == "tokens":
        spec["budget"]["tokens"] = 0
    elif change == "money as a number":
        spec["budget"]["dollars"] = 2.5
    return run


# (the mistake, the field Keelgate names, what the server says: its path, then its words)
REFUSED = [
    (
        "sideEffect",
        "spec.tools[1].sideEffect",
        ('spec.tools[1].sideEffect: Unsupported value: "WRTE"',),
    ),
    ("duplicate tool", "spec.tools[2].name", ("spec.tools[2]: Duplicate value",)),
    (
        "two kinds",
        "spec.tools[1]",
        ("spec.tools[1]: Invalid value", "exactly one of http, python, mcp"),
    ),
    (
        "no kind",
        "spec.tools[0]",
        ("spec.tools[0]: Invalid value", "exactly one of http, python, mcp"),
    ),
    (
        "verification writes",
        "spec.allowedSideEffects[1]",
        ("spec.allowedSideEffects: Invalid value", "a verification loop may only READ"),
    ),
    (
        "listed twice",
        "spec.allowedSideEffects[1]",
        ("spec.allowedSideEffects[1]: Duplicate value",),
    ),
    (
        "verdict",
        "spec.model.script[0].verdict",
        ("spec.model.script[0].verdict: Invalid value", "must be one of accept, reject"),
    ),
    ("typo", "spec.tools[1].sideEfect", ('unknown field "spec.tools[1].sideEfect"',)),
    ("tokens", "spec.budget.tokens", ("spec.budget.tokens: Invalid value: 0",)),
    ("money as a number", "spec.budget.dollars", ("spec.budget.dollars: Invalid value", "string")),
]


@pytest.mark.parametrize(("change", "field", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_broken_agentrun_is_refused_by_the_api_server_naming_the_field(
    installed: Any,
    kubectl: Kubectl,
    namespace: str,
    change: str,
    field: str,
    words: tuple[str, ...],
) -> None:
    """``kubectl apply`` of a broken AgentRun fails with the server's message naming the field
    (enum, duplicate tool, tool kind, read-only verification, unknown field ...), nothing is
    created, and Keelgate's own validation refuses the same manifest at the same field."""
    run = _broken(change)
    with pytest.raises(InputError) as caught:
        parse(AgentRun, run)
    assert caught.value.field == field, caught.value
    result = kubectl("apply", "-f", "-", stdin=json.dumps(run), check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr
    assert kubectl("get", "agentruns", "-o", "name").stdout.strip() == ""


def _settle_object(kind: str, namespace: str) -> JSON:
    if kind == "Reconciliation":
        obj = manifest("contract-reconciliation.yaml")
    else:
        obj = manifest("full-approval.yaml")
        obj["spec"].update({"approved": None, "by": "", "note": ""})
    obj["metadata"]["namespace"] = namespace
    obj.pop("status")
    return obj


@pytest.mark.parametrize("kind", ["Reconciliation", "Approval"])
def test_a_decision_is_set_once_and_then_cannot_change(
    installed: Any, kubectl: Kubectl, admin: Kube, namespace: str, kind: str
) -> None:
    """Setting the decision without ``by`` is refused; setting it with ``by`` works the first
    time; afterwards changing it, removing it, changing ``by``, or pointing the object at
    another action is refused by the CRD's CEL rules, while a note can still be added."""
    decision = "executed" if kind == "Reconciliation" else "approved"
    obj = _settle_object(kind, namespace)
    name = obj["metadata"]["name"]
    kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    resource = f"{kind.lower()}/{name}"

    def patch(spec: JSON) -> Any:
        body = json.dumps({"spec": spec})
        return kubectl("patch", resource, "--type=merge", "-p", body, check=False)

    nobody = patch({decision: True})
    assert nobody.returncode != 0
    assert "spec.by: Invalid value" in nobody.stderr
    assert f"must name who decided when {decision} is set" in nobody.stderr

    first = patch({decision: True, "by": "alice"})
    assert first.returncode == 0, first.stderr

    changes: list[tuple[JSON, str, str]] = [
        ({decision: False}, f"spec.{decision}", "cannot change once set"),
        ({decision: None}, f"spec.{decision}", "cannot change once set"),
        ({"by": "bob"}, "spec.by", f"cannot change once {decision} is set"),
        ({"by": None}, "spec.by", f"cannot change once {decision} is set"),
        ({"action": "9:9"}, "spec", "cannot change (the operator set them)"),
    ]
    for change, field, words in changes:
        refused = patch(change)
        assert refused.returncode != 0, change
        assert f"{field}: Invalid value" in refused.stderr and words in refused.stderr, (
            change,
            refused.stderr,
        )

    assert patch({"note": "checked with the supplier"}).returncode == 0
    stored = admin.get(f"{collection(namespace, kind)}/{name}")["spec"]
    assert (stored[decision], stored["by"], stored["note"]) == (
        True,
        "alice",
        "checked with the supplier",
    )
    parse(MODELS[kind], admin.get(f"{collection(namespace, kind)}/{name}"))


def test_a_decision_made_at_creation_is_final_too(
    installed: Any, kubectl: Kubectl, admin: Kube, namespace: str
) -> None:
    """A Reconciliation created already decided (``executed: true``, ``by``) cannot be
    flipped to false afterwards either: the transition rules compare with whatever was
    stored."""
    obj = _settle_object("Reconciliation", namespace)
    obj["spec"].update({"executed": True, "by": "alice"})
    kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    name = obj["metadata"]["name"]
    flipped = kubectl(
        "patch",
        f"reconciliation/{name}",
        "--type=merge",
        "-p",
        '{"spec": {"executed": false}}',
        check=False,
    )
    assert flipped.returncode != 0
    assert "spec.executed: Invalid value" in flipped.stderr
    assert "cannot change once set" in flipped.stderr
    stored = admin.get(f"{collection(namespace, 'Reconciliation')}/{name}")
    assert stored["spec"]["executed"] is True


def test_not_executed_may_become_executed_only_until_it_is_settled(
    installed: Any, kubectl: Kubectl, admin: Kube, namespace: str
) -> None:
    """The CRD's rule on the whole object (it reads the stored status): a "not executed" may
    be corrected to executed while the Reconciliation is not Settled (its maker looked too
    early and found that it ran), and its ``decidedAt`` written again; once the status (the
    operator's, written here by the admin through the status subresource) says Settled, the
    same correction is refused, naming spec.executed. Removing the decision, or taking an
    executed back to not executed, is refused at any time; ``by`` never changes; a
    ``decidedAt`` that is not an RFC 3339 moment is refused naming it."""
    path = collection(namespace, "Reconciliation")

    def made(name: str) -> str:
        obj = _settle_object("Reconciliation", namespace)
        obj["metadata"]["name"] = name
        obj["spec"].update({"executed": False, "by": "alice", "decidedAt": "2026-01-02T03:04:05Z"})
        kubectl("apply", "-f", "-", stdin=json.dumps(obj))
        return f"reconciliation/{name}"

    def patch(resource: str, spec: JSON) -> Any:
        body = json.dumps({"spec": spec})
        return kubectl("patch", resource, "--type=merge", "-p", body, check=False)

    def refused(done: Any, field: str, words: str) -> None:
        assert done.returncode != 0
        assert f"{field}: Invalid value" in done.stderr and words in done.stderr, done.stderr

    open_one = made("corrected")
    refused(patch(open_one, {"executed": None}), "spec.executed", "cannot change once set")
    refused(patch(open_one, {"decidedAt": "yesterday"}), "spec.decidedAt", "should match")
    again = patch(open_one, {"decidedAt": "2026-01-02T03:09:00Z"})
    assert again.returncode == 0, again.stderr
    corrected = patch(open_one, {"executed": True, "decidedAt": "2026-01-02T03:10:00Z"})
    assert corrected.returncode == 0, corrected.stderr
    refused(patch(open_one, {"executed": False}), "spec.executed", "cannot change once set")
    refused(patch(open_one, {"by": "bob"}), "spec.by", "cannot change once executed is set")
    stored = admin.get(f"{path}/corrected")["spec"]
    assert (stored["executed"], stored["by"], stored["decidedAt"]) == (
        True,
        "alice",
        "2026-01-02T03:10:00Z",
    )

    settled_one = made("settled")
    admin.patch(
        f"{path}/settled/status",
        {"status": {"phase": "Settled", "verdict": "abandoned", "settledBy": "alice"}},
    )
    late = patch(settled_one, {"executed": True})
    refused(late, "spec.executed", "but from false to true, before it is settled")
    refused(patch(settled_one, {"executed": None}), "spec.executed", "cannot change once set")
    kept = admin.get(f"{path}/settled")
    assert kept["spec"]["executed"] is False and kept["status"]["phase"] == "Settled"
    parse(Reconciliation, kept)


def _columns(output: str) -> tuple[list[str], list[list[str]]]:
    lines = [line.split() for line in output.strip().splitlines()]
    return lines[0], lines[1:]


def test_kubectl_get_shows_the_printer_columns(
    installed: Any, kubectl: Kubectl, namespace: str
) -> None:
    """``kubectl get agentruns`` shows Phase, Reason, Iteration and Age from the status;
    ``-o wide`` adds Loop and Message; the short name ``ar`` and the category ``keelgate``
    list the same object, and ``kubectl get reconciliations`` shows run, action, tool, phase
    and verdict."""
    run = manifest("contract-agentrun.yaml")
    run.pop("status")
    run["metadata"]["namespace"] = namespace
    kubectl("apply", "-f", "-", stdin=json.dumps(run))
    status = {
        "phase": "Stopped",
        "stopReason": "outcome_unknown",
        "message": "place_order may have run",
        "resumable": True,
        "iteration": 3,
    }
    kubectl(
        "patch",
        "agentrun/restock",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    header, rows = _columns(kubectl("get", "agentruns").stdout)
    assert header == ["NAME", "PHASE", "REASON", "ITERATION", "AGE"]
    assert [row[:4] for row in rows] == [["restock", "Stopped", "outcome_unknown", "3"]]

    wide = kubectl("get", "agentruns", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "REASON", "ITERATION", "LOOP", "MESSAGE", "AGE"]
    assert "task" in wide[1] and "place_order may have run" in wide[1]
    assert kubectl("get", "ar", "-o", "name").stdout.split() == ["agentrun.keelgate.dev/restock"]

    rec = _settle_object("Reconciliation", namespace)
    kubectl("apply", "-f", "-", stdin=json.dumps(rec))
    kubectl(
        "patch",
        "reconciliation/restock-3-place-order",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Settled", "verdict": "executed", "source": "human"}}',
    )
    header, rows = _columns(kubectl("get", "reconciliations").stdout)
    assert header == ["NAME", "RUN", "ACTION", "TOOL", "PHASE", "VERDICT", "AGE"]
    assert [row[:6] for row in rows] == [
        ["restock-3-place-order", "restock", "3:0", "place_order", "Settled", "executed"]
    ]
    listed = kubectl("get", "keelgate", "-o", "name").stdout.split()
    assert sorted(listed) == [
        "agentrun.keelgate.dev/restock",
        "reconciliation.keelgate.dev/restock-3-place-order",
    ]


def test_the_server_reads_null_as_absent_in_the_cel_rules(
    installed: Any, admin: Kube, namespace: str
) -> None:
    """An Approval created with ``approved: null`` is undecided for the rules: it can then be
    decided once (the rules rely on the server treating a null field as absent)."""
    obj = _settle_object("Approval", namespace)
    created = admin.create(collection(namespace, "Approval"), copy.deepcopy(obj))
    assert created["spec"].get("approved") is None
    path = f"{collection(namespace, 'Approval')}/{obj['metadata']['name']}"
    decided = admin.patch(path, {"spec": {"approved": False, "by": "alice"}})
    assert decided["spec"]["approved"] is False
    with pytest.raises(ApiError) as caught:
        admin.patch(path, {"spec": {"approved": True}})
    assert caught.value.status == 422
    assert "spec.approved: Invalid value" in str(caught.value)
    assert admin.get(path)["spec"]["approved"] is False
