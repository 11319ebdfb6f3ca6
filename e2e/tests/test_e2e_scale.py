"""Many runs at once on one operator: 50 AgentRuns applied together (a mix of 1- and 5-iteration
runs, some crashing after their WRITE and settled by a script), with the operator's cap on
concurrent step pods (issue 12's scale test, smaller than its 500-run benchmark).

What a cluster user relies on at scale: every run finishes, every WRITE reaches the shop exactly
once, the step-pod cap holds, PostgreSQL connections are bounded by the cap rather than by the
number of runs, and the operator's API writes per step stay small. It must never settle an
outcome against the shop's record.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import psycopg
import pytest

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod, tenant_dsn
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import agentrun, apply, look, order
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl

pytestmark = pytest.mark.e2e

CAP = 8


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _runs(shop: ShopServer) -> list[JSON]:
    docs: list[JSON] = []
    for n in range(50):
        if n % 2:
            plans = [[look(f"l{n}")], [order(f"w{n}", 1)], [look(f"m{n}")], [look(f"n{n}")]]
        else:
            plans = []  # a one-iteration run: done at once
        annotations = {"keelgate.dev/failpoints": "after_gateway_call@1"} if n % 10 == 1 else None
        if annotations:  # the crash hits the WRITE: its iteration comes first
            plans = [[order(f"w{n}", 1)], [look(f"l{n}")], [look(f"m{n}")], [look(f"n{n}")]]
        docs.append(agentrun(f"s{n}", shop, plans, annotations=annotations))
    return docs


@pytest.fixture
def capped(operator: OperatorPod) -> Iterator[OperatorPod]:
    """The session's operator with a small step-pod cap, restored afterwards."""
    operator.install(f"operator.maxStepPods={CAP}")
    yield operator
    operator.install()


# The 50 runs, and the operator's reinstall without the cap afterwards, outlast the suite's
# default 300 s on a loaded two-core machine; the drive itself is bounded at 900 s.
@pytest.mark.timeout(1500)
def test_fifty_runs_at_once_finish_with_each_write_once_under_the_cap(
    capped: OperatorPod,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """50 runs applied together: all succeed; each WRITE once (the five that crash after their
    order are settled executed from the shop's record); never more than CAP step pods at once;
    PostgreSQL sessions bounded by the cap (not the 50 runs); at most 4 API writes per step."""
    before = capped.metrics()
    docs = _runs(shop)
    names = [d["metadata"]["name"] for d in docs]
    peaks = {"pods": 0, "sessions": 0}
    stop = threading.Event()

    own = tenant_dsn(cluster, tenant).rsplit("/", 1)[1]  # the tenant's database

    def watch() -> None:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            while not stop.wait(0.5):
                pods = admin.get(
                    f"/api/v1/namespaces/{tenant}/pods",
                    {"labelSelector": "app.kubernetes.io/name=keelgate-step"},
                )["items"]
                active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname IN "
                    "(current_database(), %s)",
                    (own,),
                ).fetchone()
                peaks["pods"] = max(peaks["pods"], len(active))
                peaks["sessions"] = max(peaks["sessions"], int(row[0]) if row else 0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        apply(kubectl, *docs)
        runs.drive_to_success(admin, alice, tenant, names, shop, timeout=900)
    finally:
        stop.set()
        watcher.join(timeout=10)
    counts = shop.shop.by_key()
    assert len(counts) == 25 and set(counts.values()) == {1}, counts
    assert 0 < peaks["pods"] <= CAP, peaks
    # Each step pod holds at most two sessions (its owner session and one pooled); the
    # operator a pool of eight and one on the tenant's database; this watcher one. Fifty runs
    # at once would need far more.
    assert peaks["sessions"] <= 2 * CAP + 8 + 1 + 1 + 2, peaks
    after = capped.metrics()
    steps = _metric(after, "keelgate_steps_started_total") - _metric(
        before, "keelgate_steps_started_total"
    )
    writes = _metric(after, "keelgate_api_writes_total") - _metric(
        before, "keelgate_api_writes_total"
    )
    assert steps >= 50 + 25 * 3
    by_kind = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in after.splitlines()
        if line.startswith("keelgate_api_writes_total{")
    }
    # Collecting finished pods past the newest three of a run is its own cost: at most one
    # delete per step pod, never asked twice; the rest drives the runs.
    deletes = _metric(after, 'keelgate_api_writes_total{what="delete Pod"}') - _metric(
        before, 'keelgate_api_writes_total{what="delete Pod"}'
    )
    assert deletes <= steps, (deletes, steps)
    assert (writes - deletes) / steps <= 4.0, (writes, deletes, steps, by_kind)
    assert re.search(r'keelgate_runs\{phase="Succeeded"\} \d+', after)
