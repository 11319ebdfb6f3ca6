"""Shards in one cluster (issue 50, item 2): the chart's replicas with sharding on, each replica
driving the runs of the shards whose Leases it holds, on the real control plane.

Each run is labelled with its shard (and so are its step pods); each shard Lease is held by one
live replica; each run is taken in the store by the replica holding its shard, and by no other
while that replica lives. A replica killed mid-run (one of its runs' WRITE answered late, and
another's step pod killed with it mid-WRITE) hands its shards over within the Lease and a few
seconds; its runs go on under the new holder, the late WRITE counted once and the killed one's
outcome unknown and settled, never sent again. A third replica joining takes its share from the
two over theirs, while runs go on; each replica tells the events of its shards to the sink (a
CloudEvents receiver on loopback), each shard's delivery point kept under its own key. The
module installs the release sharded once (two replicas, eight shards, short leases to keep the
waits short, one sink) and leaves it as it found it (one replica, no election, no sink).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
import yaml
from keelgate.kube.controller.shards import hash_shard

from keelgate_e2e import runs
from keelgate_e2e.events import Receiver, data
from keelgate_e2e.keelgate import OperatorPod, tenant_dsn
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.node import kill_container
from keelgate_e2e.runs import agentrun, apply, look, order
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e

SHARDS = 8
#: The shard Leases' timings here (the chart's leaderElection values; 15/10/2 by default).
LEASE, RENEW, RETRY = 8, 5, 2
#: The run leases in the store (runOwnership; 30/10 by default).
RUN_LEASE, RUN_RENEW = 12, 4
SHARD_LABEL = "keelgate.dev/shard"


@pytest.fixture(scope="module")
def sink() -> Iterator[Receiver]:
    """Where the sharded replicas tell their events."""
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def sharded(operator_process: OperatorPod, sink: Receiver) -> Iterator[OperatorPod]:
    """The session's release with sharding on: two replicas, eight shards, one sink."""
    operator = operator_process
    operator.replicas, operator.leader_election = 2, False
    values = (
        "notifications.sinks[0].name=e2e",
        f"notifications.sinks[0].url={sink.url}",
        "notifications.sinks[0].retryForSeconds=120",
        "sharding.enabled=true",
        f"sharding.shards={SHARDS}",
        f"leaderElection.leaseDuration={LEASE}",
        f"leaderElection.renewDeadline={RENEW}",
        f"leaderElection.retryPeriod={RETRY}",
        f"runOwnership.leaseSeconds={RUN_LEASE}",
        f"runOwnership.renewSeconds={RUN_RENEW}",
    )
    before = operator.values
    operator.values = (*before, *values)
    operator.install()
    try:
        _wait_split(operator, 2)
        yield operator
    finally:
        operator.values = before
        operator.replicas, operator.leader_election = 1, False
        operator.install()
        wait_for(lambda: len(operator.pods()) == 1, timeout=120, what="one replica again")


# What the cluster shows


def _leases(operator: OperatorPod) -> dict[int, JSON]:
    """The shard Leases by shard, as the API server has them."""
    kube = operator.cluster.client()
    try:
        listed = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{operator.namespace}/leases")
    finally:
        kube.close()
    prefix = f"{operator.release}-operator-shard-"
    return {
        int(lease["metadata"]["name"][len(prefix) :]): lease
        for lease in listed["items"]
        if lease["metadata"]["name"].startswith(prefix)
    }


def _holders(operator: OperatorPod) -> dict[int, str]:
    """Each shard's holder (a replica's pod name and a mark of its process), if one holds it."""
    return {
        shard: str(lease["spec"].get("holderIdentity") or "")
        for shard, lease in _leases(operator).items()
        if lease["spec"].get("holderIdentity")
    }


def _pod_of(holder: str) -> str:
    return holder.split("/", 1)[0]


def _live_pods(operator: OperatorPod) -> set[str]:
    return {
        p["metadata"]["name"]
        for p in operator.pods()
        if (p.get("status") or {}).get("phase") == "Running"
    }


