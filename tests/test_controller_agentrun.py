"""The AgentRun reconciler, without a cluster: each decision of the operator about a run, against
a fake API server, the real cache, a SQLite store and real ``keelgate step`` runs in this process
(tests/support/operator_rig.py).

What a user would notice if these broke: a step pod made before its intent is in status (two
pods for one step after a restart), a crash loop that never stops or never backs off, a run
that waits for a person shown as still running, more step pods than ``--max-step-pods``, a pod
of someone else's adopted, a WRITE that runs twice. The e2e suite proves the same decisions on
a real API server (e2e/tests/test_e2e_operator.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.decision_objects import NOTHING_TO_SETTLE
from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.naming import (
    RUN_LABEL,
    STEP_LABEL,
    STEP_POD_LABEL,
    STEP_POD_NAME,
    action_object_name,
)
from keelgate.kube.resources import StepPodSettings
from keelgate.manifest.step_defaults import StepPodDefaults
from support import operator_tools
from support.operator_rig import NAMESPACE, ORDER, TOOLS, Operator, agentrun_spec

pytestmark = pytest.mark.usefixtures("orders")

#: The Reconciliation of the run's first action, of each tool the tests use.
PLACE = action_object_name("restock", "1:0", "place_order")
LOST = action_object_name("restock", "1:0", "lost_write")
#: A model that plans the same order twice: both calls get one idempotency key.
TWICE = [{"actions": [ORDER, ORDER]}, {"done": True, "answer": "ordered"}]


def test_a_run_is_driven_to_its_goal_one_step_pod_at_a_time(kube: Operator) -> None:
    """Each step gets one pod, named by run, step and attempt; the run ends Succeeded with its
    answer, its one WRITE done once, and the Events tell the run's start and its end (with the
    last step's end): a routine next step after a clean end is told by the status alone."""
    kube.apply("restock", agentrun_spec())
    assert kube.drive("restock") == [0, 0]
    assert kube.pods() == ["restock-s1-a1", "restock-s2-a1"]
    status = kube.status("restock")
    assert (status["phase"], status["stopReason"], status["answer"]) == (
        "Succeeded",
        "goal_met",
        "ordered",
    )
    assert kube.condition("restock", "Succeeded")["status"] == "True"
    assert status["step"]["state"] == "Ended" and status["step"]["number"] == 2
    assert len(operator_tools.ORDERS) == 1
    assert kube.api.reasons() == ["StepStarted", "Succeeded"]
    assert "step 1 attempt 1: pod restock-s1-a1" in kube.api.events[0].message
    # The last clean end is told with the run's stop: one Event for both.
    done = kube.api.events[1]
    assert done.message == "ordered (step 2 (pod restock-s2-a1) ended: exit code 0 (Completed))"
    assert kube.sample("keelgate_steps_started_total") == 2
    assert kube.sample("keelgate_steps_ended_total", result="clean") == 2
    assert kube.reconcile("restock") == REST  # finished: nothing more to do
    assert len(kube.pods()) == 2


def test_every_step_is_told_in_an_event_when_the_platform_asks(tmp_path: Path) -> None:
    """With ``--step-events=every`` each step's start is an Event, a clean end told with what
    comes next (one Event for both), as before the default became the notable starts only."""
    kube = Operator(tmp_path, settings=ControllerSettings(every_step_event=True))
    try:
        kube.apply("restock", agentrun_spec())
        assert kube.drive("restock") == [0, 0]
        assert kube.api.reasons() == ["StepStarted", "StepStarted", "Succeeded"]
        second, done = kube.api.events[1], kube.api.events[2]
        assert "(step 1 (pod restock-s1-a1) ended: exit code 0 (Completed))" in second.message
        assert done.message == "ordered (step 2 (pod restock-s2-a1) ended: exit code 0 (Completed))"
    finally:
        kube.close()


def test_the_intent_is_in_status_before_its_pod_is_created(kube: Operator) -> None:
    """status.step names the pod (Pending) before the create: a restarted operator creates or
    adopts exactly that pod. Looking again while it runs writes nothing."""
    kube.apply("restock", agentrun_spec())
    assert kube.reconcile("restock") == REST
    assert kube.api.writes[:3] == [
        "create AgentRun restock",
        "patch AgentRun/status restock",
        "create Pod restock-s1-a1",
    ]
    step = kube.status("restock")["step"]
    assert (step["pod"], step["state"], step["attempt"], step["crashes"]) == (
        "restock-s1-a1",
        "Pending",
        1,
        0,
    )
    assert kube.status("restock")["phase"] == "Running"
    pod = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
    assert pod is not None
    assert pod["metadata"]["ownerReferences"][0]["uid"] == kube.run("restock")["metadata"]["uid"]
    writes = len(kube.api.writes)
    kube.api.start_pod(NAMESPACE, "restock-s1-a1")
    assert kube.reconcile("restock") == REST
    assert kube.reconcile("restock") == REST
    assert len(kube.api.writes) == writes  # the pod runs and status says so already


def test_an_operator_restarted_after_the_intent_creates_that_same_pod(tmp_path: Path) -> None:
    """A death between the status write and the pod's create: the next operator (an empty cache,
    the run listed again) creates the pod the status names, and no other."""
    first = Operator(tmp_path)
    first.apply("restock", agentrun_spec())
    first.api.refuse_next["create_pod"] = ConnectionError("the operator died here")
    with pytest.raises(ConnectionError):
        first.reconcile("restock")
    first.close()
    assert first.pods() == [] and first.status("restock")["step"]["pod"] == "restock-s1-a1"
    second = Operator(tmp_path, api=first.api)
    try:
        second.relist("AgentRun", "Pod")
        assert second.reconcile("restock") == REST
        assert second.pods() == ["restock-s1-a1"]
        assert second.drive("restock") == [0, 0]
        assert len(operator_tools.ORDERS) == 1
    finally:
        second.close()


