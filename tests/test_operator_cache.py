"""The operator's view of the cluster (``keelgate.kube.runtime.cache``) and what its resync looks
at again.

What a user would notice if these broke: a stale watch event undoing a newer status, a step pod
deleted mid-run never seen as ended, the step-pod cap counting the wrong pods (more pods than
``--max-step-pods``, or a run waiting for a slot that is free), or a run that waits for a
person's settlement never picked up again by the resync. The cache keeps the bodies it is given
and hands out copies; these tests hold it to that with plain bodies as the API server sends them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from keelgate.kube.runtime.cache import GONE_FOR, Cache, copy_json, is_active_step_pod, slim_copy
from keelgate.kube.runtime.resync import WaitingRuns, due_for_resync

JSON = dict[str, Any]


def pod(name: str, *, version: int, phase: str = "Running", step: bool = True) -> JSON:
    labels = {"keelgate.dev/run": "r1"}
    if step:
        labels["app.kubernetes.io/name"] = "keelgate-step"
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "resourceVersion": str(version),
            "labels": labels,
        },
        "status": {"phase": phase},
    }


def run(name: str, *, phase: str, generation: int = 1, observed: int = 1, **meta: Any) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "shop", "generation": generation, **meta},
        "status": {"phase": phase, "observedGeneration": observed},
    }


def test_an_older_version_never_replaces_a_newer_one() -> None:
    """A watch event that arrives late (an older resourceVersion than the status patch the
    operator just made) leaves the newer body in place."""
    cache = Cache()
    cache.put("Pod", pod("p", version=7, phase="Succeeded"))
    cache.put("Pod", pod("p", version=5, phase="Running"))
    found = cache.get("Pod", "shop", "p")
    assert found is not None and found["status"]["phase"] == "Succeeded"
    cache.put("Pod", pod("p", version=8, phase="Failed"))
    found = cache.get("Pod", "shop", "p")
    assert found is not None and found["status"]["phase"] == "Failed"


def test_the_observer_is_told_a_body_only_when_it_changed_what_the_cache_held() -> None:
    """The watch's echo of the operator's own status patch (the same resourceVersion, the same
    body, told a second time) tells the notifier nothing: it would only derive the same
    notifications again. A changed body is told, with a new resourceVersion or without one; so is
    each deletion, and a body taken in again after it."""
    told: list[tuple[str, bool]] = []
    cache = Cache(
        observer=lambda _, body, deleted: told.append((str(body["status"]["phase"]), deleted))
    )
    cache.put("AgentRun", run("r", phase="Stopped", resourceVersion="7", uid="u"))
    assert told == [("Stopped", False)]
    # The echo: the same body, with what the cache drops anyway; and a copy of what it holds.
    echo = run("r", phase="Stopped", resourceVersion="7", uid="u", managedFields=[{"f": 1}])
    cache.put("AgentRun", echo)
    held = cache.get("AgentRun", "shop", "r")
    assert held is not None
    cache.put("AgentRun", held)
    assert told == [("Stopped", False)]
    cache.put("AgentRun", run("r", phase="Succeeded", resourceVersion="8", uid="u"))
    cache.put("AgentRun", run("r", phase="Failed", uid="u"))  # no version: compared
    cache.put("AgentRun", run("r", phase="Failed", uid="u"))
    assert told[1:] == [("Succeeded", False), ("Failed", False)]
    cache.drop("AgentRun", run("r", phase="Failed", uid="u"))
    cache.put("AgentRun", run("r", phase="Pending", resourceVersion="9", uid="u2"))
    assert told[3:] == [("Failed", True), ("Pending", False)]


def test_the_cache_keeps_no_field_manager_records_nor_kubectls_last_applied_copy() -> None:
    """What the operator never reads (managedFields, kubectl's last-applied annotation: often
    more than half of a body) is not kept, so thousands of runs cost less memory; every other
    annotation (the failpoints one) stays."""
    cache = Cache()
    body = run("r", phase="Running")
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": '{"spec": "a big copy"}',
        "keelgate.dev/failpoints": "after_plan@1",
    }
    cache.put("AgentRun", body)
    kept = cache.get("AgentRun", "shop", "r")
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"keelgate.dev/failpoints": "after_plan@1"}


def test_a_watch_events_object_is_copied_slim_and_left_as_it_came() -> None:
    """The copy the operator takes of each watch event's object (``slim_copy``) has neither the
    field managers' records nor kubectl's last-applied copy, and the event's own object keeps
    both: kopf may still hold it, and nothing it was handed is changed."""
    body = run("r", phase="Running")
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": '{"spec": "a big copy"}',
        "keelgate.dev/failpoints": "after_plan@1",
    }
    before = copy.deepcopy(body)
    slim = slim_copy(body)
    assert body == before
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["annotations"] == {"keelgate.dev/failpoints": "after_plan@1"}
    slim["status"]["phase"] = "Failed"  # a deep copy: the event's object does not change
    assert body["status"]["phase"] == "Running"
    assert {**slim, "status": body["status"], "metadata": body["metadata"]} == body


def test_an_approval_keeps_only_when_it_was_written_of_its_field_managers_records() -> None:
    """An Approval's field managers' records keep who wrote it other than its status, and when
    (a decision in it was made no later: what the operator reads), without the field sets; in
    the cache and in a watch event's slim copy alike, the event's own object unchanged."""
    body: dict[str, object] = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {
            "namespace": "shop",
            "name": "a",
            "resourceVersion": "7",
            "managedFields": [
                {"manager": "kubectl-patch", "operation": "Update", "time": "2026-12-06T10:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:decisions": {}}}},
                {"manager": "keelgate", "operation": "Update", "subresource": "status",
                 "time": "2026-12-06T10:00:05Z", "fieldsV1": {"f:status": {}}},
            ],
        },
        "spec": {"decisions": []},
    }  # fmt: skip
    wanted = [{"manager": "kubectl-patch", "operation": "Update", "time": "2026-12-06T10:00:00Z"}]
    before = copy.deepcopy(body)
    assert slim_copy(body)["metadata"]["managedFields"] == wanted
    assert body == before
    cache = Cache()
    cache.put("Approval", body)
    kept = cache.get("Approval", "shop", "a")
    assert kept is not None and kept["metadata"]["managedFields"] == wanted


def test_what_a_reconcile_reads_is_its_own_copy() -> None:
    """A reconcile may change the body it read; the cache (and the next reconcile) does not see
    the change."""
    cache = Cache()
    cache.put("AgentRun", run("r1", phase="Running"))
    read = cache.get("AgentRun", "shop", "r1")
    assert read is not None
    read["status"]["phase"] = "Mangled"
    read["metadata"]["labels"] = {"x": "y"}
    (selected,) = cache.select("AgentRun")
    selected["status"].clear()
    again = cache.get("AgentRun", "shop", "r1")
    assert again == run("r1", phase="Running")


def test_a_deleted_pod_leaves_its_last_body_until_a_new_pod_of_that_name_appears() -> None:
    """A step pod deleted mid-run is still seen (its tombstone, with its last known body), and a
    new pod of the same name clears it."""
    cache = Cache()
    cache.put("Pod", pod("p", version=3, phase="Running"))
    cache.drop("Pod", pod("p", version=4, phase="Running"))
    assert cache.get("Pod", "shop", "p") is None
    gone = cache.tombstone("shop", "p")
    assert gone is not None and gone["metadata"]["resourceVersion"] == "3"
    cache.put("Pod", pod("p", version=9, phase="Pending"))
    assert cache.tombstone("shop", "p") is None
    cache.forget_tombstone("shop", "p")  # forgetting what is not there is harmless


def test_a_deleted_approval_leaves_its_last_body_with_every_decision_added_before_it_went() -> None:
    """An Approval's deletion, heard after a missed watch event (bob's deny), leaves the
    deletion's own body, the newer one, as its tombstone: the deny is in it. A fresh Approval
    of the same name does not clear it (its decisions are another object's), and a pod's
    tombstone of the same name is another one."""
    cache = Cache()

    def approval(version: int, uid: str, *decisions: JSON) -> JSON:
        meta = {"name": "a", "namespace": "shop", "uid": uid, "resourceVersion": str(version)}
        return {"metadata": meta, "spec": {"decisions": list(decisions)}}

    deny = {"by": "bob", "approved": False}
    cache.put("Approval", approval(3, "u1"))
    cache.drop("Approval", approval(5, "u1", deny))
    cache.put("Approval", approval(9, "u2"))
    gone = cache.tombstone("shop", "a", kind="Approval")
    assert gone is not None and gone["spec"]["decisions"] == [deny]
    assert cache.tombstone("shop", "a") is None  # no pod of that name went
    cache.forget_tombstone("shop", "a", kind="Approval")
    assert cache.tombstone("shop", "a", kind="Approval") is None
    assert cache.get("Approval", "shop", "a") is not None  # the fresh one stays


def test_a_tombstone_nobody_takes_is_dropped_after_a_while() -> None:
    """A deleted pod's tombstone that no reconcile took (its run deleted with it, an old step's
    pod collected) is dropped after GONE_FOR seconds, as a restart would drop it: an operator
    that sees thousands of pods go keeps no more than the last few minutes' worth."""
    now = [1000.0]
    cache = Cache(clock=lambda: now[0])
    for n in range(50):
        cache.drop("Pod", pod(f"old-{n}", version=n + 1))
    assert cache.tombstone("shop", "old-0") is not None
    now[0] += GONE_FOR + 1
    cache.drop("Pod", pod("new", version=100))
    assert [cache.tombstone("shop", f"old-{n}") for n in range(50)] == [None] * 50
    assert cache.tombstone("shop", "new") is not None


