"""Operators that take runs in the store (issue 50, item 1): the operator's real controller over
the in-memory API server (one per cluster) and a real store shared by them (a SQLite file; one
test on a PostgreSQL server), the step pods the real ``keelgate step`` in this process
(tests/support/operator_rig.py).

What a user would notice if these broke: two operators (two clusters on one store, or a leader
and the one after it) both making step pods for a run; a run held by another operator shown as
running here, or with no word of who holds it; a step pod fenced off read as a crash and tried
again; a WRITE left in flight by an operator that lost its lease sent a second time, instead of
an unknown outcome a person settles; runs of a dead leader never taken over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.kube_api import FakeApiServer
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.naming import action_object_name
from keelgate.stores import open_stores
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

pytestmark = pytest.mark.usefixtures("orders")

#: A lease short enough to lapse within a test: what an operator paused (or dead) longer than
#: its lease looks like to the others. Where a step runs before the lease is to be seen live,
#: the lease is LONG (a loaded machine runs a step in seconds), and the test waits it out.
SHORT = 2.0
LONG = 6.0


def _operator(
    folder: Path, holder: str, *, lease: float = 30.0, api: FakeApiServer | None = None, **kw: Any
) -> Operator:
    settings = ControllerSettings(holder=holder, run_lease=lease, busy_retry=0.0)
    return Operator(folder, settings=settings, api=api, **kw)


@pytest.fixture
def two_clusters(tmp_path: Path) -> Iterator[tuple[Operator, Operator]]:
    """Two clusters' operators ("op-a" with a short lease, "op-b") on one SQLite store."""
    a = _operator(tmp_path, "op-a", lease=SHORT)
    b = _operator(tmp_path, "op-b")
    yield a, b
    a.close()
    b.close()


def _holder(kube: Operator, run: str) -> tuple[str, int, float] | None:
    stores = open_stores(kube.store_url)
    try:
        held = stores.checkpoints.holder_of(NAMESPACE, run)  # type: ignore[attr-defined]
    finally:
        stores.close()
    return None if held is None else (held.holder, held.epoch, held.lease_left)


def _wait_out(kube: Operator, run: str) -> None:
    """Sleep until the run's lease has lapsed on the store's clock (its holder renews nothing)."""
    held = _holder(kube, run)
    assert held is not None
    time.sleep(max(0.0, held[2]) + 0.2)


def _env(kube: Operator, pod: str) -> dict[str, str]:
    body = kube.api.get("Pod", NAMESPACE, pod)
    assert body is not None, pod
    return {e["name"]: e.get("value", "") for e in body["spec"]["containers"][0]["env"]}


def test_an_operator_takes_the_run_hands_its_pods_the_epoch_and_lets_go_at_the_end(
    tmp_path: Path,
) -> None:
    """The run is taken (holder: the operator's identity, epoch 1) before its first step pod;
    each pod carries KEELGATE_EPOCH=1, so the step writes under it; the run finishes with its
    one WRITE, and its lease ends at once (nobody need wait for it)."""
    kube = _operator(tmp_path, "op-a")
    try:
        kube.apply("restock", agentrun_spec())
        assert _holder(kube, "restock") is None
        kube.reconcile("restock")
        held = _holder(kube, "restock")
        assert held is not None and held[:2] == ("op-a", 1) and held[2] > 25
        assert _env(kube, "restock-s1-a1")["KEELGATE_EPOCH"] == "1"
        assert kube.drive("restock") == [0, 0]
        assert _env(kube, "restock-s2-a1")["KEELGATE_EPOCH"] == "1"
        assert kube.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
        done = _holder(kube, "restock")
        assert done is not None and done[:2] == ("op-a", 1) and done[2] <= 0.0
        assert kube.controller.holding.held() == []
    finally:
        kube.close()