def test_a_crashed_step_pod_is_retried_with_back_off_then_the_run_stalls(tmp_path: Path) -> None:
    """A pod that ends without recording a stop is a crash: the same step's next attempt, at
    once the first time, then after a back-off; after --max-crashes in a row the run is Stalled
    until its spec changes, and a spec change tries again; the WRITE is done once."""
    kube = Operator(tmp_path, settings=ControllerSettings(max_crashes=2, crash_backoff=3.0))
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        assert kube.run_step("restock", failpoints={"after_plan": 1}) == 137
        kube.reconcile("restock")
        step = kube.status("restock")["step"]
        assert (step["pod"], step["crashes"], step["notBefore"]) == ("restock-s1-a2", 1, "")
        assert step["lastExit"] == "exit code 137 (Error)"
        assert kube.api.events[-2].reason == "StepEnded"
        assert kube.api.events[-2].type == "Warning"

        # The plan was saved before the first death: this attempt resumes at the action.
        assert kube.run_step("restock", failpoints={"before_action": 1}) == 137
        kube.reconcile("restock")
        status = kube.status("restock")
        assert status["phase"] == "Stopped"
        assert status["step"]["state"] == "Stalled"
        assert status["message"] == (
            "2 step pods in a row ended without recording a stop (last: exit code 137 (Error)); "
            "change the spec (e.g. toggle spec.suspend) to retry"
        )
        assert kube.condition("restock", "Stalled")["reason"] == "StepsFailing"
        assert kube.reconcile("restock") == REST
        assert kube.pods() == ["restock-s1-a1", "restock-s1-a2"]

        kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"budget": {"maxIterations": 6}})
        kube.reconcile("restock")
        step = kube.status("restock")["step"]
        # Tried again as the next step (its intent is new), with the crash count cleared.
        assert (step["pod"], step["state"], step["crashes"]) == ("restock-s2-a1", "Pending", 0)
        assert kube.drive("restock") == [0, 0]
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
    finally:
        kube.close()


def test_the_back_off_doubles_from_the_third_attempt(tmp_path: Path) -> None:
    """Attempt 2 starts at once, attempt 3 after crash_backoff, attempt 4 after twice that; the
    reconcile asks to be back when the back-off has passed, and makes no pod before."""
    now = [1_000_000.0]
    kube = Operator(
        tmp_path,
        settings=ControllerSettings(max_crashes=9, crash_backoff=2.0),
        clock=lambda: now[0],
    )
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 137)
        assert kube.reconcile("restock") == REST  # attempt 2 at once
        kube.api.finish_pod(NAMESPACE, "restock-s1-a2", 137)
        assert kube.reconcile("restock") == Requeue(2.0)
        assert kube.status("restock")["step"]["notBefore"] == "1970-01-12T13:46:42Z"
        assert kube.status("restock")["message"] == (
            "next attempt after 1970-01-12T13:46:42Z (back-off after a failed pod)"
        )
        assert kube.pods() == ["restock-s1-a1", "restock-s1-a2"]
        now[0] += 3.0
        assert kube.reconcile("restock") == REST
        kube.api.finish_pod(NAMESPACE, "restock-s1-a3", 137)
        assert kube.reconcile("restock") == Requeue(4.0)
    finally:
        kube.close()


def test_a_step_that_refuses_its_input_stalls_the_run_at_once(kube: Operator) -> None:
    """Exit 2 (the step refused its input: here a tool that is not in the image) would fail the
    same way again: the run stalls with the step's own error line until the spec changes."""
    spec = agentrun_spec()
    spec["tools"][0]["python"]["callable"] = "support.operator_tools:nothing_here"
    kube.apply("restock", spec)
    kube.reconcile("restock")
    assert kube.run_step("restock") == 2
    kube.reconcile("restock")
    status = kube.status("restock")
    assert status["step"]["state"] == "Stalled"
    assert status["message"].startswith("the step refused its input: exit code 2 (Error): ")
    assert "nothing_here" in status["message"]
    assert kube.pods() == ["restock-s1-a1"]
    assert kube.sample("keelgate_steps_ended_total", result="bad_input") == 1


def test_a_busy_run_is_retried_later_and_is_not_a_crash(tmp_path: Path) -> None:
    """Exit 4: another process drives the run. The next attempt waits busy_retry seconds and
    the crash count stays where it was."""
    now = [2_000_000.0]
    kube = Operator(tmp_path, settings=ControllerSettings(busy_retry=5.0), clock=lambda: now[0])
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 4)
        assert kube.reconcile("restock") == Requeue(5.0)
        step = kube.status("restock")["step"]
        assert (step["pod"], step["crashes"]) == ("restock-s1-a2", 0)
        assert step["lastExit"] == "exit code 4 (Error): another process was driving the run"
        assert kube.sample("keelgate_steps_ended_total", result="busy") == 1
    finally:
        kube.close()


def test_a_preempted_step_goes_on_at_once_and_is_not_a_crash(tmp_path: Path) -> None:
    """Exit 75: the step pod was asked to stop (a drain) and stopped at a checkpoint. The same
    step's next attempt starts at once, even after earlier crashes (no back-off), the crash
    count stays where it was, and a Normal Event (not a Warning) says what happened."""
    now = [2_000_000.0]
    kube = Operator(tmp_path, clock=lambda: now[0])
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        for attempt in (1, 2):  # two crashes: the next retry would back off
            kube.api.finish_pod(NAMESPACE, f"restock-s1-a{attempt}", 137)
            kube.reconcile("restock")
        now[0] += 60  # past the back-off: the third attempt starts
        kube.reconcile("restock")
        kube.api.finish_pod(NAMESPACE, "restock-s1-a3", 75)
        assert kube.reconcile("restock") != Requeue(1.0)
        step = kube.status("restock")["step"]
        assert (step["pod"], step["crashes"], step["notBefore"]) == ("restock-s1-a4", 2, "")
        assert step["lastExit"].startswith("exit code 75 (Error): asked to stop")
        assert kube.sample("keelgate_steps_ended_total", result="preempted") == 1
        preempted = [e for e in kube.api.events if e.reason == "StepPreempted"]
        assert [e.type for e in preempted] == ["Normal"]
    finally:
        kube.close()


def test_a_step_pod_gets_a_grace_period_that_covers_its_longest_call(kube: Operator) -> None:
    """terminationGracePeriodSeconds is the longest tool time limit plus 30 s, so a drain's
    SIGTERM lets the call under way finish and be recorded."""
    spec = agentrun_spec()
    spec["tools"][-1]["timeoutSeconds"] = 95
    kube.apply("restock", spec)
    kube.reconcile("restock")
    pod = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
    assert pod is not None and pod["spec"]["terminationGracePeriodSeconds"] == 95 + 30


def test_a_pod_deleted_but_never_seen_to_end_is_taken_as_lost_after_its_grace(
    tmp_path: Path,
) -> None:
    """A running step pod is deleted (the node lifecycle controller evicts the pods of a node
    that stopped reporting) and never ends: no kubelet is there to end it. The run waits for it
    until its deletion deadline has passed by LOST_AFTER (no new pod before: its process may
    still be at work), looking again then by itself; then the same step's next attempt runs,
    the lost pod counted as a crash, and the WRITE is still done once."""
    import time

    from keelgate.kube.resources import LOST_AFTER

    now = [time.time()]
    kube = Operator(tmp_path, clock=lambda: now[0])
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        kube.api.start_pod(NAMESPACE, "restock-s1-a1")
        kube.api.delete_pod(NAMESPACE, "restock-s1-a1")  # evicted; nobody confirms it
        waited = kube.reconcile("restock")
        assert isinstance(waited, Requeue) and 0 < waited.after <= LOST_AFTER + 1
        assert kube.api.get("Pod", NAMESPACE, "restock-s1-a2") is None
        assert kube.status("restock")["phase"] == "Running"
        now[0] += LOST_AFTER + 2
        kube.reconcile("restock")
        step = kube.status("restock")["step"]
        assert (step["pod"], step["crashes"]) == ("restock-s1-a2", 1)
        assert step["lastExit"].startswith("lost: deleted")
        assert kube.api.get("Pod", NAMESPACE, "restock-s1-a2") is not None
        assert kube.drive("restock") == [0, 0]
        assert len(operator_tools.ORDERS) == 1
    finally:
        kube.close()


