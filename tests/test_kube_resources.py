"""The bodies the operator creates (``keelgate.kube.resources``): step pods, Reconciliations,
Approvals and ticks, and the readers of what it made (owner, tick, pod state).

What a user would notice if these broke: a step pod refused in a namespace enforcing Pod
Security ``restricted``, a store password or model key copied into a pod spec, a tool's argument
in an object anyone with view rights reads, a pod that outlives its run, a name that changes
between two operators (two pods for one step).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from keelgate.core.types import PendingApproval, UnknownAction
from keelgate.kube import resources
from keelgate.kube.naming import action_object_name, earlier_object_name
from keelgate.kube.resources import StepPodSettings
from keelgate.manifest import spec_from_manifest
from keelgate.manifest.step_defaults import StepPodDefaults
from support.operator_rig import agentrun_spec

RUN: dict[str, Any] = {
    "apiVersion": "keelgate.dev/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "restock", "namespace": "shop", "uid": "u-1", "generation": 2},
    "spec": agentrun_spec(),
}
SECRET_ARG = "gate-code-4417"


def pod(**spec_fields: Any) -> dict[str, Any]:
    spec = spec_from_manifest({**agentrun_spec(), **spec_fields})
    return resources.step_pod(
        RUN,
        spec,
        name="restock-s3-a2",
        step=3,
        attempt=2,
        generation=2,
        failpoints="",
        settings=StepPodSettings(),
    )


def test_a_step_pod_is_hardened_for_pod_security_restricted() -> None:
    """Non-root 65532, read-only root with a small /tmp, no privilege escalation, no
    capabilities, RuntimeDefault seccomp, no service-account token, never restarted."""
    body = pod()
    spec = body["spec"]
    container = spec["containers"][0]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": resources.STEP_USER,
        "runAsGroup": resources.STEP_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_a_step_pod_names_its_run_and_takes_secrets_by_reference() -> None:
    """The command is ``keelgate step`` for this run; the store URL and the model key come from
    Secrets by reference, never as values; the pod is owned by the run, labelled with its run,
    step and attempt, and annotated with the generation it runs."""
    spec = agentrun_spec()
    spec["model"] = {
        "provider": "openai",
        "name": "gpt-x",
        "apiKeySecretRef": {"name": "openai", "key": "token"},
    }
    body = resources.step_pod(
        RUN,
        spec_from_manifest(spec),
        name="restock-s3-a2",
        step=3,
        attempt=2,
        generation=2,
        failpoints="after_plan@1",
        settings=StepPodSettings(
            image="reg.example/kg:1",
            confirmer_url="https://orders.example/{idempotencyKey}",
            extra_env={"B": "2", "A": "1"},
        ),
    )
    container = body["spec"]["containers"][0]
    assert container["image"] == "reg.example/kg:1"
    assert container["command"] == ["keelgate"]
    assert container["args"] == [
        "step",
        "--namespace",
        "shop",
        "--run",
        "restock",
        "--confirmer-url",
        "https://orders.example/{idempotencyKey}",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["KEELGATE_STORE"] == {
        "name": "KEELGATE_STORE",
        "valueFrom": {"secretKeyRef": {"name": "keelgate-store", "key": "url"}},
    }
    assert env["OPENAI_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "openai", "key": "token"}
    }
    assert env["KEELGATE_FAILPOINTS"]["value"] == "after_plan@1"
    assert [e["name"] for e in container["env"]][-2:] == ["A", "B"]
    meta = body["metadata"]
    assert meta["labels"]["keelgate.dev/run"] == "restock"
    assert (meta["labels"]["keelgate.dev/step"], meta["labels"]["keelgate.dev/attempt"]) == (
        "3",
        "2",
    )
    assert meta["annotations"] == {"keelgate.dev/generation": "2"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "AgentRun",
            "name": "restock",
            "uid": "u-1",
            "controller": True,
        }
    ]
    assert resources.owned_by(body, "u-1") and not resources.owned_by(body, "u-2")
    assert resources.controller_name(body) == "restock"
    assert resources.is_active_step_pod(body)


def test_a_step_pod_takes_scheduling_and_resources_from_spec_step() -> None:
    body = pod(
        step={
            "image": "reg.example/custom:2",
            "resources": {"limits": {"memory": "256Mi"}},
            "serviceAccountName": "steps",
            "nodeSelector": {"pool": "agents"},
            "tolerations": [{"key": "agents", "operator": "Exists"}],
        }
    )
    spec = body["spec"]
    assert spec["containers"][0]["image"] == "reg.example/custom:2"
    assert spec["containers"][0]["resources"] == {"limits": {"memory": "256Mi"}}
    assert spec["serviceAccountName"] == "steps"
    assert spec["nodeSelector"] == {"pool": "agents"}
    assert spec["tolerations"] == [{"key": "agents", "operator": "Exists"}]


def test_the_platforms_step_pod_settings_hold_and_a_run_adds_only_where_safe() -> None:
    """The operator's --step-pod-defaults (the chart's stepPods): its requests and limits, each
    overridden by name by the run's; its node labels always hold (a run adds, never changes);
    its tolerations and the run's; its priority class, runtime class and pull secrets, which a
    run cannot name."""
    defaults = StepPodDefaults.model_validate(
        {
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"memory": "1Gi"},
            },
            "priorityClassName": "agents-low",
            "runtimeClassName": "gvisor",
            "imagePullSecrets": ["registry-creds"],
            "nodeSelector": {"pool": "agents"},
            "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
        }
    )
    spec = spec_from_manifest(
        {
            **agentrun_spec(),
            "step": {
                "resources": {"requests": {"memory": "256Mi"}},
                "nodeSelector": {"pool": "mine", "zone": "a"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
            },
        }
    )
    body = resources.step_pod(
        RUN,
        spec,
        name="restock-s1-a1",
        step=1,
        attempt=1,
        generation=2,
        failpoints="",
        settings=StepPodSettings(defaults=defaults),
    )
    pod_spec = body["spec"]
    assert pod_spec["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod_spec["nodeSelector"] == {"pool": "agents", "zone": "a"}
    assert pod_spec["tolerations"] == [
        {"key": "agents", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists"},
    ]
    assert pod_spec["priorityClassName"] == "agents-low"
    assert pod_spec["runtimeClassName"] == "gvisor"
    assert pod_spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    plain = pod()["spec"]
    assert not {"priorityClassName", "runtimeClassName", "imagePullSecrets"} & set(plain)


def test_a_step_pods_deadline_comes_from_its_runs_time_budget_and_longest_call() -> None:
    """activeDeadlineSeconds: the run's budget.timeoutSeconds plus its longest call plus 60 s;
    none without a time budget, unless the platform sets maxActiveSeconds, which also caps it."""
    assert "activeDeadlineSeconds" not in pod()["spec"]
    budgeted = spec_from_manifest(
        {**agentrun_spec(), "budget": {"maxIterations": 5, "timeoutSeconds": 600}}
    )
    longest = budgeted.longest_call_seconds()
    assert longest > 0
    expected = int(600 + longest) + 60
    assert resources.step_deadline_seconds(budgeted) == expected
    assert resources.step_deadline_seconds(budgeted, ceiling=300) == 300
    assert resources.step_deadline_seconds(budgeted, ceiling=100_000) == expected
    unbudgeted = spec_from_manifest(agentrun_spec())
    assert resources.step_deadline_seconds(unbudgeted) == 0
    assert resources.step_deadline_seconds(unbudgeted, ceiling=900) == 900
    built = pod(budget={"maxIterations": 5, "timeoutSeconds": 600})
    assert built["spec"]["activeDeadlineSeconds"] == expected


def test_the_same_inputs_build_the_same_pod() -> None:
    """Pure: a restarted operator builds the pod it intended before it died."""
    assert pod() == pod()


def test_reconciliations_and_approvals_carry_no_arguments() -> None:
    """What a person edits names the run, the action, the tool and the key of the call; no
    tool argument, since everyone with view rights reads it. An Approval starts with an empty
    list of decisions, for people to append to."""
    unknown = UnknownAction("3:1", "Place_Order", "kg-abc")
    settle = resources.reconciliation(RUN, unknown)
    assert settle["metadata"]["name"] == action_object_name("restock", "3:1", "Place_Order")
    assert settle["metadata"]["name"].startswith("restock-3-1-place-order-")
    assert settle["spec"] == {
        "runName": "restock",
        "action": "3:1",
        "tool": "Place_Order",
        "idempotencyKey": "kg-abc",
    }
    approve = resources.approval(RUN, PendingApproval("2:0", "refund"), "kg-def")
    assert (
        approve["metadata"]["name"]
        == "restock-2-refund-" + hashlib.sha256(b"restock\0" + b"2:0\0refund").hexdigest()[:10]
    )
    assert approve["spec"] == {
        "runName": "restock",
        "action": "2:0",
        "tool": "refund",
        "idempotencyKey": "kg-def",
        "decisions": [],
    }
    for body in (settle, approve):
        assert body["metadata"]["labels"]["keelgate.dev/run"] == "restock"
        assert resources.owned_by(body, "u-1")
        assert SECRET_ARG not in json.dumps(body)
        assert "status" not in body  # a subresource: shown Pending after the create
    assert not resources.is_settled(settle)
    assert resources.is_settled({**settle, "status": {"phase": "Settled"}})


def test_a_tick_is_a_run_of_its_own_owned_by_its_monitor() -> None:
    monitor = {**RUN, "metadata": {**RUN["metadata"], "name": "watch"}}
    tick = resources.tick(monitor, "watch.tick-4")
    assert tick["metadata"]["name"] == "watch.tick-4"
    assert tick["metadata"]["labels"]["keelgate.dev/monitor"] == "watch"
    assert tick["spec"] == monitor["spec"] and tick["spec"] is not monitor["spec"]
    assert resources.is_tick(tick) and not resources.is_tick(monitor)
    assert resources.controller_name(tick) == "watch"


def test_pod_states_as_the_step_slots_count_them() -> None:
    """Pending and Running hold a step slot; Succeeded and Failed do not; a pod that is not a
    step pod never does."""
    body = pod()
    for phase, active in (
        ("Pending", True),
        ("Running", True),
        ("Succeeded", False),
        ("Failed", False),
    ):
        shown = {**body, "status": {"phase": phase}}
        assert resources.is_active_step_pod(shown) is active
        assert resources.pod_finished(shown) is not active
    other = {**body, "metadata": {**body["metadata"], "labels": {}}}
    assert not resources.is_active_step_pod(other)


def test_the_charts_step_pod_values_are_the_operators_settings() -> None:
    """charts/keelgate's stepPods (rendered into the file --step-pod-defaults reads) parse as
    the operator's StepPodDefaults and are its defaults, and the values schema lists exactly
    its fields: a field added to one and not the other fails here, not in a cluster."""
    import yaml

    chart = Path(__file__).resolve().parents[1] / "charts" / "keelgate"
    values = yaml.safe_load((chart / "values.yaml").read_text())["stepPods"]
    assert StepPodDefaults.model_validate(values) == StepPodDefaults()
    schema = json.loads((chart / "values.schema.json").read_text())["properties"]["stepPods"]
    fields = {info.alias or name for name, info in StepPodDefaults.model_fields.items()}
    assert set(schema["properties"]) == fields == set(values)


def test_only_a_step_pods_changes_that_matter_to_its_run_look_at_the_run_again() -> None:
    """A pod's end, its deletion (begun or done) and its first sighting queue its run; a pod
    pending or running that was only scheduled or started does not (nothing the run acts on
    changed), which saves two of a step's reconciles."""
    from keelgate.kube.resources import pod_change_matters

    running: dict[str, Any] = {"metadata": {"name": "r-s1-a1"}, "status": {"phase": "Running"}}
    assert not pod_change_matters("MODIFIED", running)
    assert not pod_change_matters("MODIFIED", {**running, "status": {"phase": "Pending"}})
    assert pod_change_matters("ADDED", running)
    assert pod_change_matters("DELETED", running)
    assert pod_change_matters("MODIFIED", {**running, "status": {"phase": "Succeeded"}})
    assert pod_change_matters("MODIFIED", {**running, "status": {"phase": "Failed"}})
    leaving = {"metadata": {"name": "r-s1-a1", "deletionTimestamp": "2026-12-05T10:00:00Z"}}
    assert pod_change_matters("MODIFIED", {**running, **leaving})