def test_two_operators_racing_for_runs_make_pods_for_each_in_one_cluster_only(
    tmp_path: Path,
) -> None:
    """Two clusters' operators reconcile the same runs at the same moment (threads released
    together): each run is taken by one, which alone makes its step pod; the other makes none
    and its status says who holds the run (Reconciling, reason HeldElsewhere). Driven to the
    end, every run's WRITE is done once; the loser then sees the run finished."""
    a, b = _operator(tmp_path, "op-a"), _operator(tmp_path, "op-b")
    runs = [f"restock-{n}" for n in range(4)]
    try:
        for kube in (a, b):
            for run in runs:
                kube.apply(run, agentrun_spec())
        for run in runs:
            start = threading.Barrier(2)
            failures: list[BaseException] = []

            def race(
                kube: Operator,
                run: str = run,
                start: threading.Barrier = start,
                failures: list[BaseException] = failures,
            ) -> None:
                try:
                    start.wait()
                    kube.reconcile(run)
                except BaseException as error:  # told by the assertion below
                    failures.append(error)

            threads = [threading.Thread(target=race, args=(kube,)) for kube in (a, b)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert failures == []
            made = [kube for kube in (a, b) if f"{run}-s1-a1" in kube.pods()]
            assert len(made) == 1, run
            winner = made[0]
            loser = b if winner is a else a
            name = "op-a" if winner is a else "op-b"
            reconciling = loser.condition(run, "Reconciling")
            assert (reconciling["status"], reconciling["reason"]) == ("True", "HeldElsewhere")
            assert f"held by {name!r} under epoch 1" in reconciling["message"]
            assert loser.status(run)["message"] == reconciling["message"]
            assert winner.drive(run) == [0, 0]
            assert loser.reconcile(run) == REST
            assert not [pod for pod in loser.pods() if pod.startswith(f"{run}-")]
            assert loser.status(run)["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == len(runs)
    finally:
        a.close()
        b.close()


def test_a_paused_operators_pod_is_fenced_and_its_write_is_the_new_holders_unknown_outcome(
    two_clusters: tuple[Operator, Operator],
) -> None:
    """Cluster A's operator takes the run and its step pod sends a WRITE, then both pause (the
    call's answer not yet recorded) past A's lease. Cluster B's operator, refused while A's
    lease is live (HeldElsewhere naming op-a), takes the run after it under epoch 2. A's pod
    thaws: its write is refused (exit 6), and A reads that as the run taken over: not a crash,
    no new pod, nothing asked in cluster A. B's pod meets the WRITE as an unknown outcome: the
    run stops OutcomeUnknown and asks for a Reconciliation in B; the order went out once."""
    a, b = two_clusters
    spec = agentrun_spec(tool="held_order")
    a.apply("restock", spec)
    b.apply("restock", spec)
    a.reconcile("restock")
    assert _env(a, "restock-s1-a1")["KEELGATE_EPOCH"] == "1"
    seen: dict[str, Any] = {}
    seen["refused"] = b.reconcile("restock")
    seen["refused_as"] = b.condition("restock", "Reconciling")
    seen["refused_pods"] = b.pods()

    def meanwhile() -> None:
        """Cluster B's operator, while A's pod is held in its call (A renews nothing)."""
        try:
            deadline = time.monotonic() + 20
            while not operator_tools.ORDERS and time.monotonic() < deadline:
                time.sleep(0.02)
            seen["sent"] = len(operator_tools.ORDERS)  # sent, its answer held
            _wait_out(b, "restock")  # paused past A's lease
            seen["taken"] = b.reconcile("restock")
        finally:
            operator_tools.THAW.set()  # A's pod thaws, with the call's answer

    other = threading.Thread(target=meanwhile)
    other.start()
    assert a.run_step("restock") == 6  # the step pods run in the main thread (signals)
    other.join(30)
    assert seen["sent"] == 1
    refused = seen["refused"]
    assert isinstance(refused, Requeue) and refused.after <= SHORT + 1.5
    assert seen["refused_as"]["reason"] == "HeldElsewhere"
    assert "held by 'op-a' under epoch 1" in seen["refused_as"]["message"]
    assert seen["refused_pods"] == []
    assert seen["taken"] == REST
    assert b.pods() == ["restock-s1-a1"]  # cluster B's own first pod
    assert _env(b, "restock-s1-a1")["KEELGATE_EPOCH"] == "2"
    held = _holder(b, "restock")
    assert held is not None and held[:2] == ("op-b", 2)

    assert b.run_step("restock") == 3  # stopped: an unknown outcome, never sent again
    b.reconcile("restock")
    assert b.status("restock")["stopReason"] == "outcome_unknown"
    assert b.condition("restock", "OutcomeUnknown")["status"] == "True"
    rec = action_object_name("restock", "1:0", "held_order")
    assert b.api.get("Reconciliation", NAMESPACE, rec) is not None

    assert isinstance(a.reconcile("restock"), Requeue)  # looked at again when B's lease ends
    step = a.status("restock")["step"]
    assert step["crashes"] == 0 and "another holder took the run over" in step["lastExit"]
    assert a.pods() == ["restock-s1-a1"]  # no pod more in cluster A
    # It waits for a person, as the store says (and as B shows it); nothing is asked here.
    assert a.status("restock")["stopReason"] == "outcome_unknown"
    assert a.api.get("Reconciliation", NAMESPACE, rec) is None
    assert isinstance(a.reconcile("restock"), Requeue) and a.pods() == ["restock-s1-a1"]
    assert [e.reason for e in a.api.events if e.reason == "StepFenced"] == ["StepFenced"]
    assert a.sample("keelgate_steps_ended_total", result="fenced") == 1
    assert a.controller.holding.renew() == []  # it holds nothing now
    assert len(operator_tools.ORDERS) == 1


def test_a_renewal_finds_the_runs_taken_over_while_the_operator_was_paused(
    two_clusters: tuple[Operator, Operator],
) -> None:
    """One renewal (one statement) for every run the operator holds: it keeps the lease of a
    run still its own, and names as lost the run another operator took after its lease lapsed
    and the one whose lease lapsed unrenewed (a lapsed lease is lost: the run is taken again,
    under a new epoch, before its next pod)."""
    a, b = two_clusters
    for run in ("lapsed", "taken"):
        a.apply(run, agentrun_spec())
        a.reconcile(run)
    assert a.controller.holding.held() == [(NAMESPACE, "lapsed"), (NAMESPACE, "taken")]
    _wait_out(a, "taken")  # paused past its leases
    _wait_out(a, "lapsed")
    b.apply("taken", agentrun_spec())
    b.reconcile("taken")
    assert b.pods() == ["taken-s1-a1"]
    a.apply("fresh", agentrun_spec())
    a.reconcile("fresh")
    assert a.controller.holding.renew() == [(NAMESPACE, "lapsed"), (NAMESPACE, "taken")]
    assert a.controller.holding.held() == [(NAMESPACE, "fresh")]
    fresh = _holder(a, "fresh")
    assert fresh is not None and fresh[:2] == ("op-a", 1)
    assert a.controller.holding.hold(NAMESPACE, "lapsed").epoch == 2  # type: ignore[union-attr]


def test_a_new_leader_takes_the_runs_after_the_old_leaders_lease_and_never_resends_a_write(
    tmp_path: Path,
) -> None:
    """A leader ("op-a") takes the run; its step pod dies right after the shop took the order,
    and the leader dies with it (its lease is never renewed nor let go). The next leader
    ("op-b", the same cluster) makes no pod while the old lease is live (the status names
    op-a), then takes the run under epoch 2: its step pod reads the WRITE left under epoch 1 as
    an unknown outcome, never sends it again; settled by a person, the run finishes and is let
    go."""
    old = _operator(tmp_path, "op-a", lease=LONG)
    old.apply("restock", agentrun_spec())
    old.reconcile("restock")
    assert old.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    assert len(operator_tools.ORDERS) == 1
    old.close()  # the old leader is gone: it lets nothing go

    new = _operator(tmp_path, "op-b", api=old.api)
    try:
        new.relist("AgentRun", "Pod")
        result = new.reconcile("restock")
        assert isinstance(result, Requeue)
        reconciling = new.condition("restock", "Reconciling")
        assert reconciling["reason"] == "HeldElsewhere" and "'op-a'" in reconciling["message"]
        assert new.pods() == ["restock-s1-a1"]
        _wait_out(new, "restock")
        new.reconcile("restock")
        assert new.pods() == ["restock-s1-a1", "restock-s2-a1"]
        assert _env(new, "restock-s2-a1")["KEELGATE_EPOCH"] == "2"
        assert new.run_step("restock") == 3
        new.reconcile("restock")
        assert new.status("restock")["stopReason"] == "outcome_unknown"
        rec = action_object_name("restock", "1:0", "place_order")
        new.api.patch_spec("Reconciliation", NAMESPACE, rec, {"executed": True, "by": "alice"})
        assert new.reconcile(rec, kind="Reconciliation") == REST
        assert new.drive("restock") == [0, 0]
        assert new.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
        done = _holder(new, "restock")
        assert done is not None and done[:2] == ("op-b", 2) and done[2] <= 0.0
    finally:
        new.close()


def test_without_a_holder_no_run_is_taken_and_pods_carry_no_epoch(kube: Operator) -> None:
    """An operator started with --run-lease 0 (no holder) drives a run as before ownership:
    nothing recorded in the store's owners, no KEELGATE_EPOCH in its pods."""
    kube.apply("restock", agentrun_spec())
    assert kube.drive("restock") == [0, 0]
    assert "KEELGATE_EPOCH" not in _env(kube, "restock-s1-a1")
    assert _holder(kube, "restock") is None


def test_operators_on_postgresql_take_each_run_once(tmp_path: Path, pg_url: str) -> None:
    """The same on a PostgreSQL server whose tenant has a database of its own (``keelgate tenant
    add``: the operator's store routes the tenant there, as in a cluster): of two clusters'
    operators, one takes the run and makes its pods (epoch 1 in each), the other shows who
    holds it and makes none; the holder's renewal finds it in the tenant's database."""
    from keelgate.stores.tenancy import TenantStore
    from keelgate.stores.tenant_databases import TenantDatabases

    with TenantStore(pg_url) as admin:
        admin.add(NAMESPACE)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    a = _operator(tmp_path / "a", "op-a", store=pg_url)
    b = _operator(tmp_path / "b", "op-b", store=pg_url)
    try:
        for kube in (a, b):
            kube.apply("restock", agentrun_spec())
        assert isinstance(a.stores.checkpoints, TenantDatabases)  # routed, as in a cluster
        a.reconcile("restock")
        assert a.controller.holding.renew() == []  # one statement per database: still held
        assert a.controller.holding.held() == [(NAMESPACE, "restock")]
        assert isinstance(b.reconcile("restock"), Requeue)
        assert b.pods() == []
        assert "held by 'op-a' under epoch 1" in b.condition("restock", "Reconciling")["message"]
        assert a.drive("restock") == [0, 0]
        assert _env(a, "restock-s2-a1")["KEELGATE_EPOCH"] == "1"
        assert b.reconcile("restock") == REST
        assert b.status("restock")["phase"] == "Succeeded" and b.pods() == []
        assert len(operator_tools.ORDERS) == 1
    finally:
        a.close()
        b.close()


def test_an_approval_is_written_by_whoever_holds_the_run_after_a_hand_over(
    tmp_path: Path,
) -> None:
    """The leader ("op-a") holds a run waiting for an approval (a run waiting for a person is
    not let go) and dies. Bob approves while op-a's lease is live: the next leader does not
    count it yet (the Approval says the run is held by op-a); once the lease lapsed, it takes
    the run and records bob's decision under its epoch, and the order goes out once."""
    old = _operator(tmp_path, "op-a", lease=LONG)
    old.apply("restock", agentrun_spec(approval=True))
    assert old.drive("restock") == [3]
    assert old.status("restock")["stopReason"] == "awaiting_approval"
    held = _holder(old, "restock")
    assert held is not None and held[:2] == ("op-a", 1) and held[2] > 0  # kept while it waits
    old.close()

    new = _operator(tmp_path, "op-b", api=old.api)
    try:
        new.relist("AgentRun", "Pod", "Approval")
        name = action_object_name("restock", "1:0", "place_order")
        body = new.api.get("Approval", NAMESPACE, name)
        assert body is not None
        entry = {"by": "bob", "groups": [], "approved": True}
        new.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [entry]})
        new.reconcile(name, kind="Approval")
        approval = new.api.get("Approval", NAMESPACE, name)
        assert approval is not None
        assert "not counted here: the run is held by 'op-a'" in approval["status"]["message"]
        _wait_out(new, "restock")
        new.reconcile(name, kind="Approval")
        approval = new.api.get("Approval", NAMESPACE, name)
        assert approval is not None and approval["status"]["phase"] == "Settled", approval
        taken = _holder(new, "restock")
        assert taken is not None and taken[:2] == ("op-b", 2)
        new.drive("restock")
        assert new.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
    finally:
        new.close()