def _split(operator: OperatorPod) -> dict[str, set[int]]:
    """The shards each live replica holds (by holder), when every shard is held by one."""
    holders = _holders(operator)
    if len(holders) != SHARDS:
        return {}
    live = _live_pods(operator)
    split: dict[str, set[int]] = {}
    for shard, holder in holders.items():
        if _pod_of(holder) not in live:
            return {}
        split.setdefault(holder, set()).add(shard)
    return split


def _wait_split(operator: OperatorPod, replicas: int, timeout: float = 90) -> dict[str, set[int]]:
    """Wait until ``replicas`` live replicas hold every shard, in fair shares."""
    base, extra = divmod(SHARDS, replicas)
    fair = sorted([base + 1] * extra + [base] * (replicas - extra))

    def even() -> dict[str, set[int]] | None:
        split = _split(operator)
        sizes = sorted(len(s) for s in split.values())
        return split if len(split) == replicas and sizes == fair else None

    return wait_for(even, timeout=timeout, interval=0.5, what=f"{replicas} replicas' shares")


def _holder_in(split: dict[str, set[int]], shard: int) -> str:
    return next(holder for holder, shards in split.items() if shard in shards)


def _owner(operator: OperatorPod, tenant: str, run: str) -> tuple[str, int]:
    """The run's holder and epoch, as the store records them (in the tenant's database)."""
    with psycopg.connect(tenant_dsn(operator.cluster, tenant)) as conn:
        row = conn.execute(
            "SELECT holder, epoch FROM keelgate_owners WHERE tenant = %s AND run = %s",
            (tenant, run),
        ).fetchone()
    assert row is not None, f"{run} was never taken"
    return str(row[0]), int(row[1])


def _pods(admin: Kube, tenant: str, run: str) -> list[JSON]:
    listed = admin.get(
        f"/api/v1/namespaces/{tenant}/pods", {"labelSelector": f"keelgate.dev/run={run}"}
    )
    return list(listed["items"])


def _epoch(pod: JSON) -> str:
    env = pod["spec"]["containers"][0].get("env") or []
    return next((str(e.get("value")) for e in env if e["name"] == "KEELGATE_EPOCH"), "")


def _names_in(tenant: str, prefix: str, shards: set[int], count: int) -> list[str]:
    """``count`` run names whose shards are among ``shards`` (the hash every replica computes)."""
    names = (f"{prefix}-{n}" for n in range(1000))
    return [n for n in names if hash_shard(tenant, n, SHARDS) in shards][:count]


def _three_step(shop: ShopServer, name: str) -> JSON:
    return agentrun(
        name, shop, [[look(f"{name}-l")], [order(f"{name}-a", 1)], [order(f"{name}-b", 1)]]
    )


def _once(shop: ShopServer) -> None:
    counts = shop.shop.by_key()
    assert counts and max(counts.values()) == 1, counts


# The tests


