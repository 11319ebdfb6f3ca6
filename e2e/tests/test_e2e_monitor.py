"""Monitor runs on the operator: a cron schedule creates READ-only ticks, `<name>.tick-<n>`, each an
AgentRun of its own owned by the monitor; a tick waiting for a person holds the next one back;
finished ticks are kept as a CronJob keeps its Jobs.

Slow by nature (cron's finest grain is a minute): about three minutes. It must never depend on
objects outside its own namespace.
"""

from __future__ import annotations

import pytest

from keelgate_e2e import runs
from keelgate_e2e.keelgate import OperatorPod
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import apply, look, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e


def _monitor(shop: ShopServer) -> JSON:
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "watch"},
        "spec": {
            "loop": "monitor",
            "schedule": "* * * * *",
            "goal": "check the stock of A1 every minute",
            "successfulTicksHistoryLimit": 1,
            "model": {
                "provider": "scripted",
                "name": "demo",
                "script": [{"actions": [look("A1")]}, {"done": True, "answer": "A1 is fine"}],
            },
            "tools": [
                {
                    "name": "get_inventory",
                    "sideEffect": "READ",
                    "requiresApproval": True,
                    "http": {"url": f"{shop.url}/items/{{sku}}", "method": "GET"},
                }
            ],
            "budget": {"maxIterations": 3},
        },
    }


def _ticks(admin: Kube, namespace: str) -> list[str]:
    listed = admin.get(runs.runs_path(namespace), {"labelSelector": "keelgate.dev/monitor=watch"})
    return sorted(item["metadata"]["name"] for item in listed["items"])


def _approve(admin: Kube, alice: Kubectl, namespace: str, run: str) -> None:
    def pending() -> str:
        for approval in runs.approvals(admin, namespace):
            if approval["spec"]["runName"] == run and "approved" not in approval["spec"]:
                return str(approval["metadata"]["name"])
        return ""

    runs.decide(alice, wait_for(pending, timeout=60, what=f"the approval of {run}"))


def test_a_monitor_ticks_holds_back_behind_a_waiting_tick_and_keeps_its_history(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """Every minute a tick: tick 1 waits for an approval, so the next minute's tick is held
    back (the monitor says so and no tick 2 exists); approved, tick 1 finishes; the next minute
    brings tick 2, and once it finishes only one finished tick is kept (the history limit). No
    tick ever runs a WRITE: a monitor only reads."""
    apply(kubectl, _monitor(shop))
    wait_for(lambda: _ticks(admin, tenant) == ["watch.tick-1"], timeout=90, what="tick 1")
    first = wait_phase(admin, tenant, "watch.tick-1", "Stopped", timeout=60)
    assert first["status"]["stopReason"] == "awaiting_approval"
    owner = first["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("AgentRun", "watch")

    def held_back() -> bool:
        message = runs.get_run(admin, tenant, "watch")["status"].get("message", "")
        return "held back" in message

    wait_for(held_back, timeout=90, interval=1, what="the monitor to hold its next tick back")
    assert _ticks(admin, tenant) == ["watch.tick-1"]
    _approve(admin, alice, tenant, "watch.tick-1")
    wait_phase(admin, tenant, "watch.tick-1", "Succeeded", timeout=60)
    wait_for(lambda: "watch.tick-2" in _ticks(admin, tenant), timeout=90, what="tick 2")
    _approve(admin, alice, tenant, "watch.tick-2")
    wait_phase(admin, tenant, "watch.tick-2", "Succeeded", timeout=60)
    wait_for(
        lambda: _ticks(admin, tenant) == ["watch.tick-2"],
        timeout=60,
        what="tick 1 trimmed by the history limit",
    )
    monitor = runs.get_run(admin, tenant, "watch")
    assert monitor["status"]["lastTick"] == "watch.tick-2"
    assert shop.shop.count() == 0  # reads only
    events = runs.audit_events(operator.cluster.dsn, tenant, "watch.tick-1")
    assert "loop.approved" in [e.type for e in events]  # the store keeps a trimmed tick's trail