def test_a_late_api_response_does_not_bring_a_deleted_pod_back() -> None:
    """An API response read before a pod's deletion and arriving after the watch reported it
    (a running step pod, by its uid) is not taken for the pod: it holds no step slot. A new pod
    of the same name (another uid) is seen at once; after ``GONE_FOR`` the deletion is
    forgotten, so the memory stays flat."""
    now = [1000.0]
    cache = Cache(clock=lambda: now[0])

    def with_uid(body: JSON, uid: str) -> JSON:
        body["metadata"]["uid"] = uid
        return body

    cache.put("Pod", with_uid(pod("p", version=3), "u1"))
    assert cache.active_step_pods() == 1
    cache.drop("Pod", with_uid(pod("p", version=5), "u1"))
    cache.put("Pod", with_uid(pod("p", version=3), "u1"))  # the late response
    assert cache.get("Pod", "shop", "p") is None
    assert cache.active_step_pods() == 0
    gone = cache.tombstone("shop", "p")
    assert gone is not None and gone["metadata"]["resourceVersion"] == "3"
    cache.put("Pod", with_uid(pod("p", version=9, phase="Pending"), "u2"))  # the next attempt
    assert cache.active_step_pods() == 1 and cache.tombstone("shop", "p") is None
    cache.drop("Pod", with_uid(pod("p", version=10), "u2"))  # that one is deleted too
    cache.put("Pod", with_uid(pod("p", version=3), "u1"))  # the first one's, later still
    assert cache.get("Pod", "shop", "p") is None and cache.active_step_pods() == 0
    cache.put("Pod", with_uid(pod("p", version=12, phase="Pending"), "u3"))
    assert cache.active_step_pods() == 1
    # Without uids (bodies from elsewhere), the deletion's version decides.
    cache.put("Pod", pod("q", version=4))
    cache.drop("Pod", pod("q", version=6))
    cache.put("Pod", pod("q", version=6))
    assert cache.get("Pod", "shop", "q") is None
    cache.put("Pod", pod("q", version=7))
    assert cache.get("Pod", "shop", "q") is not None
    # A deletion is remembered for GONE_FOR seconds, then forgotten as the next one is seen.
    cache.drop("Pod", with_uid(pod("p", version=13), "u3"))
    now[0] += GONE_FOR + 1
    cache.drop("Pod", pod("q", version=8))
    cache.put("Pod", with_uid(pod("p", version=12), "u3"))
    assert cache.get("Pod", "shop", "p") is not None