def test_a_step_pod_deleted_mid_step_counts_as_a_crash(kube: Operator) -> None:
    """A pod that vanished (its tombstone in the cache) ended without recording a stop: the
    same step's next attempt runs, and the WRITE is still done once."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    kube.api.start_pod(NAMESPACE, "restock-s1-a1")
    kube.api.remove("Pod", NAMESPACE, "restock-s1-a1")
    kube.reconcile("restock")
    step = kube.status("restock")["step"]
    assert (step["pod"], step["crashes"], step["lastExit"]) == (
        "restock-s1-a2",
        1,
        "deleted before it ended",
    )
    assert kube.drive("restock") == [0, 0]
    assert len(operator_tools.ORDERS) == 1


def test_a_pod_of_someone_else_under_the_intended_name_stalls_the_run(kube: Operator) -> None:
    """The step pod's name is taken by a pod this run does not own: never adopted, never
    deleted; the run stalls saying so."""
    kube.api.create_pod(
        NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "restock-s1-a1"}}
    )
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    status = kube.status("restock")
    assert status["message"] == "a pod named restock-s1-a1 exists and is not this run's; delete it"
    assert kube.condition("restock", "Stalled")["status"] == "True"
    assert "delete Pod restock-s1-a1" not in kube.api.writes


def _pod_of_a_restock_deleted_before(kube: Operator) -> dict[str, object]:
    """A step pod under the run's first pod name, owned by a run ``restock`` of another uid
    (one deleted before); returns its owner reference."""
    old_owner: dict[str, object] = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "name": "restock",
        "uid": "uid-of-the-restock-deleted-before",
        "controller": True,
    }
    kube.api.create_pod(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "restock-s1-a1",
                "labels": {STEP_POD_LABEL: STEP_POD_NAME, RUN_LABEL: "restock", STEP_LABEL: "1"},
                "ownerReferences": [old_owner],
            },
        },
    )
    return old_owner


def test_a_pod_of_an_earlier_run_of_the_same_name_is_not_adopted(kube: Operator) -> None:
    """A run deleted and made again under the same name: a pod of the old one (its owner the
    old run's name, but the old run's uid) still holds the new run's first pod name. The
    create meets a 409 and the pod found is not adopted, for its owner's uid is not this
    run's: the run stalls saying so (it does not take the old run's step for its own), the
    old pod is not deleted, and once it is gone the run makes its own pod."""
    old_owner = _pod_of_a_restock_deleted_before(kube)
    kube.apply("restock", agentrun_spec())
    assert kube.run("restock")["metadata"]["uid"] != old_owner["uid"]
    kube.reconcile("restock")
    status = kube.status("restock")
    assert status["message"] == "a pod named restock-s1-a1 exists and is not this run's; delete it"
    assert kube.condition("restock", "Stalled")["status"] == "True"
    assert "delete Pod restock-s1-a1" not in kube.api.writes
    kube.api.remove("Pod", NAMESPACE, "restock-s1-a1")
    kube.reconcile("restock")
    (pod,) = kube.api.of_kind("Pod")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == kube.run("restock")["metadata"]["uid"]


def test_a_pod_of_another_run_deleted_while_the_watch_was_away_does_not_stall_the_run(
    kube: Operator,
) -> None:
    """A run stalled on an ended pod of an earlier run of its name, under its next pod name;
    the server then deletes that pod while no watch looks (a watch that reconnects never
    reports what went while it was away), so the cache still holds it. The run does not stay
    stalled on it, telling a person to delete a pod that is not there: the server is asked,
    the pod is forgotten as deleted, and the run makes its own pod and goes on (make sim: seed
    12998402584335380776 stood Stalled for good)."""
    _pod_of_a_restock_deleted_before(kube)
    kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 4)
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    assert kube.condition("restock", "Stalled")["status"] == "True"  # there, and not its own
    kube.api.remove("Pod", NAMESPACE, "restock-s1-a1", tell=False)  # the watch was away
    kube.reconcile("restock")
    (pod,) = kube.api.of_kind("Pod")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == kube.run("restock")["metadata"]["uid"]
    assert kube.drive("restock") == [0, 0]
    assert kube.condition("restock", "Stalled")["status"] == "False"
    assert len(operator_tools.ORDERS) == 1


def test_a_pod_of_another_run_seen_in_the_cache_and_still_there_stalls_the_run(
    kube: Operator,
) -> None:
    """Asking the server before stalling changes nothing when the foreign pod is there: the run
    stalls saying so, the pod is neither adopted nor deleted, and every look says the same."""
    kube.api.create_pod(
        NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "restock-s1-a1"}}
    )
    kube.apply("restock", agentrun_spec())
    for _ in range(2):
        kube.reconcile("restock")
        assert kube.condition("restock", "Stalled")["status"] == "True"
    assert kube.status("restock")["message"] == (
        "a pod named restock-s1-a1 exists and is not this run's; delete it"
    )
    assert kube.api.of_kind("Pod")[0]["metadata"].get("ownerReferences") is None
    assert "delete Pod restock-s1-a1" not in kube.api.writes


def test_a_pod_already_created_by_an_earlier_operator_is_adopted(tmp_path: Path) -> None:
    """An operator that died right after creating the pod, and a new one whose pod watch has
    not reported it yet: the create meets a 409, the pod found is this run's, and it is adopted
    (in the cache, holding its slot), never made twice nor deleted."""
    first = Operator(tmp_path)
    first.apply("restock", agentrun_spec())
    first.reconcile("restock")
    first.close()
    second = Operator(tmp_path, api=first.api)
    try:
        second.relist("AgentRun")  # the pods' listing has not arrived yet
        assert second.reconcile("restock") == REST
        assert second.api.writes.count("create Pod restock-s1-a1") == 2
        assert second.pods() == ["restock-s1-a1"]
        assert second.cache.get("Pod", NAMESPACE, "restock-s1-a1") is not None
        assert second.cache.active_step_pods() == 1
        assert "delete Pod restock-s1-a1" not in second.api.writes
    finally:
        second.close()


def test_a_lost_race_on_the_status_makes_no_pod_and_looks_again(kube: Operator) -> None:
    """Another writer changed the run since it was read (409 on the guarded patch): no pod is
    made from the stale view; the reconcile asks to look again in half a second."""
    kube.apply("restock", agentrun_spec())
    kube.api.refuse_next["patch_status"] = Conflict("patch: 409 Conflict", status=409)
    assert kube.reconcile("restock") == Requeue(0.5)
    assert kube.pods() == []
    assert kube.reconcile("restock") == REST
    assert kube.pods() == ["restock-s1-a1"]


def test_a_run_deleted_unseen_is_forgotten_and_its_pods_stopped(kube: Operator) -> None:
    """The status patch meets a 404 naming the run (deleted while the watch was away): the run
    is forgotten as deleted, no pod is made; the next look stops its running pods. A 404 that
    names nothing (a server still starting) is an error, retried with back-off."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    kube.api.start_pod(NAMESPACE, "restock-s1-a1")
    kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 0)
    kube.api.refuse_next["patch_status"] = Gone("404", named="")
    with pytest.raises(Gone):
        kube.reconcile("restock")
    kube.api.refuse_next["patch_status"] = Gone("404", named="restock")
    assert kube.reconcile("restock") == Requeue(0.5)
    assert kube.cache.get("AgentRun", NAMESPACE, "restock") is None
    assert kube.pods() == ["restock-s1-a1"]


