"""A standby cluster on real control planes (issue 50, items 3 and 4): the session's cluster
("east", with the PostgreSQL both share) and a second local control plane ("west", its own etcd,
API server, controller-manager, scheduler and node agent), each with a `keelgate operator`
process under its own cluster's operator account, both on one store.

What a user would notice if this broke: the same AgentRun applied to both clusters driven by
both (an order placed twice); west not saying which cluster holds its run, or looking failed;
east's runs stuck forever once east is gone; a WRITE east left in flight sent again by west, or
lost; east, back, driving a run that moved to west.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelgate_e2e import keelgate as kg
from keelgate_e2e import procs, runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod, OperatorProcess
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.node import kill_container
from keelgate_e2e.node.pod import pid_file
from keelgate_e2e.procs import LOOPBACK
from keelgate_e2e.proxy import PausableProxy
from keelgate_e2e.runs import agentrun, look, order
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e

#: The run lease both operators take runs under (short, so that a takeover fits the test), and
#: the issue's target for one: within the lease and 5 s of the holder's death.
LEASE, RENEW = 4, 1
TAKEOVER_WITHIN = LEASE + 5.0


@pytest.fixture(scope="module")
def west(tmp_path_factory: pytest.TempPathFactory, cluster: Cluster) -> Iterator[Cluster]:
    """A second control plane beside the session's, with Keelgate's CRDs, RBAC and admission
    policy (no PostgreSQL of its own: its operator uses the session's)."""
    other = Cluster(tmp_path_factory.mktemp("west"))
    other.start()
    kube = other.client()
    try:
        kg.install(kube)
    finally:
        kube.close()
    yield other
    other.stop()
    left = procs.marked_pids(other.run_dir)
    assert not left, f"processes left after stopping the west cluster: {left}"


def _namespace_in(kube: Kube, name: str, store: str) -> None:
    """The test's namespace in the west cluster: the same name, alice's edit role there, and
    the tenant's store Secret (its role's URL on the shared server), as a platform copies it."""
    kg.make_namespace(kube, name)
    kg.grant_edit(kube, name)
    kg.store_secret(kube, name, store)
    kg.wait_admitting(kube, name)


def _pods(kube: Kube, namespace: str) -> dict[str, str]:
    """The step pods of the namespace, by name, and their uids."""
    listed = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in listed}