def test_a_pod_deleted_unseen_is_forgotten_as_deleted_and_frees_its_slot() -> None:
    """A running step pod the API server no longer has, though no watch reported its deletion,
    is dropped as deleted: its step slot is free and its last body is its tombstone (so its run
    sees an attempt that ended without recording a stop). Nothing changes if the watch got
    there first, or if a new pod of that name (another uid) is what the cache holds."""
    cache = Cache()
    running = pod("p", version=3)
    running["metadata"]["uid"] = "u1"
    cache.put("Pod", running)
    assert cache.active_step_pods() == 1
    assert cache.forget_vanished("Pod", "shop", "p", "u2") is None  # not the pod it holds
    assert cache.active_step_pods() == 1
    last = cache.forget_vanished("Pod", "shop", "p", "u1")
    assert last is not None and last["status"]["phase"] == "Running"
    assert cache.get("Pod", "shop", "p") is None and cache.active_step_pods() == 0
    gone = cache.tombstone("shop", "p")
    assert gone is not None and gone["metadata"]["uid"] == "u1"
    assert cache.forget_vanished("Pod", "shop", "p", "u1") is None  # once only
    cache.forget_tombstone("shop", "p")  # its run took it: the attempt is accounted for
    cache.drop("Pod", copy_json(running))  # the watch's own word of the deletion, late
    assert cache.tombstone("shop", "p") is None  # is not taken for another end
    cache.put("Pod", copy_json(running))  # a late view of it does not bring it back
    assert cache.get("Pod", "shop", "p") is None

    other = pod("q", version=4)
    other["metadata"]["uid"] = "u3"
    cache.put("Pod", other)
    cache.drop("Pod", pod("q", version=6, phase="Failed") | {"metadata": other["metadata"]})
    left = cache.tombstone("shop", "q")  # what the watch's deletion left
    assert cache.forget_vanished("Pod", "shop", "q", "u3") is None
    assert cache.tombstone("shop", "q") == left


