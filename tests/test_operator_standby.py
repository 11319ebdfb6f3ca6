"""A standby cluster (issue 50, item 3): operators of two clusters ("east" and "west") sharing one
PostgreSQL server, each the operator's real controller over its own in-memory API server, the
step pods the real ``keelgate step`` in this process (tests/support/operator_rig.py).

What a user would notice if these broke: both clusters making step pods for the same AgentRun;
the standby cluster's run looking failed or stuck to Argo CD and kstatus, or not saying which
cluster holds it; a run never taken over when its cluster is gone, or its WRITE in flight sent a
second time; a decision made in the cluster that does not hold the run counted there, lost, or
counted twice (an Approval's, a Reconciliation's); a cluster that comes back driving runs it lost.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fakes.kube_api import FakeApiServer
from keelgate.errors import StoreUnavailable
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.controller.ownership import HeldElsewhere, cluster_of, holder_name
from keelgate.kube.naming import action_object_name
from keelgate.stores import open_stores
from support import operator_tools
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

pytestmark = pytest.mark.usefixtures("orders")

#: The lease of the cluster that drives first: short enough to lapse within a test.
LEASE = 3.0
EAST_A, EAST_B, WEST = "op-a/aa0001@east", "op-b/bb0002@east", "op-w/cc0003@west"


def _operator(
    folder: Path, holder: str, store: str, *, lease: float = 30.0, api: FakeApiServer | None = None
) -> Operator:
    folder.mkdir(exist_ok=True)
    settings = ControllerSettings(holder=holder, run_lease=lease, busy_retry=0.0)
    return Operator(folder, settings=settings, api=api, store=store)


@pytest.fixture
def clusters(tmp_path: Path, pg_url: str) -> Iterator[tuple[Operator, Operator]]:
    """East's operator (a short lease) and west's, each with its own API server, one store."""
    east = _operator(tmp_path / "east", EAST_A, pg_url, lease=LEASE)
    west = _operator(tmp_path / "west", WEST, pg_url)
    yield east, west
    east.close()
    west.close()


def _holder(kube: Operator, run: str) -> tuple[str, int, float]:
    stores = open_stores(kube.store_url)
    try:
        held = stores.checkpoints.holder_of(NAMESPACE, run)  # type: ignore[attr-defined]
    finally:
        stores.close()
    assert held is not None, run
    return held.holder, held.epoch, held.lease_left


def _finishes_with_one_order(kube: Operator) -> None:
    """The run's last two steps run in ``kube``'s cluster, it succeeds, and the shop has one
    order in all."""
    assert kube.drive("restock") == [0, 0]
    assert kube.status("restock")["phase"] == "Succeeded"
    assert len(operator_tools.ORDERS) == 1


def _wait_out(kube: Operator, run: str) -> None:
    time.sleep(max(0.0, _holder(kube, run)[2]) + 0.2)


def _conditions(kube: Operator, run: str) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c.get("message", ""))
        for c in kube.status(run)["conditions"]
    }


def _kstatus(kube: Operator, run: str) -> str:
    """What kstatus (Flux, Helm's --wait) reads of a custom resource with current
    observedGeneration: Reconciling=True is InProgress, Stalled=True is Failed, else Current."""
    conditions = _conditions(kube, run)
    if conditions["Reconciling"][0] == "True":
        return "InProgress"
    if conditions["Stalled"][0] == "True":
        return "Failed"
    return "Current"


def _copy(source: Operator, target: Operator, kind: str, name: str, spec: dict[str, Any]) -> None:
    """Someone with edit in ``target``'s namespace makes there the object ``source``'s
    operator made (the same name and spec, with ``spec`` merged in)."""
    body = source.api.get(kind, NAMESPACE, name)
    assert body is not None, name
    made = {
        "apiVersion": body["apiVersion"],
        "kind": kind,
        "metadata": {"name": name},
        "spec": {**body["spec"], **spec},
    }
    target.api.create_object(kind, NAMESPACE, made)


def test_a_holder_names_its_cluster_and_an_unnamed_holder_is_read_as_this_clusters() -> None:
    """An operator's holder name carries its cluster (identity/mark@cluster), each process a
    mark of its own; a name without one (written before clusters were named, or by hand) is
    read as no other cluster's, so an upgrade never shows a cluster's own runs Standby."""
    one, two = (
        holder_name("keelgate-operator-7d9f", cluster="east"),
        holder_name("keelgate-operator-7d9f", cluster="east"),
    )
    assert one != two and cluster_of(one) == cluster_of(two) == "east"
    assert one.startswith("keelgate-operator-7d9f/")
    assert cluster_of("keelgate-operator-7d9f/3f9a1c") == ""
    assert cluster_of("me@host/3f9a1c") == ""  # an @ in the identity is not a cluster
    assert cluster_of("op/aa@Not_A_Label") == ""


def test_a_run_held_by_another_cluster_is_standby_at_rest_and_gets_no_pod(
    clusters: tuple[Operator, Operator], tmp_path: Path, pg_url: str
) -> None:
    """The same AgentRun applied to both clusters: east takes it and makes its pod; west makes
    none and shows Standby=True (reason HeldByAnotherCluster, naming the cluster, the holder
    and its lease), Reconciling=False (reason Standby) and Stalled=False, so kstatus reads it
    Current (neither under way nor failed), and looks again when the lease would lapse. A
    second operator of east's own cluster shows the hand-over case instead: HeldElsewhere."""
    east, west = clusters
    for kube in (east, west):
        kube.apply("restock", agentrun_spec())
    east.reconcile("restock")
    assert east.pods() == ["restock-s1-a1"]
    again = west.reconcile("restock")
    assert isinstance(again, Requeue) and again.after <= LEASE + 1.0
    assert west.pods() == []
    shown = _conditions(west, "restock")
    status, reason, message = shown["Standby"]
    assert (status, reason) == ("True", "HeldByAnotherCluster")
    assert f"held by cluster 'east' (operator {EAST_A!r}) under epoch 1" in message
    assert "takes the run over if that operator's lease on it lapses" in message
    # Looked at again while east renews: nothing new to show, nothing written (the message
    # names no lease left, which would change at every look).
    later = HeldElsewhere(EAST_A, 1, 2.0, cluster="east")
    assert later.words() == dataclasses.replace(later, lease_left=29.0).words()
    writes = len(west.api.writes)
    west.reconcile("restock")
    assert _conditions(west, "restock")["Standby"][2] == message
    assert [w for w in west.api.writes[writes:] if "status" in w] == []
    assert shown["Reconciling"][:2] == ("False", "Standby")
    assert shown["Stalled"][0] == "False"
    assert _kstatus(west, "restock") == "Current"
    assert west.status("restock")["message"] == message
    assert "Standby" not in _conditions(east, "restock")

    twin = _operator(tmp_path / "east-b", EAST_B, pg_url, api=east.api)
    try:
        twin.relist("AgentRun", "Pod")
        east.api.finish_pod(NAMESPACE, "restock-s1-a1", 0)  # the pod ended: a next one is due
        twin.reconcile("restock")
        here = _conditions(twin, "restock")
        assert "Standby" not in here
        assert here["Reconciling"][:2] == ("True", "HeldElsewhere")
        assert f"held by {EAST_A!r} under epoch 1" in here["Reconciling"][2]
    finally:
        twin.close()


def test_the_standby_cluster_takes_over_after_the_lease_and_never_resends_the_write(
    clusters: tuple[Operator, Operator],
) -> None:
    """East's step pod dies right after the shop took the order, and east with it (API server
    and operator gone: nothing renewed, nothing let go). West stands by while the lease is live,
    looks again when it would lapse, and then (within 5 s of the lapse) takes the run
    under epoch 2: its own step pod resumes from the checkpoint and meets the WRITE as an
    unknown outcome, asked for in west; settled there, the run finishes, the order sent once."""
    east, west = clusters
    for kube in (east, west):
        kube.apply("restock", agentrun_spec())
    east.reconcile("restock")
    assert east.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    assert len(operator_tools.ORDERS) == 1
    east.close()  # east is gone

    again = west.reconcile("restock")
    assert isinstance(again, Requeue) and west.pods() == []
    lapses = time.monotonic() + _holder(west, "restock")[2]
    time.sleep(again.after)
    assert west.reconcile("restock") == REST
    taken_after = time.monotonic() - lapses
    assert taken_after < 5.0, taken_after  # the target: within the lease and 5 s
    assert west.pods() == ["restock-s1-a1"]
    assert _holder(west, "restock")[:2] == (WEST, 2)
    assert "Standby" not in _conditions(west, "restock")
    assert west.run_step("restock") == 3
    west.reconcile("restock")
    assert west.status("restock")["stopReason"] == "outcome_unknown"
    rec = action_object_name("restock", "1:0", "place_order")
    west.api.patch_spec("Reconciliation", NAMESPACE, rec, {"executed": True, "by": "alice"})
    assert west.reconcile(rec, kind="Reconciliation") == REST
    _finishes_with_one_order(west)


def test_an_approval_made_in_the_standby_cluster_is_refused_there_and_counted_once(
    clusters: tuple[Operator, Operator],
) -> None:
    """An insider with edit in west's namespace makes there the Approval east asks for and
    approves on it while east holds the run: west refuses it visibly (naming cluster east and
    its operator), records nothing, and the run still waits in east. Decided in east, the run
    goes on there and the order goes out once; west's object never adds a second decision."""
    east, west = clusters
    for kube in (east, west):
        kube.apply("restock", agentrun_spec(approval=True))
    assert east.drive("restock") == [3]
    assert east.status("restock")["stopReason"] == "awaiting_approval"
    west.reconcile("restock")
    shown = _conditions(west, "restock")
    assert shown["Standby"][0] == "True" and shown["AwaitingApproval"][0] == "True"
    assert _kstatus(west, "restock") == "Current"
    name = action_object_name("restock", "1:0", "place_order")
    assert west.api.get("Approval", NAMESPACE, name) is None  # nothing is asked in west
    mallory = {"by": "mallory", "groups": [], "approved": True}
    _copy(east, west, "Approval", name, {"decisions": [mallory]})
    west.reconcile(name, kind="Approval")
    approval = west.api.get("Approval", NAMESPACE, name)
    assert approval is not None
    message = approval["status"]["message"]
    assert "mallory: not counted here: the run is held by cluster 'east'" in message
    assert EAST_A in message
    assert approval["status"]["phase"] == "Pending"
    state = east.controller.context.run_state(NAMESPACE, "restock")
    assert state is not None and not state.approvals.get("1:0")
    assert east.drive("restock") == []  # still waiting: nothing counted
    assert operator_tools.ORDERS == []

    bob = {"by": "bob", "groups": [], "approved": True}
    east.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [bob]})
    east.reconcile(name, kind="Approval")
    assert east.drive("restock") == [0, 0]
    assert east.status("restock")["phase"] == "Succeeded"
    west.reconcile(name, kind="Approval")
    state = east.controller.context.run_state(NAMESPACE, "restock")
    assert state is not None
    assert [d.by for d in state.approvals["1:0"]] == ["bob"]
    assert len(operator_tools.ORDERS) == 1
    assert west.reconcile("restock") == REST and west.pods() == []
    assert west.status("restock")["phase"] == "Succeeded"


