"""The operator's promise under real deaths: step pods SIGKILLed at random, the operator killed,
two operators at once, PostgreSQL and the API server restarted mid-run.

Each test applies several multi-step runs against the loopback shop, breaks something real while
they run, settles any unknown outcome truthfully (as a person checking the shop would), and then
requires that every run finishes and that the shop saw every WRITE at most once, and exactly once
unless a person truthfully abandoned it. They must never settle against the shop's record.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod, OperatorProcess
from keelgate_e2e.kube import JSON, ApiError, Kube
from keelgate_e2e.node.pod import kill_container
from keelgate_e2e.runs import agentrun, apply, look, order
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e


def _three_step_runs(shop: ShopServer, prefix: str, count: int) -> list[JSON]:
    return [
        agentrun(
            f"{prefix}-{n}",
            shop,
            [[look(f"{prefix}{n}")], [order(f"{prefix}{n}a", 1)], [order(f"{prefix}{n}b", 2)]],
        )
        for n in range(count)
    ]


def _check_exactly_once(dsn: str, namespace: str, names: list[str], shop: ShopServer) -> None:
    """Each planned WRITE reached the shop once, or never if a person truthfully abandoned it."""
    counts = shop.shop.by_key()
    assert not counts or max(counts.values()) == 1, counts
    for name in names:
        events = runs.audit_events(dsn, namespace, name)
        keys = {
            e.data["idempotencyKey"]
            for e in events
            if e.type == "loop.action_started" and e.data.get("idempotencyKey")
        }
        abandoned = {
            e.data["idempotencyKey"]
            for e in events
            if e.type == "loop.reconciled" and e.data["verdict"] == "abandoned"
        }
        assert len(keys) == 2, (name, keys)
        for key in keys:
            assert counts[key] == (0 if key in abandoned else 1), (name, key)


def _no_step_ran_twice(admin: Kube, namespace: str) -> None:
    """No step has two pods that both ended recording what they did (a duplicate pod)."""
    pods = admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    clean: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        statuses = pod.get("status", {}).get("containerStatuses") or []
        terminated = (statuses[0].get("state") or {}).get("terminated") if statuses else None
        if terminated and terminated.get("exitCode") in (0, 1, 3):
            key = (labels["keelgate.dev/run"], labels["keelgate.dev/step"])
            clean.setdefault(key, []).append(pod["metadata"]["name"])
    doubles = {k: v for k, v in clean.items() if len(v) > 1}
    assert not doubles, doubles


@pytest.fixture
def killer(cluster: Cluster, admin: Kube, tenant: str) -> Iterator[list[str]]:
    """SIGKILLs a random running step pod of the namespace every so often (the node agent's
    kill, as an OOM kill or a node fault); yields the names of the pods it killed."""
    killed: list[str] = []
    stop = threading.Event()
    rng = random.Random(7)

    def loop() -> None:
        while not stop.wait(rng.uniform(0.3, 1.2)):
            try:
                pods = admin.get(f"/api/v1/namespaces/{tenant}/pods")["items"]
            except ApiError:
                continue
            running = [
                p
                for p in pods
                if p.get("status", {}).get("phase") == "Running"
                and p["metadata"]["name"] not in killed
                # at most two kills in a row per run: below the operator's crash limit
                and p["metadata"]["labels"].get("keelgate.dev/attempt") in ("1", "2")
            ]
            if not running:
                continue
            victim = rng.choice(running)
            try:
                kill_container(cluster.node_state_dir, victim["metadata"]["uid"], "step")
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            killed.append(victim["metadata"]["name"])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield killed
    stop.set()
    thread.join(timeout=5)


def test_step_pods_killed_at_random_moments_never_repeat_a_write(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    killer: list[str],
) -> None:
    """Eight three-step runs while step pods are SIGKILLed at random moments (mid-plan, mid-
    WRITE, mid-checkpoint; the shop answers slowly so WRITEs are caught in flight): every run
    finishes and no order is placed twice."""
    shop.shop.delay = 0.4
    docs = _three_step_runs(shop, "kill", 8)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=400)
    assert len(killer) >= 5, killer
    _check_exactly_once(operator.cluster.dsn, tenant, names, shop)
    _no_step_ran_twice(admin, tenant)


def test_the_operator_killed_mid_run_loses_no_step_and_duplicates_no_pod(
    operator: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """The operator SIGKILLed five times while six three-step runs are under way, restarted
    each time: every run finishes, no step ran in two pods, no order twice."""
    shop.shop.delay = 0.2
    docs = _three_step_runs(shop, "opk", 6)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    for _ in range(5):
        time.sleep(1.5)
        operator.kill()
        time.sleep(0.5)
        operator.start()
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _check_exactly_once(operator.cluster.dsn, tenant, names, shop)
    _no_step_ran_twice(admin, tenant)


def test_two_operators_at_once_never_run_a_write_twice(
    operator: OperatorPod,
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """A second operator started by mistake beside the first: both watch and act on the same
    runs; deterministic pod names, adoption by owner UID and the store's one-driver rule keep
    every step in one pod and every order single."""
    second = OperatorProcess(
        cluster, operator.kubeconfig, name="operator-2", env=dict(operator.env)
    )
    second.start()
    try:
        docs = _three_step_runs(shop, "twin", 6)
        names = [d["metadata"]["name"] for d in docs]
        apply(kubectl, *docs)
        runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    finally:
        second.stop()
    _check_exactly_once(cluster.dsn, tenant, names, shop)
    _no_step_ran_twice(admin, tenant)


def _pg_ready(cluster: Cluster) -> bool:
    import psycopg

    with psycopg.connect(cluster.dsn, connect_timeout=2) as conn:
        return conn.execute("SELECT 1").fetchone() == (1,)


def test_postgres_restarted_mid_run_every_run_finishes_once(
    operator: OperatorPod,
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """PostgreSQL stopped and started again while runs are mid-step: step pods and the
    operator lose their sessions (a WRITE in flight then reads as unknown, settled truthfully),
    reconnect, and every run finishes with each order once."""
    shop.shop.delay = 0.3
    docs = _three_step_runs(shop, "pg", 5)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    time.sleep(2)
    cluster.restart("postgres", lambda: _pg_ready(cluster))
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _check_exactly_once(cluster.dsn, tenant, names, shop)


def test_the_api_server_restarted_mid_run_every_run_finishes_once(
    operator: OperatorPod,
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """The kube-apiserver killed and started again mid-run: the operator's watches and the node
    agent reconnect, and every run finishes with each order once."""
    shop.shop.delay = 0.3
    docs = _three_step_runs(shop, "api", 5)
    names = [d["metadata"]["name"] for d in docs]
    apply(kubectl, *docs)
    time.sleep(2)

    def ready() -> bool:
        return admin.text("/readyz") == "ok"

    cluster.restart("kube-apiserver", ready, kill=True)
    runs.drive_to_success(admin, alice, tenant, names, shop, timeout=300)
    _check_exactly_once(cluster.dsn, tenant, names, shop)


def test_a_step_pod_deleted_while_the_api_server_was_away_does_not_stall_its_run(
    operator: OperatorPod,
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
) -> None:
    """A step pod deleted while every watch was away (removed from etcd while the kube-apiserver
    was down, so no watch ever reports it; kopf lists the pods again on reconnecting) is not
    waited for forever: the operator's resync (which outlives the server's absence) finds it
    gone, the run takes its next attempt and finishes, with each order once, and the operator
    counts no step pod it does not have."""
    shop.shop.delay = 3.0  # the first WRITE is slow: its step pod is caught running
    doc = agentrun("vanish", shop, [[order("vanish-a", 1)], [order("vanish-b", 2)]])
    apply(kubectl, doc)

    victim = wait_for(lambda: _running_step_pod(admin, tenant, "vanish"), timeout=120)
    # Away longer than a resync (10 s here): one runs while the server is away.
    _delete_behind_the_servers_back(cluster, admin, f"/registry/pods/{tenant}/{victim}", away=12)
    with pytest.raises(ApiError):
        admin.get(f"/api/v1/namespaces/{tenant}/pods/{victim}")
    runs.drive_to_success(admin, alice, tenant, ["vanish"], shop, timeout=240)
    _check_exactly_once(cluster.dsn, tenant, ["vanish"], shop)

    wait_for(
        lambda: _metric(operator, "keelgate_step_pods_active") == 0,
        timeout=60,
        what="no step pod counted as active",
    )


def test_a_run_deleted_while_the_api_server_was_away_gets_no_further_step_pod(
    operator: OperatorPod,
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    shop: ShopServer,
) -> None:
    """An AgentRun deleted while every watch was away (removed from etcd while the
    kube-apiserver was down) is not driven on from the operator's memory: once its step pod is
    gone (the garbage collector deletes it: its owner is missing), the operator's first status
    write finds the run gone and makes no further step pod for it, and it counts none."""
    shop.shop.delay = 3.0
    doc = agentrun("forgotten", shop, [[order("forgotten-a", 1)], [order("forgotten-b", 2)]])
    apply(kubectl, doc)
    pods = f"/api/v1/namespaces/{tenant}/pods"
    selector = {"labelSelector": "keelgate.dev/run=forgotten"}
    wait_for(lambda: _running_step_pod(admin, tenant, "forgotten"), timeout=120)
    started = _metric(operator, "keelgate_steps_started_total")
    _delete_behind_the_servers_back(
        cluster, admin, f"/registry/keelgate.dev/agentruns/{tenant}/forgotten"
    )
    wait_for(lambda: not admin.get(pods, selector)["items"], timeout=120, what="its pod gone")
    time.sleep(15)  # past a resync of the operator (10 s here) and the pod's deletion event
    assert not admin.get(pods, selector)["items"]
    assert _metric(operator, "keelgate_steps_started_total") == started
    wait_for(
        lambda: _metric(operator, "keelgate_step_pods_active") == 0,
        timeout=60,
        what="no step pod counted as active",
    )


def _running_step_pod(admin: Kube, namespace: str, run: str) -> str | None:
    """The name of a running step pod of ``run``, if there is one."""
    pods = admin.get(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"keelgate.dev/run={run}"}
    )["items"]
    names = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    return names[0] if names else None


def _delete_behind_the_servers_back(
    cluster: Cluster, admin: Kube, key: str, *, away: float = 0.0
) -> None:
    """Kill the kube-apiserver, delete ``key`` from etcd, start the server again: an object
    deleted while every watch was away, which no watch will ever report."""
    deleted: list[int] = []
    cluster.restart(
        "kube-apiserver",
        lambda: admin.text("/readyz") == "ok",
        kill=True,
        away=away,
        while_down=lambda: deleted.append(cluster.delete_from_etcd(key)),
    )
    assert deleted == [1], f"{key} was not in etcd"


def _metric(operator: OperatorPod, name: str) -> float:
    """The value of one unlabelled metric the operator serves."""
    lines = operator.metrics().splitlines()
    return next(float(line.split()[-1]) for line in lines if line.startswith(f"{name} "))


def test_the_api_servers_404_for_a_missing_run_or_pod_names_it(
    cluster: Cluster, tenant: str
) -> None:
    """What the operator takes for proof that an object is gone: the real kube-apiserver's 404
    for a missing AgentRun's status or a missing pod names that object (``details.name``), so
    a 404 that names nothing (a server still starting) is never taken for a deletion."""
    from keelgate.kube.api import ClusterApi, Gone
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
    api = ClusterApi(client)
    with pytest.raises(Gone) as run:
        api.patch_status("AgentRun", tenant, "never-was", {"phase": "Running"})
    with pytest.raises(Gone) as pod:
        api.read_pod(tenant, "never-was-s1-a1")
    assert (run.value.named, pod.value.named) == ("never-was", "never-was-s1-a1")
    assert api.running_step_pods(tenant) == []