def test_the_step_pod_cap_counts_only_running_step_pods() -> None:
    """The cap counts step pods that have not ended; ended step pods, other pods and objects of
    other kinds with the same name are not counted."""
    cache = Cache()
    cache.put("Pod", pod("a", version=1, phase="Running"))
    cache.put("Pod", pod("b", version=1, phase="Pending"))
    cache.put("Pod", pod("c", version=1, phase="Succeeded"))
    cache.put("Pod", pod("d", version=1, phase="Failed"))
    cache.put("Pod", pod("e", version=1, phase="Running", step=False))
    cache.put("AgentRun", {**pod("a", version=1), "kind": "AgentRun"})
    assert cache.active_step_pods() == 2 == cache.count("Pod", is_active_step_pod)
    assert len(cache.step_pods("shop", "r1")) == 5
    assert cache.step_pods("elsewhere", "r1") == []

    cache.put("Pod", pod("a", version=2, phase="Succeeded"))  # a step ended: its slot is free
    cache.put("Pod", pod("a", version=1, phase="Running"))  # a late event changes nothing
    assert cache.active_step_pods() == 1
    cache.drop("Pod", pod("b", version=2, phase="Pending"))  # deleted before it ran
    assert cache.active_step_pods() == 0
    cache.put("Pod", pod("b", version=3, phase="Pending"))  # the next attempt, same name
    cache.drop("Pod", pod("c", version=2, phase="Succeeded"))
    assert cache.active_step_pods() == 1 == cache.count("Pod", is_active_step_pod)


def test_runs_are_tallied_by_phase_without_touching_them() -> None:
    """The gauges' tally sees every run once, by phase."""
    cache = Cache()
    for number, phase in enumerate(["Running", "Running", "Succeeded", "Stopped"]):
        cache.put("AgentRun", run(f"r{number}", phase=phase))
    tally = cache.tally("AgentRun", lambda body: body["status"]["phase"])
    assert tally == {"Running": 2, "Succeeded": 1, "Stopped": 1}
    assert cache.tally("Approval", lambda body: "x") == {}