def test_a_settlement_made_in_the_standby_cluster_is_refused_and_the_holders_stands(
    clusters: tuple[Operator, Operator],
) -> None:
    """East's run stops with an unknown outcome. An insider in west makes the Reconciliation
    there and says "not executed": west refuses it (Stalled, reason HeldElsewhere, naming
    cluster east) and the store's key stays unknown. Alice settles it in east as executed: that
    is the one settlement; west's object, looked at again, mirrors it (Settled executed by
    alice) and is told the decision stands. The order was sent once and never again."""
    east, west = clusters
    for kube in (east, west):
        kube.apply("restock", agentrun_spec())
    east.reconcile("restock")
    assert east.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    east.reconcile("restock")
    assert east.run_step("restock") == 3
    east.reconcile("restock")
    assert east.status("restock")["stopReason"] == "outcome_unknown"
    rec = action_object_name("restock", "1:0", "place_order")
    _copy(east, west, "Reconciliation", rec, {"executed": False, "by": "mallory"})
    refused = west.reconcile(rec, kind="Reconciliation")
    assert isinstance(refused, Requeue)
    body = west.api.get("Reconciliation", NAMESPACE, rec)
    assert body is not None and body["status"]["phase"] == "Pending"
    stalled = {c["type"]: c for c in body["status"]["conditions"]}["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "HeldElsewhere")
    assert "not counted here: the run is held by cluster 'east'" in stalled["message"]
    key = east.api.get("Reconciliation", NAMESPACE, rec)["spec"]["idempotencyKey"]  # type: ignore[index]
    record = east.stores.idempotency.get(NAMESPACE, key)
    assert record is not None and record.state.value == "outcome_unknown"
    assert record.settled_by == ""

    east.api.patch_spec("Reconciliation", NAMESPACE, rec, {"executed": True, "by": "alice"})
    assert east.reconcile(rec, kind="Reconciliation") == REST
    assert west.reconcile(rec, kind="Reconciliation") == REST
    body = west.api.get("Reconciliation", NAMESPACE, rec)
    assert body is not None
    assert (body["status"]["phase"], body["status"]["verdict"]) == ("Settled", "executed")
    assert body["status"]["settledBy"] == "alice"
    assert "DecidedElsewhere" in west.api.reasons()
    _finishes_with_one_order(east)


def test_a_spec_broken_in_the_standby_cluster_asks_for_no_settlement_there(
    clusters: tuple[Operator, Operator],
) -> None:
    """East's run stops with an unknown outcome; in west someone applies the run with a spec
    the models refuse. West shows it Stalled (its spec is wrong there) but asks nobody to
    settle east's outcome: no Reconciliation is made in west, where no decision would count."""
    east, west = clusters
    east.apply("restock", agentrun_spec())
    east.reconcile("restock")
    assert east.run_step("restock", failpoints={"after_gateway_call": 1}) == 137
    east.reconcile("restock")
    assert east.run_step("restock") == 3
    east.reconcile("restock")
    assert east.status("restock")["stopReason"] == "outcome_unknown"
    broken = agentrun_spec()
    broken["budget"] = {"maxIterations": -1}
    west.apply("restock", broken)
    west.reconcile("restock")
    assert west.condition("restock", "Stalled")["status"] == "True"
    assert west.api.of_kind("Reconciliation") == []
    assert len(east.api.of_kind("Reconciliation")) == 1


def test_an_agentrun_recreated_in_the_standby_cluster_is_never_driven_there(
    clusters: tuple[Operator, Operator],
) -> None:
    """An insider in west deletes the AgentRun and creates it again (a new uid, a fresh
    status) while east drives it, hoping for a run driven twice: west lets go of nothing it
    does not hold, makes no pod, and shows the new object Standby; east's hold is untouched
    (same holder, same epoch) and the run finishes in east with one order."""
    east, west = clusters
    for kube in (east, west):
        kube.apply("restock", agentrun_spec())
    east.reconcile("restock")
    west.reconcile("restock")
    west.api.delete_object("AgentRun", NAMESPACE, "restock")
    assert west.reconcile("restock") == REST
    assert _holder(east, "restock")[:2] == (EAST_A, 1)
    west.apply("restock", agentrun_spec())
    assert isinstance(west.reconcile("restock"), Requeue)
    assert west.pods() == []
    assert _conditions(west, "restock")["Standby"][0] == "True"
    assert east.drive("restock") == [0, 0]
    assert _holder(east, "restock")[:2] == (EAST_A, 1)
    assert west.reconcile("restock") == REST and west.pods() == []
    assert len(operator_tools.ORDERS) == 1


def test_a_cluster_that_comes_back_shows_the_runs_it_lost_standby_and_drives_none(
    tmp_path: Path, pg_url: str
) -> None:
    """East holds a run waiting for an approval and dies. West, once the lease lapsed, asks for
    the approval in west; carol's decision there counts (west takes the run, epoch 2).
    East comes back (a new process, its API server with everything it had): its run shows
    Standby naming west, no pod is made in east, and a decision made in east after the move
    (bob approving on the Approval east made before it) is refused, naming west. The order
    goes out once, from west."""
    east = _operator(tmp_path / "east", EAST_A, pg_url, lease=LEASE)
    west = _operator(tmp_path / "west", WEST, pg_url)
    try:
        for kube in (east, west):
            kube.apply("restock", agentrun_spec(approval=True))
        assert east.drive("restock") == [3]
        name = action_object_name("restock", "1:0", "place_order")
        assert east.api.get("Approval", NAMESPACE, name) is not None
        east.close()  # east is gone, its lease never renewed

        _wait_out(west, "restock")
        west.reconcile("restock")
        assert west.api.get("Approval", NAMESPACE, name) is not None  # asked in west now
        carol = {"by": "carol", "groups": [], "approved": True}
        west.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [carol]})
        west.reconcile(name, kind="Approval")
        approval = west.api.get("Approval", NAMESPACE, name)
        assert approval is not None and approval["status"]["phase"] == "Settled", approval
        assert _holder(west, "restock")[:2] == (WEST, 2)

        back = _operator(tmp_path / "east-again", EAST_B, pg_url, api=east.api)
        try:
            back.relist("AgentRun", "Pod", "Approval")
            assert isinstance(back.reconcile("restock"), Requeue)
            shown = _conditions(back, "restock")
            assert shown["Standby"][0] == "True"
            said = f"held by cluster 'west' (operator {WEST!r}) under epoch 2"
            assert said in shown["Standby"][2]
            assert back.pods() == ["restock-s1-a1"]  # east's old pod only
            bob = {"by": "bob", "groups": [], "approved": True}
            back.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [bob]})
            back.reconcile(name, kind="Approval")  # shows the store's: carol's, settled
            back.reconcile(name, kind="Approval")  # (its status patch is watched: looked again)
            approval = back.api.get("Approval", NAMESPACE, name)
            assert approval is not None and approval["status"]["settledBy"] == "carol"
            assert "not counted: bob (added after approval" in approval["status"]["message"]
            assert "NotCounted" in back.api.reasons()
            assert west.drive("restock") == [0, 0]
            assert isinstance(back.reconcile("restock"), (Requeue, type(REST)))
            assert back.pods() == ["restock-s1-a1"]
            state = west.controller.context.run_state(NAMESPACE, "restock")
            assert state is not None and [d.by for d in state.approvals["1:0"]] == ["carol"]
            assert len(operator_tools.ORDERS) == 1
        finally:
            back.close()
    finally:
        west.close()