def test_deleting_a_run_stops_its_running_step_pod(kube: Operator) -> None:
    """An AgentRun being deleted: its running step pod is deleted at once (precondition on the
    pod's uid); a finished one is left to the garbage collector."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    kube.api.start_pod(NAMESPACE, "restock-s1-a1")
    kube.api.patch_metadata(
        "AgentRun", NAMESPACE, "restock", {"deletionTimestamp": "2026-12-04T10:00:00Z"}
    )
    assert kube.reconcile("restock") == REST
    assert "delete Pod restock-s1-a1" in kube.api.writes
    pod = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
    assert pod is not None and pod["metadata"].get("deletionTimestamp")


def test_a_suspended_run_starts_no_step_pod(kube: Operator) -> None:
    """spec.suspend: no new pod; Reconciling False (Suspended), and setting it false goes on."""
    kube.apply("restock", agentrun_spec(suspend=True))
    assert kube.reconcile("restock") == REST
    assert kube.pods() == []
    assert kube.condition("restock", "Reconciling")["reason"] == "Suspended"
    assert kube.status("restock")["message"] == "suspended (spec.suspend is true)"
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"suspend": False})
    assert kube.drive("restock") == [0, 0]
    assert kube.status("restock")["phase"] == "Succeeded"


def test_a_spec_the_models_refuse_stalls_the_run_naming_the_field(kube: Operator) -> None:
    """A spec the API server's schema let through but the models refuse: Stalled, with the one
    line naming the field; no pod."""
    spec = agentrun_spec()
    spec["goal"] = "   "
    kube.apply("restock", spec)
    kube.reconcile("restock")
    status = kube.status("restock")
    assert status["phase"] == "Stopped"
    assert status["message"].startswith("spec.goal: ")
    assert kube.pods() == []


def test_the_step_slots_cap_the_pods_and_wake_the_longest_waiting(tmp_path: Path) -> None:
    """With --max-step-pods 1, a second run's intended pod waits, the run among those to wake
    when a step pod ends; once the first's pod has ended, the second gets its pod."""
    kube = Operator(tmp_path, settings=ControllerSettings(max_step_pods=1))
    try:
        kube.apply("first", agentrun_spec())
        kube.apply("second", agentrun_spec())
        kube.reconcile("first")
        assert kube.reconcile("second") == REST
        assert kube.pods() == ["first-s1-a1"]
        assert kube.status("second")["step"]["state"] == "Pending"
        assert kube.controller.waiting_for_slots(8) == [("AgentRun", NAMESPACE, "second")]
        assert kube.reconcile("second") == REST  # still no slot: still waiting, no pod
        assert kube.pods() == ["first-s1-a1"]
        kube.run_step("first")
        assert kube.reconcile("second") == REST
        assert kube.pods() == ["first-s1-a1", "second-s1-a1"]
        assert kube.controller.waiting_for_slots(8) == []
    finally:
        kube.close()


def test_failpoints_are_refused_without_the_flag(kube: Operator) -> None:
    """The failpoints annotation on an operator started without --allow-failpoints: one
    Warning, recorded as seen, never in a pod."""
    kube.apply("restock", agentrun_spec(), annotations={"keelgate.dev/failpoints": "after_plan@1"})
    kube.reconcile("restock")
    assert kube.api.reasons() == ["FailpointsIgnored", "StepStarted"]
    assert kube.status("restock")["failpointsSeen"] == "after_plan@1"
    pod = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
    assert pod is not None
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert "KEELGATE_FAILPOINTS" not in env


def test_failpoints_go_into_the_next_pod_only(tmp_path: Path) -> None:
    """With --allow-failpoints the annotation's value goes into the next step pod, which dies
    there, and into no later pod (one-shot per value): the retry finishes, the WRITE done once."""
    kube = Operator(tmp_path, settings=ControllerSettings(allow_failpoints=True))
    try:
        kube.apply(
            "restock", agentrun_spec(), annotations={"keelgate.dev/failpoints": "after_verify@1"}
        )
        kube.reconcile("restock")
        first = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
        assert first is not None
        env = first["spec"]["containers"][0]["env"]
        assert {"name": "KEELGATE_FAILPOINTS", "value": "after_verify@1"} in env
        assert "with failpoints after_verify@1" in kube.api.events[-1].message
        assert kube.run_step("restock") == 137
        kube.reconcile("restock")
        retry = kube.api.get("Pod", NAMESPACE, "restock-s1-a2")
        assert retry is not None
        env = retry["spec"]["containers"][0]["env"]
        assert "KEELGATE_FAILPOINTS" not in {e["name"] for e in env}
        assert kube.status("restock")["failpointsSeen"] == "after_verify@1"
        # The first pod died after its iteration's last checkpoint: the retry plans the next.
        assert kube.drive("restock") == [0]
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
    finally:
        kube.close()


def test_a_confirmer_settlement_is_shown_as_a_settled_reconciliation(tmp_path: Path) -> None:
    """A step pod dies right after its WRITE; the next attempt's confirmer (--confirmer)
    settles the unknown outcome without the run stopping. The operator shows that decision as
    a Reconciliation already Settled with source confirmer, tells it in an Event, and the run
    finishes with the WRITE done once."""
    pods = StepPodSettings(confirmer="support.operator_tools:OrderBook")
    kube = Operator(tmp_path, settings=ControllerSettings(pods=pods))
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        assert kube.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
        assert kube.drive("restock") == [0, 0]
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
        shown = kube.api.get("Reconciliation", NAMESPACE, PLACE)
        assert shown is not None
        assert {k: shown["status"][k] for k in ("phase", "verdict", "source")} == {
            "phase": "Settled",
            "verdict": "executed",
            "source": "confirmer",
        }
        told = next(e for e in kube.api.events if e.reason == "Settled")
        assert told.message.startswith("place_order (1:0) settled as executed by the confirmer ")
        assert "OutcomeUnknown" not in kube.api.reasons()
    finally:
        kube.close()