def test_the_resync_skips_only_what_an_edit_alone_can_change() -> None:
    """The periodic resync looks again at every run that may still move (running, stopped for a
    person, failed, not yet observed at its current generation, being deleted) and every
    unsettled Reconciliation; a finished run and a settled Reconciliation it leaves alone."""
    cache = Cache()
    cache.put("AgentRun", run("running", phase="Running"))
    cache.put("AgentRun", run("stopped", phase="Stopped"))
    cache.put("AgentRun", run("failed", phase="Failed"))
    cache.put("AgentRun", run("done", phase="Succeeded"))
    cache.put("AgentRun", run("edited", phase="Succeeded", generation=2, observed=1))
    cache.put(
        "AgentRun", run("leaving", phase="Succeeded", deletionTimestamp="2026-12-03T12:00:00Z")
    )
    cache.put("AgentRun", {"metadata": {"name": "new", "namespace": "shop", "generation": 1}})
    for name, phase in (("open", ""), ("closed", "Settled")):
        body: JSON = {"metadata": {"name": name, "namespace": "shop"}}
        if phase:
            body["status"] = {"phase": phase}
        cache.put("Reconciliation", body)
    due = {(kind, name) for kind, _, name in due_for_resync(cache)}
    assert due == {
        ("AgentRun", "running"),
        ("AgentRun", "stopped"),
        ("AgentRun", "failed"),
        ("AgentRun", "edited"),
        ("AgentRun", "leaving"),
        ("AgentRun", "new"),
        ("Reconciliation", "open"),
    }