def _store_cut(pg_url: str, *, cut: bool) -> None:
    """The store's database refuses every session (its own ended), or takes them again."""
    database = pg_url.rsplit("/", 1)[1]
    server = pg_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(not cut).lower()}')
        if cut:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


def _look_until_reached(kube: Operator, name: str) -> None:
    """The Approval looked at again until the store's pool has connected again (it backs off
    between its tries while the database refused them), as the worker's back-off does."""
    deadline = time.monotonic() + 120
    while True:
        try:
            kube.reconcile(name, kind="Approval")
            return
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the store was not reached again"
            time.sleep(1.0)


def test_a_deny_made_where_the_store_cannot_be_reached_is_shown_not_counted_until_it_is(
    tmp_path: Path, pg_url: str
) -> None:
    """East holds a run waiting for an approval when it is cut off from the store (its
    database refuses every session), past a renewal period. Alice denies on east's Approval:
    east cannot record it, and shows so on the object where she looks (not counted here yet,
    the store cannot be reached; Stalled, reason StoreUnavailable), rather than nothing: had
    the run moved to west meanwhile, she would know to deny there. Once east reaches the store
    again, her deny is recorded, the Approval settles denied and nothing is ordered."""
    east = _operator(tmp_path / "east", EAST_A, pg_url, lease=LEASE)
    try:
        east.apply("restock", agentrun_spec(approval=True))
        assert east.drive("restock") == [3]
        name = action_object_name("restock", "1:0", "place_order")
        # The store rides out an outage for a while before it says so (a fail-over); here
        # the cut is for good until it is lifted: a second of patience.
        store = east.stores.checkpoints
        store.patience = store.result_patience = 1.0  # type: ignore[attr-defined]
        _store_cut(pg_url, cut=True)
        alice = {"by": "alice", "groups": [], "approved": False, "note": "wrong supplier"}
        east.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [alice]})
        # A blip of the store shows nothing; once east's hold on its runs is in doubt (no
        # renewal for longer than a renewal period), a decision it cannot record is shown.
        with pytest.raises(StoreUnavailable):
            east.controller.context.holding.renew()
        time.sleep(LEASE / 3 + 0.2)
        with pytest.raises(StoreUnavailable):
            east.reconcile(name, kind="Approval")  # tried again by the worker's back-off
        approval = east.api.get("Approval", NAMESPACE, name)
        assert approval is not None
        status = approval["status"]
        assert status["phase"] == "Pending"
        assert status["message"].startswith(
            "alice: not counted here yet: this cluster's operator cannot reach the store"
        )
        stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "StoreUnavailable")
        _store_cut(pg_url, cut=False)
        _look_until_reached(east, name)
        approval = east.api.get("Approval", NAMESPACE, name)
        assert approval is not None
        assert (approval["status"]["phase"], approval["status"]["verdict"]) == (
            "Settled",
            "denied",
        )
        east.drive("restock")
        assert east.status("restock")["phase"] == "Succeeded"  # it went on without the order
        assert operator_tools.ORDERS == []
    finally:
        _store_cut(pg_url, cut=False)
        east.close()