def test_two_replicas_each_drive_a_share_and_every_run_is_driven_by_one(
    sharded: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """Two replicas hold four shards each; runs in either's shards are labelled with their
    shard (their step pods too), taken in the store by the replica holding their shard (epoch
    1: nobody else ever took them) and driven to the end, each order placed once. A person may
    not set or change a run's shard label (the admission policy), and may leave it out."""
    operator = sharded
    split = _wait_split(operator, 2)
    (first, a), (second, b) = sorted(split.items())
    names = _names_in(tenant, "share", a, 3) + _names_in(tenant, "share", b, 3)
    apply(kubectl, *[_three_step(shop, name) for name in names])
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _once(shop)
    assert shop.shop.count() == 2 * len(names)
    holders = _holders(operator)
    for name in names:
        shard = hash_shard(tenant, name, SHARDS)
        run = runs.get_run(admin, tenant, name)
        assert run["metadata"]["labels"][SHARD_LABEL] == f"{shard:02d}", name
        pods = _pods(admin, tenant, name)
        assert pods and {p["metadata"]["labels"][SHARD_LABEL] for p in pods} == {f"{shard:02d}"}
        assert {_epoch(p) for p in pods} == {"1"}, name
        assert _owner(operator, tenant, name) == (holders[shard], 1), name
    driven = {_owner(operator, tenant, name)[0] for name in names}
    assert driven == {first, second}
    # alice may apply her run again without the label (the operator's stays), but may not set
    # or change it: she could pile runs into one shard.
    again = _three_step(shop, names[0])
    apply(alice, again)
    assert runs.get_run(admin, tenant, names[0])["metadata"]["labels"][SHARD_LABEL]
    elsewhere = f"{(hash_shard(tenant, names[0], SHARDS) + 1) % SHARDS:02d}"
    moved = {**again, "metadata": {**again["metadata"], "labels": {SHARD_LABEL: elsewhere}}}
    for doc in (moved, {**moved, "metadata": {**moved["metadata"], "name": "share-new"}}):
        refused = alice("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
        assert refused.returncode != 0
        assert "metadata.labels[keelgate.dev/shard]: written by the operator only" in (
            refused.stderr
        )


def test_a_third_replica_takes_shards_over_its_share_and_decides_their_runs(
    sharded: OperatorPod,
    sink: Receiver,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """A run in each shard waits for a person's approval of its order (held by the replica
    driving its shard) when a third replica joins: the new one takes its share (8 shards: 3, 3,
    2) from the two over theirs, which let those runs go; approved, each run of a moved shard is
    taken by the new replica (epoch 2) and ordered once, the others by the replica that held
    them all along (epoch 1). Every run's approval asked and its success are told to the sink,
    moved shards' too, and each shard's delivery point is kept under its own key of the state
    ConfigMap. Scaled back to two, the shards spread over the two again."""
    operator = sharded
    before = _wait_split(operator, 2)
    names = [_names_in(tenant, f"join{shard}", {shard}, 1)[0] for shard in range(SHARDS)]
    docs = [
        agentrun(name, shop, [[look(f"{name}-l")], [order(f"{name}-a", 1)]], approval=True)
        for name in names
    ]
    apply(kubectl, *docs)
    wait_for(
        lambda: len(runs.approvals(admin, tenant)) == len(names),
        timeout=180,
        what="every run waiting for its approval",
    )
    operator.replicas = 3
    operator.install()
    after = _wait_split(operator, 3, timeout=120)
    (newcomer,) = set(after) - set(before)
    for holder, kept in after.items():
        if holder != newcomer:
            assert kept <= before[holder], "a replica took a shard while giving shards back"
    for approval in runs.approvals(admin, tenant):
        runs.decide(alice, approval["metadata"]["name"], approved=True)
    for name in names:
        runs.wait_phase(admin, tenant, name, "Succeeded", timeout=180)
    _once(shop)
    assert shop.shop.count() == len(names)
    for name in names:
        shard = hash_shard(tenant, name, SHARDS)
        if shard in after[newcomer]:
            assert _owner(operator, tenant, name) == (newcomer, 2), name
        else:
            assert _owner(operator, tenant, name) == (_holder_in(after, shard), 1), name

    def told(kind: str, name: str) -> bool:
        return any(
            e.get_type() == kind and data(e).get("run") == name for e, _, _ in sink.of(tenant)
        )

    wait_for(
        lambda: all(
            told("dev.keelgate.approval.requested", n) and told("dev.keelgate.run.succeeded", n)
            for n in names
        ),
        timeout=60,
        what="every run's approval asked and success told",
    )
    assert sink.unreadable == []
    state = f"/api/v1/namespaces/{operator.namespace}/configmaps/{operator.release}-notify-state"
    wait_for(
        lambda: (
            {f"through-{s:02d}" for s in range(SHARDS)} <= set(admin.get(state).get("data") or {})
        ),
        timeout=60,
        what="each shard's delivery point kept",
    )
    operator.replicas = 2
    operator.install()
    _wait_split(operator, 2, timeout=120)


def test_a_replica_killed_mid_write_hands_its_shards_over_and_each_write_counts_once(
    sharded: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """Two runs of one replica are each mid-WRITE (the shop has taken the order and answers
    late) when that replica is killed (SIGKILL, its pod deleted with no grace), and one of the
    two runs' step pod with it. Every shard it held is held by a live replica within the Lease
    and a few seconds. The run whose step pod lived finishes its WRITE under the dead replica's
    epoch (nobody takes a run while its step pod runs) and goes on under the new holder; the
    other's WRITE is an unknown outcome under the new holder (OutcomeUnknown, settled from the
    shop), never sent again. Each order once; the other replica's runs never change holder."""
    operator = sharded
    split = _wait_split(operator, 2)
    (victim, lost), (survivor, kept) = sorted(split.items())
    dying = _names_in(tenant, "kill", lost, 2)
    living = _names_in(tenant, "kill", kept, 2)
    shop.shop.delay = 8.0

    def ordering(name: str) -> bool:
        return any(o["key"] and o["body"].get("sku") == f"{name}-a" for o in shop.shop.orders)

    apply(kubectl, *[_three_step(shop, name) for name in dying + living])
    wait_for(
        lambda: all(ordering(name) for name in dying),
        timeout=120,
        interval=0.1,
        what="both of the victim's runs mid-WRITE",
    )
    late, cut = dying
    (step_pod,) = [
        p for p in _pods(admin, tenant, cut) if (p.get("status") or {}).get("phase") == "Running"
    ]
    path = f"/api/v1/namespaces/{operator.namespace}/pods/{_pod_of(victim)}"
    kill_container(operator.cluster.node_state_dir, admin.get(path)["metadata"]["uid"], "operator")
    kill_container(operator.cluster.node_state_dir, step_pod["metadata"]["uid"], "step")
    killed = time.monotonic()
    admin.delete(path, {"gracePeriodSeconds": 0})

    def moved() -> bool:
        holders, live = _holders(operator), _live_pods(operator)
        return all(holders.get(s, victim) != victim and _pod_of(holders[s]) in live for s in lost)

    wait_for(moved, timeout=LEASE + 30, interval=0.2, what="the dead replica's shards moved")
    moved_after = time.monotonic() - killed
    print(f"shards moved {moved_after:.1f} s after the replica was killed")
    assert moved_after < LEASE + 8
    shop.shop.delay = 0.0
    runs.drive_to_success(admin, alice, tenant, dying + living, shop, timeout=300)
    _once(shop)
    assert shop.shop.count() == 2 * len(dying + living)
    # The cut WRITE's outcome was unknown to the new holder: a Reconciliation, settled from the
    # shop (executed), and the order not placed again.
    asked = [r for r in runs.reconciliations(admin, tenant) if r["spec"]["runName"] == cut]
    assert len(asked) == 1 and asked[0]["spec"]["executed"] is True
    assert not [r for r in runs.reconciliations(admin, tenant) if r["spec"]["runName"] == late]
    # The dead replica's runs were taken again (by the survivor, and maybe on by the replica the
    # Deployment started in its place), its step pods' epochs after the first; the survivor
    # kept its own shards (those taken last go back first) and never took its runs again.
    for name in dying:
        holder, epoch = _owner(operator, tenant, name)
        assert epoch >= 2 and holder != victim, name
        newest = max(
            _pods(admin, tenant, name),
            key=lambda p: (
                int(p["metadata"]["labels"]["keelgate.dev/step"]),
                int(p["metadata"]["labels"]["keelgate.dev/attempt"]),
            ),
        )
        assert _epoch(newest) == str(epoch), name
    for name in living:
        assert _owner(operator, tenant, name) == (survivor, 1), name