def test_an_unknown_outcome_stops_the_run_and_asks_for_a_reconciliation(kube: Operator) -> None:
    """A WRITE whose outcome nobody knows: the run stops (no further pod), a Reconciliation
    named after the run, iteration and tool is made and shown Pending with the moment from
    which it may be settled as not executed, OutcomeUnknown names it,
    and a Warning tells people what to settle."""
    kube.apply("restock", agentrun_spec(tool="lost_write"))
    assert kube.drive("restock") == [3]
    status = kube.status("restock")
    assert (status["phase"], status["stopReason"]) == ("Stopped", "outcome_unknown")
    made = kube.api.get("Reconciliation", NAMESPACE, LOST)
    assert made is not None
    # Pending, saying from when "not executed" may be settled (the run's status says the same).
    (unknown,) = status["unknownActions"]
    assert made["status"] == {"phase": "Pending", "notExecutedAfter": unknown["notExecutedAfter"]}
    assert made["spec"]["action"] == "1:0" and made["spec"]["idempotencyKey"].startswith("kg-")
    assert kube.condition("restock", "OutcomeUnknown")["message"] == (
        f"lost_write (1:0): see reconciliation {LOST}"
    )
    warning = next(e for e in kube.api.events if e.reason == "OutcomeUnknown")
    assert warning.message == (
        f"lost_write (1:0) may or may not have run: settle reconciliation {LOST}"
    )
    writes = len(kube.api.writes)
    assert kube.reconcile("restock") == REST
    assert len(kube.api.writes) == writes  # made once
    assert len(operator_tools.ORDERS) == 1


def test_a_reconciliation_of_a_run_deleted_while_the_watch_was_away_does_not_hold_the_name(
    kube: Operator,
) -> None:
    """A run deleted and made again: the earlier run's Reconciliation under the name the new
    run's unknown outcome needs was collected while the operator's watch was away (a watch that
    reconnects never reports it), so the cache still shows it. The new run still gets its own
    Reconciliation to settle, not none for good (make sim: seed 1662049015829973836 was left
    on an unknown outcome nobody could settle)."""
    old_owner = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "name": "restock",
        "uid": "uid-of-the-restock-deleted-before",
        "controller": True,
    }
    kube.api.create_object(
        "Reconciliation",
        NAMESPACE,
        {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "Reconciliation",
            "metadata": {"name": LOST, "namespace": NAMESPACE, "ownerReferences": [old_owner]},
            "spec": {"run": "restock", "action": "1:0", "idempotencyKey": "kg-earlier"},
        },
    )
    kube.api.remove("Reconciliation", NAMESPACE, LOST, tell=False)  # the watch was away
    kube.apply("restock", agentrun_spec(tool="lost_write"))
    assert kube.drive("restock") == [3]
    made = kube.api.get("Reconciliation", NAMESPACE, LOST)
    assert made is not None
    owner = made["metadata"]["ownerReferences"][0]["uid"]
    assert owner == kube.run("restock")["metadata"]["uid"]
    assert made["status"]["phase"] == "Pending"


def test_an_unknown_outcome_refused_late_has_nothing_to_settle_and_the_run_goes_on(
    kube: Operator,
) -> None:
    """A WRITE outlives its time limit: the step stops the run with outcome_unknown and exits
    while the call still runs, and the operator asks for a Reconciliation. The call is then
    answered with a refusal (nothing happened) and its owner drops its key. The operator does
    not wait for a settlement nobody can make: the Reconciliation says there is nothing to
    settle, a Normal Event tells it, the next step makes the order again and the run
    finishes, the order placed once."""
    spec = agentrun_spec(tool="refused_late")
    spec["tools"][0]["timeoutSeconds"] = 0.2
    kube.apply("restock", spec)
    kube.reconcile("restock")
    assert kube.run_step("restock", late_call_grace=0) == 3
    kube.reconcile("restock")
    assert kube.status("restock")["stopReason"] == "outcome_unknown"
    name = action_object_name("restock", "1:0", "refused_late")
    made = kube.api.get("Reconciliation", NAMESPACE, name)
    assert made is not None and made["status"]["phase"] == "Pending"
    key = made["spec"]["idempotencyKey"]
    operator_tools.ANSWER.set()  # refused: nothing happened, and its owner drops the key
    deadline = time.monotonic() + 10
    while kube.stores.idempotency.get(NAMESPACE, key) is not None:
        assert time.monotonic() < deadline, "the late refusal never dropped the key"
        time.sleep(0.02)
    assert kube.drive("restock") == [0, 0]
    status = kube.status("restock")
    assert status["phase"] == "Succeeded", status
    shown = kube.api.get("Reconciliation", NAMESPACE, name)
    assert shown is not None and shown["status"]["phase"] == "Pending"
    assert shown["status"]["message"] == NOTHING_TO_SETTLE
    told = next(e for e in kube.api.events if e.reason == "NothingToSettle")
    assert told.message == (
        "refused_late (1:0) was refused after all (nothing happened): "
        f"reconciliation {name} has nothing to settle"
    )
    assert [key, key] == operator_tools.CALLS
    assert len(operator_tools.ORDERS) == 1


def test_a_pending_approval_stops_the_run_and_asks_for_an_approval(kube: Operator) -> None:
    """A tool that needs approval: the run stops before the call, an Approval is made and
    shown Pending, AwaitingApproval names it; nothing ran."""
    kube.apply("restock", agentrun_spec(approval=True))
    assert kube.drive("restock") == [3]
    assert kube.status("restock")["stopReason"] == "awaiting_approval"
    made = kube.api.get("Approval", NAMESPACE, action_object_name("restock", "1:0", "place_order"))
    assert made is not None
    assert {k: made["status"][k] for k in ("phase", "progress", "message")} == {
        "phase": "Pending",
        "progress": "0 of 1",
        "message": "waiting for a person to approve or deny it",
    }
    assert kube.condition("restock", "AwaitingApproval")["status"] == "True"
    assert kube.api.reasons()[-2:] == ["AwaitingApproval", "Stopped"]
    assert operator_tools.ORDERS == []


