"""The API server in memory (``keelgate.testing.apiserver``), which the operator's unit tests and
the simulator both talk to, deletes an object its finalizers hold as a kube-apiserver does:
marked once (a second delete changes nothing and tells no watcher), no finalizer added to it
while it is marked (422), and gone, with what it owned collected, once its last finalizer goes.
The operator's finalizer on Approvals is proved against it; were it kinder than the real
server, those proofs would prove nothing."""

from __future__ import annotations

from typing import Any

import pytest

from keelgate.kube.api_failures import ApiFailure
from keelgate.kube.naming import DECISIONS_FINALIZER
from keelgate.testing.apiserver import JSON, MemoryApiServer
from keelgate.testing.sim.cluster import SimApiServer
from keelgate.testing.sim.world import Schedule, World

NAMESPACE = "shop"
OTHER = "example.com/other"


class Heard:
    """A watcher that notes what it hears: (put or drop, name, resourceVersion)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []

    def put(self, kind: str, body: JSON) -> None:
        self.told.append(("put", body["metadata"]["name"], body["metadata"]["resourceVersion"]))

    def drop(self, kind: str, body: JSON) -> None:
        self.told.append(("drop", body["metadata"]["name"], body["metadata"]["resourceVersion"]))


def approval(name: str, *finalizers: str, owner: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    if owner:
        meta["ownerReferences"] = [{"kind": "AgentRun", "name": "restock", "uid": owner}]
    return {"apiVersion": "keelgate.dev/v1alpha1", "kind": "Approval", "metadata": meta}


def test_a_second_delete_of_an_object_being_deleted_changes_nothing() -> None:
    """The first delete marks the held object (deletionTimestamp, a generation more, as
    kube-apiserver's markAsDeleting gives a custom object); a second delete leaves it exactly as
    it was, and no watcher hears of it (the real server's update changes nothing, so no
    resourceVersion and no watch event)."""
    api, heard = MemoryApiServer(), Heard()
    api.watchers.append(heard)
    created = api.create_object("Approval", NAMESPACE, approval("a", DECISIONS_FINALIZER))
    api.delete_object("Approval", NAMESPACE, "a")
    marked = api.get("Approval", NAMESPACE, "a")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["generation"] == created["metadata"]["generation"] + 1
    assert heard.told[-1] == ("put", "a", marked["metadata"]["resourceVersion"])
    told = len(heard.told)
    api.delete_object("Approval", NAMESPACE, "a")
    assert api.get("Approval", NAMESPACE, "a") == marked
    assert len(heard.told) == told


def test_no_finalizer_is_added_to_an_object_being_deleted() -> None:
    """Adding a finalizer to a marked object is refused with the real server's 422 (a refusal:
    asking again changes nothing), and the object is left as it was; removing another finalizer
    from it is allowed, and it stays while one is left."""
    api = MemoryApiServer()
    api.create_object("Approval", NAMESPACE, approval("a", DECISIONS_FINALIZER, OTHER))
    api.delete_object("Approval", NAMESPACE, "a")
    marked = api.get("Approval", NAMESPACE, "a")
    assert marked is not None
    version = marked["metadata"]["resourceVersion"]
    with pytest.raises(ApiFailure) as refused:
        api.set_finalizers(
            "Approval",
            NAMESPACE,
            "a",
            [DECISIONS_FINALIZER, OTHER, "example.com/late"],
            resource_version=version,
        )
    assert refused.value.status == 422 and refused.value.refused
    assert "no new finalizers" in str(refused.value)
    assert api.get("Approval", NAMESPACE, "a") == marked
    kept = api.set_finalizers(
        "Approval", NAMESPACE, "a", [DECISIONS_FINALIZER], resource_version=version
    )
    assert kept["metadata"]["finalizers"] == [DECISIONS_FINALIZER]
    assert api.get("Approval", NAMESPACE, "a") == kept


def test_the_last_finalizer_gone_the_object_goes_and_what_it_owned_is_collected() -> None:
    """Its last finalizer removed, a marked object leaves the server: the answer is the object
    without finalizers, its watchers hear it dropped, and the simulator's garbage collector
    deletes what it owned a moment later (not what another object owns)."""
    world = World(Schedule(seed=1))
    api, heard = SimApiServer(world, faulty=False), Heard()
    api.watchers.append(heard)
    owner = api.create_object("Approval", NAMESPACE, approval("a", DECISIONS_FINALIZER))
    uid = owner["metadata"]["uid"]
    api.create_object("Approval", NAMESPACE, approval("owned", owner=uid))
    elsewhere = api.create_object("Approval", NAMESPACE, approval("b"))["metadata"]["uid"]
    api.create_object("Approval", NAMESPACE, approval("other", owner=elsewhere))
    api.delete_object("Approval", NAMESPACE, "a")
    marked = api.get("Approval", NAMESPACE, "a")
    assert marked is not None
    world.run_until(60.0)
    assert api.get("Approval", NAMESPACE, "owned") is not None  # held: its owner is still there
    answer = api.set_finalizers(
        "Approval", NAMESPACE, "a", [], resource_version=marked["metadata"]["resourceVersion"]
    )
    assert "finalizers" not in answer["metadata"] and answer["metadata"]["deletionTimestamp"]
    assert api.get("Approval", NAMESPACE, "a") is None
    assert heard.told[-1] == ("drop", "a", answer["metadata"]["resourceVersion"])
    assert api.get("Approval", NAMESPACE, "owned") is not None  # the collector comes later
    world.run_until(120.0)
    assert api.get("Approval", NAMESPACE, "owned") is None
    assert api.get("Approval", NAMESPACE, "other") is not None


def test_an_object_made_for_an_owner_already_gone_is_collected_a_moment_later() -> None:
    """An operator whose cache is stale creates a step pod for a run deleted meanwhile (after
    the collector took what it owned): the garbage collector sees the new dependent, finds no
    owner of that uid, and deletes it a moment later, as kube's does with any dangling owner
    reference; one whose owner is there stays. (Left in place, such a pod held its name, and a
    run created again under the same name stalled on a pod "not this run's", seed
    1680693229101390139 on main 9c492ee.)"""
    world = World(Schedule(seed=1))
    api = SimApiServer(world, faulty=False)
    run = api.create_object("Approval", NAMESPACE, approval("run"))
    gone_uid = run["metadata"]["uid"]
    api.delete_object("Approval", NAMESPACE, "run")
    world.run_until(60.0)  # the collector has been and gone
    again = api.create_object("Approval", NAMESPACE, approval("run"))
    stale = api.create_object("Approval", NAMESPACE, approval("stale-step", owner=gone_uid))
    fresh = api.create_object(
        "Approval", NAMESPACE, approval("fresh-step", owner=again["metadata"]["uid"])
    )
    assert api.get("Approval", NAMESPACE, "stale-step") == stale  # the collector comes later
    world.run_until(120.0)
    assert api.get("Approval", NAMESPACE, "stale-step") is None
    assert api.get("Approval", NAMESPACE, "fresh-step") == fresh