@pytest.mark.parametrize(
    "dies",
    ["after the take", "after the pod's create"],
)
def test_an_operator_that_dies_around_its_take_is_replaced_and_the_write_runs_once(
    tmp_path: Path, dies: str
) -> None:
    """The operator dies right after it took the run (its pod's create never sent) or right
    after the create (its answer lost). The process that replaces it is another holder: it
    makes no pod while the dead one's lease is live, then takes the run under epoch 2 and
    creates (or adopts) the very pod the status names, under which the run finishes; the
    order goes out once."""
    first = _operator(tmp_path, "op-a", lease=SHORT if dies == "after the take" else LONG)
    first.apply("restock", agentrun_spec())
    if dies == "after the take":
        first.api.refuse_next["create_pod"] = ConnectionError("the operator died here")
        with pytest.raises(ConnectionError):
            first.reconcile("restock")
        assert first.pods() == []
    else:
        first.reconcile("restock")
        assert first.pods() == ["restock-s1-a1"]
    held = _holder(first, "restock")
    assert held is not None and held[:2] == ("op-a", 1)
    first.close()

    second = _operator(tmp_path, "op-a2", api=first.api)
    try:
        second.relist("AgentRun", "Pod")
        if dies == "after the take":
            assert isinstance(second.reconcile("restock"), Requeue)
            assert second.pods() == []
            assert "held by 'op-a'" in second.condition("restock", "Reconciling")["message"]
            _wait_out(second, "restock")
            assert second.reconcile("restock") == REST
            assert _env(second, "restock-s1-a1")["KEELGATE_EPOCH"] == "2"
            assert second.drive("restock") == [0, 0]
        else:
            # The pod made before the death carries epoch 1: nobody took a newer one while it
            # ran (the new process waits for a running pod), so its writes land; the next
            # step's pod waits for the dead holder's lease, then goes under epoch 2.
            assert _env(second, "restock-s1-a1")["KEELGATE_EPOCH"] == "1"
            assert second.drive("restock") == [0]
            reconciling = second.condition("restock", "Reconciling")
            assert reconciling["reason"] == "HeldElsewhere" and "'op-a'" in reconciling["message"]
            _wait_out(second, "restock")
            assert second.drive("restock") == [0]
            assert _env(second, "restock-s2-a1")["KEELGATE_EPOCH"] == "2"
        assert second.status("restock")["phase"] == "Succeeded"
        assert len(operator_tools.ORDERS) == 1
    finally:
        second.close()