def _standby(kube: Kube, namespace: str, name: str, cluster_name: str) -> JSON | None:
    """The run's Standby condition, once it names ``cluster_name`` as the holder's cluster."""
    run = runs.get_run(kube, namespace, name)
    found = condition(run, "Standby")
    if found and found["status"] == "True" and f"cluster '{cluster_name}'" in found["message"]:
        return run
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exit_code(kube: Kube, namespace: str, pod: str) -> int | None:
    """The step container's exit code, once the node agent reported it ended."""
    body = kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    for status in (body.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if ended:
            return int(ended["exitCode"])
    return None


@pytest.mark.parametrize("east_pod", ["killed", "partitioned"])
def test_a_run_moves_to_the_standby_cluster_when_its_cluster_dies_mid_write_and_runs_once(
    operator: OperatorPod,
    cluster: Cluster,
    west: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    kubectl_bin: Path,
    shop: ShopServer,
    east_pod: str,
) -> None:
    """The same AgentRun applied to both clusters: east drives it, west shows it Standby
    (naming cluster east, Reconciling=False) and makes no pod. While east's step pod has an
    order in flight (the shop took it), east's operator and API server are killed, and its step
    pod with them (``killed``), or cut off from PostgreSQL instead (``partitioned``: a loopback
    proxy its store URL goes through holds every byte; the shop's answer reaches the pod, whose
    write of it waits behind the cut). West takes the run over within the lease and 5 s: its
    step pod resumes from the checkpoint and stops on the order as an unknown outcome, never
    sending it again. The partition heals: the old pod's write reaches the store under its old
    epoch and is refused (the pod exits 6, writing nothing). East comes back (its API server, a
    new operator process) while west holds the run: it shows the run Standby naming west and
    makes no pod. Settled truthfully in west, the run finishes there; every order reached the
    shop once, and no pod of east's was made after it died."""
    wkube = west.client()
    west_kubectl = Kubectl(kubectl_bin, west.kubeconfig, "admin", tenant)
    alice_west = west_kubectl.as_user("alice")
    store = kg.store_url(admin, tenant)
    proxy = PausableProxy(cluster.ports["postgres"]).start()
    operator.stop()  # the session's operator (cluster "default") sits this one out
    timing = (f"--run-lease={LEASE}", f"--run-lease-renew={RENEW}", f"--namespace={tenant}")
    east_op = OperatorProcess(
        cluster,
        operator.kubeconfig,
        name="operator-east",
        env=dict(operator.env),
        extra_args=("--cluster=east", *timing),
    )
    west_op = OperatorProcess(
        west,
        kg.operator_kubeconfig(west, wkube, west.run_dir / "operator.kubeconfig"),
        name="operator-west",
        env=dict(operator.env),
        extra_args=("--cluster=west", *timing),
    )
    try:
        _namespace_in(wkube, tenant, store)
        if east_pod == "partitioned":
            # East's step pods reach the store through the proxy; its operator, and west, not.
            proxied = store.replace(
                f"{LOOPBACK}:{cluster.ports['postgres']}/", f"{LOOPBACK}:{proxy.port}/"
            )
            assert proxied != store
            admin.patch(
                f"/api/v1/namespaces/{tenant}/secrets/{kg.STORE_SECRET}",
                {"stringData": {"url": proxied}},
            )
        east_op.start()
        west_op.start()
        doc = agentrun("move", shop, [[look("mv")], [order("mv-a", 1)], [order("mv-b", 1)]])
        # The first order's answer is held: a WRITE in flight (killed: for good; partitioned:
        # until after the cut, so that the pod's write of it waits behind the cut).
        shop.shop.delay = 60.0 if east_pod == "killed" else 3.0
        runs.apply(kubectl, doc)
        wait_for(
            lambda: (runs.get_run(admin, tenant, "move").get("status") or {}).get("step"),
            timeout=60,
            what="east to start the run",
        )
        runs.apply(west_kubectl, doc)
        standing = wait_for(
            lambda: _standby(wkube, tenant, "move", "east"), timeout=30, what="west standing by"
        )
        reconciling = condition(standing, "Reconciling")
        assert reconciling is not None and reconciling["status"] == "False"
        assert reconciling["reason"] == "Standby"
        assert condition(standing, "Standby")["reason"] == "HeldByAnotherCluster"  # type: ignore[index]

        wait_for(
            lambda: shop.shop.count() == 1,
            timeout=90,
            interval=0.05,
            what="the first order in flight",
        )
        if east_pod == "partitioned":
            proxy.pause()
        assert _pods(wkube, tenant) == {}  # west made nothing while east held the run
        step = runs.get_run(admin, tenant, "move")["status"]["step"]
        east_pods = _pods(admin, tenant)
        mid_write_pod = str(step["pod"])
        mid_write = east_pods[mid_write_pod]
        pid = int(pid_file(cluster.node_state_dir, mid_write, "step").read_text())

        seen: dict[str, float] = {}
        stop: list[str] = []

        failed: list[BaseException] = []

        def while_east_is_down() -> None:
            """What west does while east is down; a failure is raised once east's API server
            is back (the session's later tests need it)."""
            try:
                in_west()
            except BaseException as error:  # raised below, after the restart
                failed.append(error)

        def in_west() -> None:
            """West, with east's API server and operator gone (and its step pod, or its link
            to the store)."""
            wait_for(lambda: _pods(wkube, tenant), timeout=60, interval=0.2, what="west's pod")
            seen["taken"] = time.monotonic() - seen["died"]
            shop.shop.delay = 0.0
            if east_pod == "partitioned":
                # The old pod's store session is up behind the cut (this host answers the
                # server's keepalives), and with it its lock on the run: west's pods find the
                # run busy and are tried again, until the link heals and the old pod's write is
                # refused for its epoch (a link really gone ends that session after the
                # server's keepalives: 25 s).
                time.sleep(2 * RENEW)
                assert _alive(pid)  # its write still waits behind the cut
                proxy.resume()
                wait_for(lambda: not _alive(pid), timeout=60, what="east's old pod to end")
            stopped = runs.wait_phase(wkube, tenant, "move", "Stopped", timeout=90)
            stop.append(str(stopped["status"].get("stopReason")))

        east_op.kill()
        seen["died"] = time.monotonic()
        if east_pod == "killed":
            kill_container(cluster.node_state_dir, mid_write, "step")
        cluster.restart(
            "kube-apiserver",
            lambda: admin.exists(f"/api/v1/namespaces/{tenant}"),
            kill=True,
            while_down=while_east_is_down,
        )
        if failed:
            raise failed[0]
        print(f"west's first step pod {seen['taken']:.1f} s after east died (lease {LEASE} s)")
        assert seen["taken"] < TAKEOVER_WITHIN, seen
        assert stop == ["outcome_unknown"], stop
        assert shop.shop.count() == 1  # the order in flight was not sent again
        if east_pod == "partitioned":
            # Its write of the order's answer reached the store after west took the run: refused
            # for its epoch (exit 6), nothing written; the outcome stays west's to settle.
            code = wait_for(
                lambda: _exit_code(admin, tenant, mid_write_pod),
                timeout=60,
                what="east's old pod's exit code",
            )
            assert code == 6, code

        east_op.start()  # east is back: a new process of cluster east
        back = wait_for(
            lambda: _standby(admin, tenant, "move", "west"), timeout=60, what="east standing by"
        )
        assert "under epoch 2" in condition(back, "Standby")["message"]  # type: ignore[index]

        runs.drive_to_success(wkube, alice_west, tenant, ["move"], shop, timeout=120)
        settled = runs.reconciliations(wkube, tenant)
        assert [r["status"]["settledBy"] for r in settled] == ["alice"]
        assert _pods(admin, tenant).keys() == east_pods.keys()  # none made in east after
        counts = shop.shop.by_key()
        assert sorted(counts.values()) == [1, 1], counts
        wait_for(
            lambda: runs.phase(admin, tenant, "move") == "Succeeded",
            timeout=60,
            what="east to show the run as it ended",
        )
        assert _pods(admin, tenant).keys() == east_pods.keys()
    finally:
        shop.shop.delay = 0.0
        proxy.stop()
        east_op.stop()
        west_op.stop()
        wkube.close()
        operator.start()
