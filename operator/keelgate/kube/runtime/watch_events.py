"""What a watch event asks of the work queue besides a reconcile of its own object.

Why it exists: most events queue their object's key and nothing else; a few say more (a run no
operator has looked at waits behind the runs under way; a Reconciliation deleted undecided
wakes its run). Pure: it reads the event, never the cluster, and never decides a run's fate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keelgate.kube.controller.ports import Key


def run_to_ask_again(event: Mapping[str, Any]) -> Key | None:
    """The run whose Reconciliation a watch event says was deleted undecided in the store's
    eyes (not Settled): the run is looked at again, and while its outcome is still unknown the
    operator makes the Reconciliation afresh (an admin's way out when its decision's maker cannot
    write it again). None for any other event."""
    body = event.get("object")
    if event.get("type") != "DELETED" or not isinstance(body, Mapping):
        return None
    if (body.get("status") or {}).get("phase") == "Settled":
        return None
    run = str((body.get("spec") or {}).get("runName") or "")
    namespace = str((body.get("metadata") or {}).get("namespace") or "")
    return ("AgentRun", namespace, run) if run and namespace else None


def is_new_run(event: Mapping[str, Any]) -> bool:
    """A watch event of an AgentRun no operator has looked at yet (created, no status): it waits
    behind the runs under way in the work queue, so that a flood of new runs (10,000 applied at
    once) delays no step pod's hand-off of a run already going; the new runs start as the
    queue allows, in the order they came."""
    body = event.get("object")
    return (
        event.get("type") == "ADDED"
        and isinstance(body, Mapping)
        and not body.get("status")
        and not (body.get("metadata") or {}).get("deletionTimestamp")
    )
