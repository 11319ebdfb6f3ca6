"""AgentRuns in e2e tests: manifests against the loopback shop, waits, and truthful settlements.

Why it exists: the operator's tests apply runs the way users do and check what the shop really
received. A person settling an unknown outcome asks the system of record first; `settle_truly`
does exactly that (the shop's count for the key) and patches the Reconciliation as `alice`.
It must never settle anything against the shop's record, and never wait without a deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import yaml
from keelgate.kube.times import parse_time

from keelgate_e2e.kube import JSON, ApiError, Kube
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

GROUP = "/apis/keelgate.dev/v1alpha1"


def runs_path(namespace: str, name: str = "") -> str:
    base = f"{GROUP}/namespaces/{namespace}/agentruns"
    return f"{base}/{name}" if name else base


def order(sku: str, qty: int) -> JSON:
    return {"tool": "place_order", "args": {"sku": sku, "qty": qty}}


def look(sku: str) -> JSON:
    return {"tool": "get_inventory", "args": {"sku": sku}}


def tools(shop: ShopServer, *, approval: bool = False, timeout: float = 10) -> list[JSON]:
    return [
        {
            "name": "get_inventory",
            "sideEffect": "READ",
            "http": {"url": f"{shop.url}/items/{{sku}}", "method": "GET"},
        },
        {
            "name": "place_order",
            "sideEffect": "WRITE",
            "requiresApproval": approval,
            "timeoutSeconds": timeout,
            "http": {"url": f"{shop.url}/orders", "method": "POST"},
        },
    ]


def agentrun(
    name: str,
    shop: ShopServer,
    plans: Sequence[Sequence[JSON]],
    *,
    namespace: str | None = None,
    annotations: dict[str, str] | None = None,
    budget: JSON | None = None,
    approval: bool = False,
    extra: JSON | None = None,
) -> JSON:
    """A run whose scripted model plans `plans` (one list of actions per iteration), then is
    done."""
    script: list[JSON] = [{"actions": list(actions)} for actions in plans]
    script.append({"done": True, "answer": "done"})
    meta: JSON = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: JSON = {
        "goal": f"e2e {name}",
        "model": {"provider": "scripted", "name": "demo", "script": script},
        "tools": tools(shop, approval=approval),
        "budget": budget or {"maxIterations": 10},
    }
    spec.update(extra or {})
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": meta,
        "spec": spec,
    }


def apply(kubectl: Kubectl, *docs: JSON) -> str:
    """`kubectl apply -f -` of the documents, as a user does; returns its output."""
    return kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs)).stdout


def get_run(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(runs_path(namespace, name))


def phase(kube: Kube, namespace: str, name: str) -> str:
    try:
        return str(get_run(kube, namespace, name).get("status", {}).get("phase", ""))
    except ApiError as error:
        if error.status == 404:
            return "Gone"
        raise


def wait_phase(kube: Kube, namespace: str, name: str, *phases: str, timeout: float = 120) -> JSON:
    return wait_for(
        lambda: (
            run
            if (run := get_run(kube, namespace, name)).get("status", {}).get("phase") in phases
            else None
        ),
        timeout=timeout,
        what=f"{name} in {'/'.join(phases)}",
    )


def reconciliations(kube: Kube, namespace: str) -> list[JSON]:
    return list(kube.get(f"{GROUP}/namespaces/{namespace}/reconciliations")["items"])


def approvals(kube: Kube, namespace: str) -> list[JSON]:
    return list(kube.get(f"{GROUP}/namespaces/{namespace}/approvals")["items"])


def decide(alice: Kubectl, name: str, *, approved: bool = True) -> None:
    """alice's decision on the Approval ``name``, as a person makes it (`kubectl patch`)."""
    body = {"spec": {"approved": approved, "by": "alice"}}
    alice("patch", "approval", name, "--type=merge", "-p", json.dumps(body))


def settle_truly(alice: Kubectl, admin: Kube, namespace: str, shop: ShopServer) -> int:
    """Settle every pending Reconciliation of the namespace as alice, with what the shop says
    (an order under the key: executed), as a careful person does: "not executed" only once its
    ``status.notExecutedAfter`` has passed (until then a held-up step may still send it, and the
    operator refuses one written earlier); one the operator refused so (``DecidedTooEarly``) is
    looked at again and written again (a new ``decidedAt``), or corrected to executed. Returns
    how many were written."""
    settled = 0
    now = time.time()
    for rec in reconciliations(admin, namespace):
        spec, status = rec["spec"], rec.get("status") or {}
        if status.get("phase") == "Settled":
            continue
        if "executed" in spec and not _refused_too_early(status):
            continue
        executed = shop.shop.by_key()[spec["idempotencyKey"]] > 0
        after = parse_time(str(status.get("notExecutedAfter") or ""))
        if not executed and after is not None and after.timestamp() > now:
            continue  # looked at again later
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        patch = {
            "spec": {
                "executed": executed,
                "by": "alice",
                "note": "checked the shop",
                "decidedAt": stamp,
            }
        }
        alice(
            "patch",
            "reconciliation",
            rec["metadata"]["name"],
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
        settled += 1
    return settled


def _refused_too_early(status: JSON) -> bool:
    return any(
        c.get("type") == "Stalled"
        and c.get("status") == "True"
        and c.get("reason") == ("DecidedTooEarly")
        for c in status.get("conditions") or ()
    )


def drive_to_success(
    admin: Kube,
    alice: Kubectl,
    namespace: str,
    names: Iterable[str],
    shop: ShopServer,
    *,
    timeout: float = 240,
) -> dict[str, JSON]:
    """Wait until every run Succeeded, settling unknown outcomes truthfully on the way."""
    pending = set(names)
    done: dict[str, JSON] = {}

    def progress() -> bool:
        settle_truly(alice, admin, namespace, shop)
        for name in sorted(pending):
            run = get_run(admin, namespace, name)
            status = run.get("status", {})
            if status.get("phase") == "Succeeded":
                done[name] = run
                pending.discard(name)
            elif status.get("phase") == "Failed" or _stalled(run):
                raise AssertionError(f"{name} failed: {status.get('message')}")
        return not pending

    wait_for(progress, timeout=timeout, interval=0.5, what=f"runs to succeed: {sorted(pending)}")
    return done


def _stalled(run: JSON) -> bool:
    cond = condition(run, "Stalled")
    return bool(cond and cond.get("status") == "True")


def audit_events(dsn: str, namespace: str, run: str) -> list[Any]:
    """The run's audit chain, read from the store as `keelgate audit` does."""
    from keelgate.core.loop import Loop
    from keelgate.stores import open_stores

    stores = open_stores(dsn)
    try:
        loop = Loop(stores=stores)
        report = loop.verify_audit(namespace, run)
        assert report.ok, report.problems
        return list(loop.audit(namespace, run))
    finally:
        stores.close()
