"""Pods on the node agent: status as a kubelet reports it, logs, restarts, kills, deletion.

These run against the real API server; the node agent (kubelet stand-in) runs each container's
command as a host process. They must never kill a process they did not start through a pod
of their own namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.node import kill_container
from keelgate_e2e.testing import (
    Kubectl,
    container_status,
    get_pod,
    pod,
    pod_phase,
    wait_for,
)

PODS = "/api/v1/namespaces/{ns}/pods"


def create(admin: Kube, namespace: str, manifest: JSON) -> None:
    """Create a pod in `namespace`."""
    admin.create(PODS.format(ns=namespace), manifest)


def running_pod(admin: Kube, namespace: str, name: str) -> Callable[[], JSON | None]:
    """A probe for `wait_for`: the pod once it is Running."""
    return lambda: pod_phase(admin, namespace, name, "Running")


def finished_pod(admin: Kube, namespace: str, name: str) -> Callable[[], JSON | None]:
    """A probe for `wait_for`: the pod once it has Succeeded or Failed."""
    return lambda: pod_phase(admin, namespace, name, "Succeeded", "Failed")


def removed(admin: Kube, path: str) -> Callable[[], bool]:
    """A probe for `wait_for`: True once the object at `path` is gone."""
    return lambda: not admin.exists(path)


def test_pod_exit_code_and_logs(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """A pod whose command exits 3 ends Failed with exitCode 3 and reason Error, and
    `kubectl logs` (API server -> agent's TLS log endpoint) shows its stdout and stderr."""
    script = "echo to-stdout; echo to-stderr >&2; exit 3"
    create(admin, namespace, pod("exit3", ["sh", "-c", script]))
    done = wait_for(
        lambda: pod_phase(admin, namespace, "exit3", "Succeeded", "Failed"),
        timeout=60,
        what="exit3 to finish",
    )
    assert done["status"]["phase"] == "Failed"
    status = container_status(done)
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert terminated["startedAt"] and terminated["finishedAt"]
    assert status["ready"] is False and status["restartCount"] == 0
    logs = kubectl("logs", "exit3").stdout
    assert logs.splitlines() == ["to-stdout", "to-stderr"]


def test_pod_succeeds_with_reason_completed(admin: Kube, namespace: str) -> None:
    """A pod whose command exits 0 ends Succeeded with reason Completed, having been
    reported Running with a ready container and the Ready condition while it ran."""
    create(admin, namespace, pod("ok", ["sh", "-c", "sleep 2; exit 0"]))
    running = wait_for(
        lambda: pod_phase(admin, namespace, "ok", "Running"), timeout=30, what="ok to run"
    )
    assert container_status(running)["ready"] is True
    assert "running" in container_status(running)["state"]
    conds = {c["type"]: c["status"] for c in running["status"]["conditions"]}
    assert conds["Ready"] == "True" and conds["ContainersReady"] == "True"
    assert running["status"]["podIP"] == "127.0.0.1"
    done = wait_for(
        lambda: pod_phase(admin, namespace, "ok", "Succeeded", "Failed"),
        timeout=30,
        what="ok to finish",
    )
    assert done["status"]["phase"] == "Succeeded"
    assert container_status(done)["state"]["terminated"]["reason"] == "Completed"


def test_sigkilled_process_ends_failed_137(admin: Kube, namespace: str, cluster: Cluster) -> None:
    """SIGKILL of a pod's process (a node fault) ends it Failed with exit code 137, reason
    Error; with the OOM stand-in the reason is OOMKilled."""
    cases = (("killed", False, "Error"), ("oomed", True, "OOMKilled"))
    for name, _, _ in cases:
        create(admin, namespace, pod(name, ["sleep", "3600"]))
    for name, oom, reason in cases:
        running = wait_for(running_pod(admin, namespace, name), timeout=30)
        kill_container(cluster.node_state_dir, running["metadata"]["uid"], "main", oom=oom)
        done = wait_for(finished_pod(admin, namespace, name), timeout=30, what=f"{name} to end")
        assert done["status"]["phase"] == "Failed"
        terminated = container_status(done)["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (137, reason)


def test_restart_policy_on_failure_and_always(
    admin: Kube, namespace: str, kubectl: Kubectl
) -> None:
    """OnFailure restarts a failed container until it succeeds (then Succeeded); Always
    restarts even after exit 0, keeps the pod Running and keeps the previous run's log."""
    flaky = "if [ -f ran ]; then echo second; exit 0; else touch ran; echo first; exit 1; fi"
    create(admin, namespace, pod("flaky", ["sh", "-c", flaky], restart_policy="OnFailure"))
    create(
        admin, namespace, pod("looper", ["sh", "-c", "echo run; sleep 1"], restart_policy="Always")
    )
    done = wait_for(
        lambda: pod_phase(admin, namespace, "flaky", "Succeeded", "Failed"),
        timeout=60,
        what="flaky to finish",
    )
    status = container_status(done)
    assert done["status"]["phase"] == "Succeeded"
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert kubectl("logs", "flaky").stdout == "second\n"
    assert kubectl("logs", "flaky", "--previous").stdout == "first\n"

    def restarted() -> JSON | None:
        obj = get_pod(admin, namespace, "looper")
        statuses = obj.get("status", {}).get("containerStatuses") or []
        return obj if statuses and statuses[0]["restartCount"] >= 1 else None

    looper = wait_for(restarted, timeout=60, what="looper to restart")
    assert looper["status"]["phase"] == "Running"
    last = container_status(looper)["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (0, "Completed")


def test_start_error_for_missing_program(admin: Kube, namespace: str) -> None:
    """A command that is not on the host ends the container with exit code 128, StartError."""
    create(admin, namespace, pod("nope", ["/no/such/program"]))
    done = wait_for(lambda: pod_phase(admin, namespace, "nope", "Failed", "Succeeded"), timeout=30)
    terminated = container_status(done)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert done["status"]["phase"] == "Failed"


def test_init_containers_run_first(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """Init containers run to completion, in order, before the pod's containers start."""
    manifest = pod("init", ["sh", "-c", "date +%s.%N; echo main"])
    manifest["spec"]["initContainers"] = [
        {"name": "first", "image": "busybox", "command": ["sh", "-c", "sleep 1; date +%s.%N"]},
        {"name": "second", "image": "busybox", "command": ["sh", "-c", "date +%s.%N"]},
    ]
    create(admin, namespace, manifest)
    done = wait_for(lambda: pod_phase(admin, namespace, "init", "Succeeded", "Failed"), timeout=60)
    assert done["status"]["phase"] == "Succeeded"
    inits = done["status"]["initContainerStatuses"]
    assert [s["state"]["terminated"]["reason"] for s in inits] == ["Completed", "Completed"]
    stamps = [
        float(kubectl("logs", "init", "-c", c).stdout.split()[0])
        for c in ("first", "second", "main")
    ]
    assert stamps == sorted(stamps)


def test_graceful_delete_waits_grace_then_kills(admin: Kube, namespace: str) -> None:
    """Deleting a pod sends SIGTERM: a process that exits on it is removed at once; one that
    ignores it is SIGKILLed after the grace period, and only then is the pod removed."""
    create(admin, namespace, pod("polite", ["sleep", "3600"]))
    stubborn = "trap 'echo ignoring TERM' TERM; while true; do sleep 0.1; done"
    create(admin, namespace, pod("stubborn", ["sh", "-c", stubborn]))
    for name in ("polite", "stubborn"):
        wait_for(running_pod(admin, namespace, name), timeout=30)
    timings = {}
    for name in ("polite", "stubborn"):
        began = time.monotonic()
        path = f"{PODS.format(ns=namespace)}/{name}"
        admin.delete(path, {"gracePeriodSeconds": 3})
        wait_for(removed(admin, path), timeout=30, what=f"{name} to be removed")
        timings[name] = time.monotonic() - began
    assert timings["polite"] < 2.5, timings
    assert 3.0 <= timings["stubborn"] < 10.0, timings


def test_environment_from_secrets_configmaps_and_downward_api(
    admin: Kube, namespace: str, kubectl: Kubectl
) -> None:
    """env, envFrom, valueFrom (Secret, ConfigMap, fieldRef, resourceFieldRef), $(VAR)
    expansion and workingDir reach the process; a missing Secret holds the container in
    CreateContainerConfigError until the Secret exists."""
    ns = namespace
    admin.create(
        f"/api/v1/namespaces/{ns}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg"},
            "data": {"COLOR": "blue", "SIZE": "xl"},
        },
    )
    manifest = pod(
        "envy",
        ["sh", "-c", "env | sort; echo CWD=$(pwd)"],
        extra={
            "workingDir": "/tmp",
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
            "env": [
                {"name": "PLAIN", "value": "p"},
                {"name": "EXPANDED", "value": "$(PLAIN)-$(CFG_COLOR)-$$(KEEP)"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "ONE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "SIZE"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {
                    "name": "MEM",
                    "valueFrom": {
                        "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}
                    },
                },
            ],
            "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}},
        },
    )
    manifest["metadata"]["labels"] = {"app": "envtest"}
    create(admin, ns, manifest)

    def config_error() -> bool:
        statuses = get_pod(admin, ns, "envy").get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting.get("reason") == "CreateContainerConfigError"

    wait_for(config_error, timeout=30, what="CreateContainerConfigError for the missing secret")
    admin.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "stringData": {"token": "s3cret"},
        },
    )
    done = wait_for(lambda: pod_phase(admin, ns, "envy", "Succeeded", "Failed"), timeout=30)
    assert done["status"]["phase"] == "Succeeded"
    lines = set(kubectl("logs", "envy").stdout.splitlines())
    expected = {
        "PLAIN=p",
        "EXPANDED=p-blue-$(KEEP)",
        "TOKEN=s3cret",
        "ONE=xl",
        "CFG_COLOR=blue",
        "CFG_SIZE=xl",
        "POD_NAME=envy",
        f"POD_NS={ns}",
        "APP=envtest",
        "NODE=keelgate-node",
        "MEM=64",
        "HOSTNAME=envy",
        "CWD=/tmp",
    }
    assert expected <= lines, expected - lines


def test_a_pod_past_its_active_deadline_fails_as_deadline_exceeded(
    admin: Kube, namespace: str
) -> None:
    """spec.activeDeadlineSeconds: 3 on a pod whose command sleeps a minute: as the kubelet
    does it, the pod fails as a whole (phase Failed, reason DeadlineExceeded) a few seconds
    after it started, its container stopped (SIGTERM first) and not restarted."""
    manifest = pod("late", ["sh", "-c", "sleep 60"])
    manifest["spec"]["activeDeadlineSeconds"] = 3
    manifest["spec"]["terminationGracePeriodSeconds"] = 2
    create(admin, namespace, manifest)
    started = time.monotonic()
    done = wait_for(finished_pod(admin, namespace, "late"), timeout=30, what="late to fail")
    assert time.monotonic() - started < 20
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["reason"] == "DeadlineExceeded"
    assert "deadline" in done["status"]["message"]
    terminated = container_status(done)["state"]["terminated"]
    assert terminated["exitCode"] in (137, 143)
    assert container_status(done)["restartCount"] == 0