def test_action_object_names_never_collide_and_always_fit() -> None:
    """Two actions whose readable names are the same (run ``pay`` action 1:1 of tool ``x``, run
    ``pay-1`` action 1:0 of ``x``, run ``pay`` action 1:0 of tool ``1-x``; ``place_order`` and
    ``place-order``) get different Reconciliations and Approvals (the name an earlier release
    gave each was the same), each name the same every time it is computed, a valid object
    name however long the run's name is."""
    same = [("pay", "1:1", "x"), ("pay-1", "1:0", "x"), ("pay", "1:0", "1-x")]
    assert {earlier_object_name(*triple) for triple in same} == {"pay-1-1-x"}
    names = {action_object_name(*triple) for triple in same}
    assert len(names) == 3 and all(n.startswith("pay-1-1-x-") for n in names)
    unknowns = {
        resources.reconciliation(
            {"metadata": {"name": run, "namespace": "shop", "uid": "u"}},
            UnknownAction(action, tool, "kg-1"),
        )["metadata"]["name"]
        for run, action, tool in same
    }
    assert unknowns == names
    assert action_object_name("r", "1:0", "place_order") != action_object_name(
        "r", "1:0", "place-order"
    )
    assert action_object_name("pay", "1:1", "x") == action_object_name("pay", "1:1", "x")
    long = action_object_name("r" * 253, "12:3", "t" * 100)
    assert len(long) <= 253 and long != action_object_name("r" * 252, "12:3", "t" * 100)
