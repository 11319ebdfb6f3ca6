"""Workload controllers on the real controller-manager and scheduler: Deployments, Jobs and
ownerReference garbage collection, with pods run by the node agent.

They must never depend on objects outside their own namespace.
"""

from __future__ import annotations

from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.testing import condition, wait_for


def _template(labels: dict[str, str], command: list[str], restart: str) -> JSON:
    return {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "busybox", "command": command}],
        },
    }


def _pods(admin: Kube, namespace: str, selector: str) -> list[JSON]:
    listed = admin.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def test_deployment_available_and_pod_replaced(admin: Kube, namespace: str) -> None:
    """A Deployment is scheduled onto the node and becomes Available; deleting its pod makes
    the ReplicaSet create a replacement (new uid) that runs, and the Deployment is Available."""
    apps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    admin.create(
        apps,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": _template({"app": "web"}, ["sleep", "3600"], "Always"),
            },
        },
    )

    def available() -> JSON | None:
        dep = admin.get(f"{apps}/web")
        cond = condition(dep, "Available")
        ready = dep.get("status", {}).get("readyReplicas") == 1
        return dep if cond and cond["status"] == "True" and ready else None

    wait_for(available, timeout=60, what="Deployment web Available")
    [first] = _pods(admin, namespace, "app=web")
    assert first["spec"]["nodeName"] == "keelgate-node"  # bound by the real scheduler
    admin.delete(f"/api/v1/namespaces/{namespace}/pods/{first['metadata']['name']}")

    def replaced() -> JSON | None:
        pods = _pods(admin, namespace, "app=web")
        fresh = [p for p in pods if p["metadata"]["uid"] != first["metadata"]["uid"]]
        running = [p for p in fresh if p.get("status", {}).get("phase") == "Running"]
        return running[0] if running else None

    wait_for(replaced, timeout=60, what="a replacement pod Running")
    wait_for(available, timeout=60, what="Deployment web Available again")


def test_job_completes_and_children_are_garbage_collected(admin: Kube, namespace: str) -> None:
    """A Job's pod runs to completion and the Job is Complete; deleting the Job with background
    propagation makes the garbage collector delete its pods (ownerReferences), and a
    ConfigMap owned by another ConfigMap goes with its owner."""
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    admin.create(
        jobs,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "once"},
            "spec": {
                "backoffLimit": 0,
                "template": _template({"job": "once"}, ["sh", "-c", "echo done"], "Never"),
            },
        },
    )

    def complete() -> JSON | None:
        job = admin.get(f"{jobs}/once")
        cond = condition(job, "Complete")
        return job if cond and cond["status"] == "True" else None

    job = wait_for(complete, timeout=60, what="Job once Complete")
    assert job["status"]["succeeded"] == 1
    [child] = _pods(admin, namespace, "job=once")
    assert child["status"]["phase"] == "Succeeded"
    assert child["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]

    admin.delete(f"{jobs}/once", {"propagationPolicy": "Background"})
    wait_for(
        lambda: (
            not admin.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "job=once"})[
                "items"
            ]
        ),
        timeout=60,
        what="the Job's pods to be garbage collected",
    )

    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    owner = admin.create(
        cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    )
    admin.create(
        cms,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
        },
    )
    admin.delete(f"{cms}/owner")
    wait_for(
        lambda: not admin.exists(f"{cms}/dependent"),
        timeout=60,
        what="the dependent ConfigMap to be garbage collected",
    )