def test_a_budget_stop_resumes_when_the_spec_changes(kube: Operator) -> None:
    """A budget stop is at rest until the spec changes; then one more step runs with the new
    spec, and the run finishes."""
    kube.apply("restock", agentrun_spec(budget={"maxIterations": 1}))
    assert kube.drive("restock") == [0, 3]
    assert kube.status("restock")["stopReason"] == "max_iterations"
    assert kube.reconcile("restock") == REST
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"budget": {"maxIterations": 5}})
    assert kube.drive("restock") == [0]
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1


def test_a_run_failed_on_the_verifiers_limit_makes_no_pod_for_an_edit_that_keeps_the_limit(
    kube: Operator,
) -> None:
    """A run Failed on the verifier's limit stays at rest when its spec is edited without
    raising the limit (the step would neither use nor record the edit: before, the operator
    made a step pod after each such pod's end, one after another without end); raising the
    limit past the rejections then runs one more step, which finishes the run."""
    script = [{"actions": [ORDER], "verdict": "reject"}, {"done": True, "answer": "ordered"}]
    kube.apply("restock", agentrun_spec(script=script, budget={"maxVerifierRejections": 1}))
    assert kube.drive("restock") == [1]
    status = kube.status("restock")
    assert (status["phase"], status["stopReason"]) == ("Failed", "verifier_rejections")
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"goal": "Restock SKU A1 and B2"})
    assert kube.drive("restock") == []
    assert kube.pods() == ["restock-s1-a1"]
    status = kube.status("restock")
    # The edit is seen (the status answers its generation), and the run stays Failed.
    assert (status["phase"], status["observedGeneration"]) == ("Failed", 2)
    assert kube.condition("restock", "Stalled")["reason"] == "verifier_rejections"
    raised = {"budget": {"maxIterations": 5, "maxVerifierRejections": 2}}
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", raised)
    assert kube.drive("restock") == [0]
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1


def test_a_step_pod_gets_the_operators_settings(tmp_path: Path) -> None:
    """The pod is built from the operator's StepPodSettings (image, command, Secret) and the
    run's spec, and the spec the pod reads is recorded in the store before the pod exists."""
    pods = StepPodSettings(image="registry.example/keelgate:1", store_secret="tenant-store")
    kube = Operator(tmp_path, settings=ControllerSettings(pods=pods))
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        pod = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
        assert pod is not None
        container = pod["spec"]["containers"][0]
        assert container["image"] == "registry.example/keelgate:1"
        store = next(e for e in container["env"] if e["name"] == "KEELGATE_STORE")
        assert store["valueFrom"]["secretKeyRef"]["name"] == "tenant-store"
        specs = kube.stores.specs
        assert specs is not None
        recorded = specs.recorded_spec(NAMESPACE, "restock")
        assert recorded is not None and recorded.generation == 1
    finally:
        kube.close()


def test_a_late_result_is_told_once_in_a_warning_and_shown_in_status(kube: Operator) -> None:
    """A call of the run ended after someone else had settled its key (its process recorded
    that in the run's checkpoint): the operator shows it in status with a LateResult condition
    and tells it in one Warning Event, not again at the next look."""
    from keelgate.core.state import RunState
    from keelgate.core.types import LateResult

    kube.apply("restock", agentrun_spec())
    kube.drive("restock")
    checkpoint = kube.stores.checkpoints.load(NAMESPACE, "restock")
    assert checkpoint is not None
    state = RunState.from_json(checkpoint.state).but(seq=checkpoint.seq)
    late = LateResult("1:0", "place_order", "kg-x", "ok", "abandoned", "alice")
    kube.stores.checkpoints.save(
        NAMESPACE, "restock", state.seq + 1, state.with_late([late]).to_json()
    )
    kube.reconcile("restock")
    status = kube.status("restock")
    assert status["lateResults"][0]["settledBy"] == "alice"
    assert kube.condition("restock", "LateResult")["status"] == "True"
    told = [e for e in kube.api.events if e.reason == "LateResult"]
    assert [(e.type, e.message) for e in told] == [
        (
            "Warning",
            "place_order (1:0) ended ok after alice had settled it as abandoned; the settlement "
            "stands: check the system it changes",
        )
    ]
    kube.reconcile("restock")
    assert len([e for e in kube.api.events if e.reason == "LateResult"]) == 1