def test_runs_waiting_for_a_person_are_looked_at_again_only_when_the_store_moved() -> None:
    """With a store that tells revisions, the resync queues every run under way, but a run at
    rest (waiting for a person) and its unsettled Reconciliation only the first time, and again
    once its checkpoint or audit chain moved (a decision made with ``keelgate reconcile``): one
    read of the store per resync, however many runs wait. A store that cannot answer makes
    the resync queue them all, as before."""
    cache = Cache()
    cache.put("AgentRun", run("running", phase="Running"))
    for n in range(500):
        cache.put("AgentRun", run(f"waiting-{n}", phase="Stopped"))
    cache.put(
        "Reconciliation",
        {
            "metadata": {"name": "waiting-7-x", "namespace": "shop"},
            "spec": {"runName": "waiting-7"},
        },
    )
    store = {("shop", f"waiting-{n}"): (3, 10) for n in range(500)}
    asked: list[int] = []

    def revisions(runs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
        asked.append(len(runs))
        return {run: store[run] for run in runs if run in store}

    waiting = WaitingRuns(revisions)
    first = {name for _, _, name in waiting.due(cache)}
    assert len(first) == 502 and asked == [500]
    assert {name for _, _, name in waiting.due(cache)} == {"running"}
    store[("shop", "waiting-7")] = (3, 11)  # alice settled its WRITE in the store
    assert {name for _, _, name in waiting.due(cache)} == {"running", "waiting-7", "waiting-7-x"}
    assert asked == [500, 500, 500]

    def away(runs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
        raise OSError("connection refused")

    assert len(WaitingRuns(away).due(cache)) == 502


def test_a_copy_of_a_body_holding_an_integer_beyond_64_bits_is_still_exact() -> None:
    """A user's spec may hold any JSON number; the fast copy falls back rather than fail, and
    the copy is equal and independent."""
    body: JSON = {"spec": {"huge": 2**70, "list": [1, {"a": 1.5}]}, "metadata": {"name": "x"}}
    copied = copy_json(body)
    assert copied == body
    copied["spec"]["list"][1]["a"] = 0
    assert body["spec"]["list"][1]["a"] == 1.5
    plain = copy_json({"a": [1, 2.25, None, True, "é"]})
    assert plain == {"a": [1, 2.25, None, True, "é"]}


def test_the_oldest_waiting_decision_is_a_gauge_per_kind() -> None:
    """keelgate_decision_oldest_waiting_seconds: how long the oldest unsettled Reconciliation
    (and Approval) has waited, from its creation; settled ones do not count; 0 when none waits.
    The chart's alert 'a decision waits too long' reads it."""
    import time

    from keelgate.kube.runtime.health import refresh_gauges
    from keelgate.kube.runtime.metrics import Metrics

    cache = Cache()
    hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    minute_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    for name, created, phase in (
        ("old", hour_ago, "Settled"),
        ("waiting", minute_ago, "Pending"),
    ):
        cache.put(
            "Reconciliation",
            {
                "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created},
                "status": {"phase": phase},
            },
        )
    metrics = Metrics()
    refresh_gauges(metrics, cache)
    sample = metrics.registry.get_sample_value
    waited = sample("keelgate_decision_oldest_waiting_seconds", {"kind": "Reconciliation"})
    assert waited is not None and 55 <= waited <= 120
    assert sample("keelgate_decision_oldest_waiting_seconds", {"kind": "Approval"}) == 0.0


def labelled(name: str, run_label: str, *, version: int, phase: str = "Running") -> JSON:
    body = pod(name, version=version, phase=phase)
    body["metadata"]["labels"]["keelgate.dev/run"] = run_label
    body["metadata"]["uid"] = f"uid-{name}"
    return body


def test_a_runs_step_pods_are_its_own_through_every_change_and_deletion() -> None:
    """A reconcile asks for its run's pods at every look (finished ones to collect, active ones
    to stop on deletion); the cache answers from an index kept as pods come and go, so it must
    give exactly the run's pods after updates, a deletion seen by the watch, a deletion found by
    the resync, and never another run's or a pod of that name in another namespace."""
    cache = Cache()
    cache.put("Pod", labelled("a-s1-a1", "a", version=1, phase="Succeeded"))
    cache.put("Pod", labelled("a-s2-a1", "a", version=2))
    cache.put("Pod", labelled("b-s1-a1", "b", version=3))
    other = labelled("a-s9-a1", "a", version=4)
    other["metadata"]["namespace"] = "elsewhere"
    cache.put("Pod", other)

    def names(label: str, namespace: str = "shop") -> set[str]:
        return {p["metadata"]["name"] for p in cache.step_pods(namespace, label)}

    assert names("a") == {"a-s1-a1", "a-s2-a1"} and names("b") == {"b-s1-a1"}
    assert names("a", "elsewhere") == {"a-s9-a1"}
    cache.put("Pod", labelled("a-s2-a1", "a", version=5, phase="Succeeded"))
    assert [p["status"]["phase"] for p in cache.step_pods("shop", "a")] == ["Succeeded"] * 2
    cache.drop("Pod", labelled("a-s1-a1", "a", version=6))
    assert names("a") == {"a-s2-a1"}
    assert cache.forget_vanished("Pod", "shop", "b-s1-a1", "uid-b-s1-a1") is not None
    assert names("b") == set() and names("nobody") == set()
    copied = cache.step_pods("shop", "a")[0]
    copied["status"]["phase"] = "Running"  # a copy: the cache's own body is untouched
    assert cache.step_pods("shop", "a")[0]["status"]["phase"] == "Succeeded"


def test_a_run_whose_step_pod_runs_is_resynced_once_in_ten_rounds() -> None:
    """Thousands of runs under way each have a pod running; their pods' watch events bring every
    change, so each periodic resync looks at a tenth of them (by name), and every one of them
    within ten resyncs. A run whose pod ended, or that waits for a pod, is looked at in every
    resync as before."""
    cache = Cache()
    for n in range(200):
        body = run(f"r{n}", phase="Running")
        body["status"]["step"] = {"state": "Pending", "pod": f"r{n}-s1-a1"}
        cache.put("AgentRun", body)
        cache.put("Pod", labelled(f"r{n}-s1-a1", f"r{n}", version=n + 1))
    ended = run("ended", phase="Running")
    ended["status"]["step"] = {"state": "Pending", "pod": "ended-s1-a1"}
    cache.put("AgentRun", ended)
    cache.put("Pod", labelled("ended-s1-a1", "ended", version=900, phase="Succeeded"))
    cache.put("AgentRun", run("new", phase=""))
    seen: list[set[str]] = [
        {name for _, _, name in due_for_resync(cache, round_=r)} for r in range(10)
    ]
    for names in seen:
        assert {"ended", "new"} <= names
        assert 0 < len(names - {"ended", "new"}) < 60  # about a tenth of 200
    union = set().union(*seen)
    assert union == {f"r{n}" for n in range(200)} | {"ended", "new"}
    assert sum(len(names) for names in seen) == 200 + 2 * 10  # each running one once
    waiting = WaitingRuns(lambda runs: {})
    assert {name for _, _, name in waiting.due(cache, round_=3)} == seen[3]