def test_an_operator_holding_nothing_shows_a_deny_it_cannot_record_once_the_store_stays_away(
    tmp_path: Path, pg_url: str
) -> None:
    """East's operator is replaced (a rollout) while its run waits for an approval, and the new
    one is cut off from the store before it took anything: it holds no run, so no hold of its
    is in doubt. Alice denies on east's Approval. A first look that cannot reach the store
    shows nothing (a blip); once the Approval's looks have found the store away for longer
    than a renewal period, her deny is shown not counted here yet (the run may be driven from
    another cluster all along, which cannot see it). Back, the deny is recorded: nothing is
    ordered."""
    east = _operator(tmp_path / "east", EAST_A, pg_url, lease=LEASE)
    try:
        east.apply("restock", agentrun_spec(approval=True))
        assert east.drive("restock") == [3]
        name = action_object_name("restock", "1:0", "place_order")
        east.close()
        new = _operator(tmp_path / "east-new", EAST_B, pg_url, lease=LEASE, api=east.api)
        try:
            new.relist("AgentRun", "Pod", "Approval")
            store = new.stores.checkpoints
            store.patience = store.result_patience = 1.0  # type: ignore[attr-defined]
            _store_cut(pg_url, cut=True)
            alice = {"by": "alice", "groups": [], "approved": False, "note": "wrong supplier"}
            new.api.patch_spec("Approval", NAMESPACE, name, {"decisions": [alice]})
            assert not new.controller.context.holding.in_doubt()  # it holds nothing
            with pytest.raises(StoreUnavailable):
                new.reconcile(name, kind="Approval")
            approval = new.api.get("Approval", NAMESPACE, name)
            assert approval is not None
            assert "not counted here yet" not in str(approval["status"].get("message"))
            time.sleep(LEASE / 3 + 0.2)
            with pytest.raises(StoreUnavailable):
                new.reconcile(name, kind="Approval")
            approval = new.api.get("Approval", NAMESPACE, name)
            assert approval is not None
            assert approval["status"]["message"].startswith(
                "alice: not counted here yet: this cluster's operator cannot reach the store"
            )
            _store_cut(pg_url, cut=False)
            _look_until_reached(new, name)
            approval = new.api.get("Approval", NAMESPACE, name)
            assert approval is not None
            assert approval["status"]["verdict"] == "denied"
            assert operator_tools.ORDERS == []
        finally:
            new.close()
    finally:
        _store_cut(pg_url, cut=False)