def test_a_traced_operator_hands_each_pod_its_span_and_sends_it_when_the_pod_ends(
    tmp_path: Path,
) -> None:
    """With tracing on, each step pod gets its own span (TRACEPARENT) in the run's trace, the
    run's span (TRACESTATE), the collector's settings and the step service name, and the
    headers only from a Secret; once the pod has ended the operator sends the pod's span under
    the run's, failed for a crash, plain for a clean end. The trace is named by the run's UID:
    a restarted operator names the same one."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from keelgate.adapters.tracing import configured
    from keelgate.core.tracing import TraceRef

    exporter = InMemorySpanExporter()
    tracer = configured(environ={}, exporter=exporter, export_each_span=True)
    pods = StepPodSettings(trace_env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318"})
    kube = Operator(tmp_path, settings=ControllerSettings(pods=pods), tracer=tracer)
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        first = kube.api.get("Pod", NAMESPACE, "restock-s1-a1")
        assert first is not None
        env = {e["name"]: e for e in first["spec"]["containers"][0]["env"]}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel:4318"
        assert env["OTEL_SERVICE_NAME"]["value"] == "keelgate-step"
        assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {
            "name": "keelgate-otel",
            "key": "headers",
            "optional": True,
        }
        ref = TraceRef.handed(env["TRACEPARENT"]["value"], env["TRACESTATE"]["value"])
        assert ref is not None
        pod_span = env["TRACEPARENT"]["value"].split("-")[2]
        kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 137)  # a crash
        kube.reconcile("restock")
        assert kube.drive("restock") == [0, 0]
    finally:
        kube.close()
        tracer.close()
    spans = {s.name: s for s in exporter.get_finished_spans() if s.name == "step 1 attempt 1"}
    crashed = [
        s
        for s in exporter.get_finished_spans()
        if s.context is not None and f"{s.context.span_id:016x}" == pod_span
    ]
    assert spans and len(crashed) == 1
    (span,) = crashed
    assert f"{span.context.trace_id:032x}" == ref.trace_id  # type: ignore[union-attr]
    assert span.parent is not None and f"{span.parent.span_id:016x}" == ref.span_id
    assert span.status.status_code.name == "ERROR"
    assert dict(span.attributes or {})["k8s.pod.name"] == "restock-s1-a1"
    steps = [s for s in exporter.get_finished_spans() if s.name.startswith("step ")]
    assert [s.status.status_code.name for s in steps] == ["ERROR", "UNSET", "UNSET"]
    assert {f"{s.context.trace_id:032x}" for s in steps} == {ref.trace_id}  # type: ignore[union-attr]


def test_a_step_pod_the_server_refuses_is_told_then_stalls_the_run_and_clears_when_allowed(
    kube: Operator,
) -> None:
    """The API server refuses the step pod (a ResourceQuota of zero pods): one Warning
    FailedCreate with the server's words, tries again after 5, 10, 20 s, and from the third
    refusal the run shows Stalled=True (PodCreateRefused) with that message; no second Warning
    for the same refusal. Once the quota is lifted the pod is created, and the run is no longer
    stalled."""
    said = (
        'pods "restock-s1-a1" is forbidden: exceeded quota: zero, requested: pods=1, '
        "used: pods=0, limited: pods=0"
    )
    kube.api.refuse_always["create_pod"] = ApiFailure(
        f"create Pod shop/restock-s1-a1: 403 Forbidden: {said}", status=403, detail=said
    )
    kube.apply("restock", agentrun_spec())
    waits = [kube.reconcile("restock") for _ in range(3)]
    assert waits == [Requeue(5.0), Requeue(10.0), Requeue(20.0)]
    assert kube.pods() == []
    warnings = [e for e in kube.api.events if e.reason == "FailedCreate"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert said in warnings[0].message and "step 1 attempt 1" in warnings[0].message
    stalled = kube.condition("restock", "Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "PodCreateRefused"
    assert "exceeded quota" in stalled["message"]
    del kube.api.refuse_always["create_pod"]
    assert kube.reconcile("restock") == REST
    assert kube.pods() == ["restock-s1-a1"]
    assert [e.reason for e in kube.api.events].count("Created") == 1
    kube.reconcile("restock")  # the pod's watch event
    assert kube.condition("restock", "Stalled")["status"] == "False"
    assert len([e for e in kube.api.events if e.reason == "FailedCreate"]) == 1


def test_a_step_pod_refused_for_days_is_still_tried_every_five_minutes(kube: Operator) -> None:
    """A quota that refuses the step pod for days: after the back-off reached 5 minutes, each
    try asks for the next in 5 minutes, also past the 1,025th refusal (about 85 hours), where
    the doubling once overflowed a float and every look at the run ended in an error."""
    said = "exceeded quota: zero"
    kube.api.refuse_always["create_pod"] = ApiFailure(
        f"create Pod shop/restock-s1-a1: 403 Forbidden: {said}", status=403, detail=said
    )
    kube.apply("restock", agentrun_spec())
    waits = [kube.reconcile("restock") for _ in range(1100)]
    assert waits[:7] == [Requeue(w) for w in (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)]
    assert set(waits[7:]) == {Requeue(300.0)}
    assert kube.pods() == []


def test_a_server_that_does_not_answer_a_pod_create_is_retried_without_a_stall(
    kube: Operator,
) -> None:
    """A create the server did not answer (503, a timeout) is no refusal: the reconcile fails
    and the worker's back-off retries it, with no FailedCreate Event and no Stalled."""
    kube.api.refuse_next["create_pod"] = ApiFailure(
        "create Pod shop/restock-s1-a1: 503 Service Unavailable", status=503
    )
    kube.apply("restock", agentrun_spec())
    with pytest.raises(ApiFailure):
        kube.reconcile("restock")
    assert not [e for e in kube.api.events if e.reason == "FailedCreate"]
    assert kube.reconcile("restock") == REST
    assert kube.pods() == ["restock-s1-a1"]
    assert kube.condition("restock", "Stalled")["status"] == "False"


def _kept(kube: Operator) -> list[str]:
    """The step pods not being deleted."""
    return [
        pod["metadata"]["name"]
        for pod in kube.api.of_kind("Pod")
        if not pod["metadata"].get("deletionTimestamp")
    ]


def test_finished_step_pods_beyond_the_newest_few_are_deleted(tmp_path: Path) -> None:
    """keepFinishedPods: 1 (the platform's): once a later step's pod has finished, an earlier
    one is deleted; the last pod stays for `kubectl logs`, and its end stays in status. A run's
    own spec.step.keepFinishedPods keeps more."""
    defaults = StepPodDefaults(keep_finished_pods=1)
    kube = Operator(tmp_path, settings=ControllerSettings(pods=StepPodSettings(defaults=defaults)))
    try:
        kube.apply("restock", agentrun_spec())
        assert kube.drive("restock") == [0, 0]
        kube.reconcile("restock")
        assert _kept(kube) == ["restock-s2-a1"]
        assert kube.api.writes.count("delete Pod restock-s1-a1") == 1
        assert kube.status("restock")["step"]["lastExit"] == "exit code 0 (Completed)"
        assert len(operator_tools.ORDERS) == 1

        kube.apply("keeper", {**agentrun_spec(), "step": {"keepFinishedPods": 5}})
        assert kube.drive("keeper") == [0, 0]
        kube.reconcile("keeper")
        assert sorted(n for n in _kept(kube) if n.startswith("keeper")) == [
            "keeper-s1-a1",
            "keeper-s2-a1",
        ]
    finally:
        kube.close()


def test_a_crashed_attempts_pod_is_collected_but_its_last_lines_stay_in_status(
    tmp_path: Path,
) -> None:
    """A step attempt that died: its pod goes once a later attempt has finished (keep 1), and
    what it wrote last (its termination message) stays in status.step.lastLines until the next
    end replaces it; the pod the status names is never deleted, even while it runs."""
    defaults = StepPodDefaults(keep_finished_pods=1)
    kube = Operator(tmp_path, settings=ControllerSettings(pods=StepPodSettings(defaults=defaults)))
    try:
        kube.apply("restock", agentrun_spec())
        kube.reconcile("restock")
        kube.api.start_pod(NAMESPACE, "restock-s1-a1")
        kube.api.finish_pod(NAMESPACE, "restock-s1-a1", 137, message="planning\nkilled here\n")
        kube.reconcile("restock")
        step = kube.status("restock")["step"]
        assert step["pod"] == "restock-s1-a2"
        assert step["lastLines"] == "planning\nkilled here"
        kube.reconcile("restock")
        assert "restock-s1-a1" in _kept(kube)  # the only finished pod: kept
        assert kube.drive("restock") == [0, 0]
        kube.reconcile("restock")
        assert _kept(kube) == ["restock-s2-a1"]
        assert kube.status("restock")["step"]["lastLines"] == ""
    finally:
        kube.close()


def _undeclare(kube: Operator, name: str, tool: str) -> None:
    """A person edits the spec so that the script still names ``tool``, which spec.tools no
    longer declares: the models refuse the spec, and no step may run until it changes."""
    other = {"name": "look", "sideEffect": "READ", "python": {"callable": f"{TOOLS}:{tool}"}}
    kube.api.patch_spec("AgentRun", NAMESPACE, name, {"tools": [other]})


def test_an_unknown_outcome_stays_shown_when_the_spec_no_longer_declares_its_tool(
    kube: Operator,
) -> None:
    """A run stopped outcome_unknown is edited so that its script names a tool the spec no
    longer declares: the run is Stalled saying so, and OutcomeUnknown stays True naming the
    action and its Reconciliation (never "NoUnknownOutcome"); once alice settles it,
    OutcomeUnknown clears while the stall stays, and the spec put right finishes the run with
    the one order."""
    kube.apply("restock", agentrun_spec(tool="lost_write"))
    assert kube.drive("restock") == [3]
    _undeclare(kube, "restock", "lost_write")
    kube.reconcile("restock")
    status = kube.status("restock")
    stalled = kube.condition("restock", "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "SpecInvalid")
    assert "tool 'lost_write' is not declared" in stalled["message"]
    unknown = kube.condition("restock", "OutcomeUnknown")
    assert unknown["status"] == "True", unknown
    assert unknown["message"] == f"lost_write (1:0): see reconciliation {LOST}"
    assert [u["action"] for u in status["unknownActions"]] == ["1:0"]
    assert (status["phase"], status["stopReason"]) == ("Stopped", "outcome_unknown")
    rec = LOST
    kube.api.patch_spec("Reconciliation", NAMESPACE, rec, {"executed": True, "by": "alice"})
    assert kube.reconcile(rec, kind="Reconciliation") == REST
    kube.reconcile("restock")
    assert kube.condition("restock", "OutcomeUnknown")["status"] == "False"
    assert kube.condition("restock", "Stalled")["status"] == "True"
    assert kube.pods() == ["restock-s1-a1"]  # no step since: the spec still refuses
    put_right = {"tools": agentrun_spec(tool="lost_write")["tools"]}
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", put_right)
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded", kube.status("restock")
    assert len(operator_tools.ORDERS) == 1


def test_a_write_killed_mid_order_and_an_unloadable_spec_still_asks_for_its_settlement(
    kube: Operator,
) -> None:
    """The step pod dies right after the shop took the order (no stop recorded: only the store
    knows the key is unknown), and the spec is edited so the script names a tool it no longer
    declares, before any step could record the stop. The operator still shows OutcomeUnknown
    True beside Stalled, makes the action's Reconciliation and warns; alice settles it there,
    and the put-right spec finishes the run with the one order, never placed again."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    assert kube.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    assert len(operator_tools.ORDERS) == 1
    _undeclare(kube, "restock", "place_order")
    kube.reconcile("restock")
    assert kube.condition("restock", "Stalled")["status"] == "True"
    unknown = kube.condition("restock", "OutcomeUnknown")
    rec = PLACE
    assert unknown["status"] == "True", kube.status("restock")
    assert unknown["message"] == f"place_order (1:0): see reconciliation {rec}"
    assert kube.api.get("Reconciliation", NAMESPACE, rec) is not None
    assert any(e.reason == "OutcomeUnknown" and rec in e.message for e in kube.api.events)
    kube.api.patch_spec("Reconciliation", NAMESPACE, rec, {"executed": True, "by": "alice"})
    assert kube.reconcile(rec, kind="Reconciliation") == REST
    kube.reconcile("restock")
    assert kube.condition("restock", "OutcomeUnknown")["status"] == "False"
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"tools": agentrun_spec()["tools"]})
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded", kube.status("restock")
    assert len(operator_tools.ORDERS) == 1


def test_a_suspended_run_killed_mid_order_still_shows_its_unknown_outcome(kube: Operator) -> None:
    """Killed mid-order and then suspended: no step runs to record the stop, yet the run shows
    OutcomeUnknown True with the action's Reconciliation, whatever spec.suspend holds back."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    assert kube.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"suspend": True})
    kube.reconcile("restock")
    assert kube.condition("restock", "OutcomeUnknown")["status"] == "True", kube.status("restock")
    assert kube.api.get("Reconciliation", NAMESPACE, PLACE) is not None


def test_an_order_planned_twice_and_killed_mid_call_is_asked_for_once(kube: Operator) -> None:
    """The model plans the same order twice (one key for both); the step pod dies right after
    the shop took the first, and the run is suspended before any step records the stop. The
    operator asks for one Reconciliation, of the call that was made (1:0), never of its repeat
    (1:1, never called: a second object would ask alice again and show her decision as made
    on it, while the chain records it once, on 1:0). Once she settles it the run finishes:
    the repeat is answered from her decision, the order placed once, and the chain holds her
    one decision, on the action she settled."""
    kube.apply("restock", agentrun_spec(script=TWICE))
    kube.reconcile("restock")
    assert kube.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"suspend": True})
    kube.reconcile("restock")
    asked = [b["spec"]["action"] for b in kube.api.of_kind("Reconciliation")]
    assert asked == ["1:0"]
    assert [u["action"] for u in kube.status("restock")["unknownActions"]] == ["1:0"]
    kube.api.patch_spec("Reconciliation", NAMESPACE, PLACE, {"executed": True, "by": "alice"})
    assert kube.reconcile(PLACE, kind="Reconciliation") == REST
    kube.api.patch_spec("AgentRun", NAMESPACE, "restock", {"suspend": False})
    kube.drive("restock")
    assert kube.status("restock")["phase"] == "Succeeded", kube.status("restock")
    assert len(operator_tools.ORDERS) == 1
    assert [b["spec"]["action"] for b in kube.api.of_kind("Reconciliation")] == ["1:0"]
    events = kube.stores.audit.events(NAMESPACE, "restock")
    settled = [(e.actor, e.data["action"]) for e in events if e.type == "loop.reconciled"]
    assert settled == [("alice", "1:0")]
    repeat = next(
        e for e in events if e.type == "loop.action_completed" and e.data["action"] == "1:1"
    )
    assert (repeat.data["status"], repeat.data["replayed"]) == ("ok", True)


def test_an_order_planned_twice_settled_by_the_confirmer_is_shown_once(tmp_path: Path) -> None:
    """The same order planned twice, the step pod killed right after the shop took the first;
    the next attempt's confirmer settles it. The operator shows that decision as one Settled
    Reconciliation, of the call that was made (1:0), none of its repeat, never called; the
    order is placed once."""
    pods = StepPodSettings(confirmer="support.operator_tools:OrderBook")
    kube = Operator(tmp_path, settings=ControllerSettings(pods=pods))
    try:
        kube.apply("restock", agentrun_spec(script=TWICE))
        kube.reconcile("restock")
        assert kube.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
        assert kube.drive("restock") == [0, 0]
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
        shown = [
            (b["spec"]["action"], b["status"]["phase"], b["status"]["source"])
            for b in kube.api.of_kind("Reconciliation")
        ]
        assert shown == [("1:0", "Settled", "confirmer")]
    finally:
        kube.close()
