"""What an operator costs at rest as history piles up: memory, CPU and store reads (issue 25).

A platform team runs the operator for months: finished runs accumulate, and some runs wait for a
person for days. Neither may make the operator grow or spin. Measured side by side in one run on
a private local cluster (real kube-apiserver, etcd, controller-manager, scheduler, the node agent
and PostgreSQL, built by `e2e/`), with the operator under its own service account and a short
resync (10 s, three times the chart's rate, so each minute holds six resyncs):

1. **Empty**: the operator with no runs: RSS, CPU per minute, store transactions per minute.
2. **Finished**: 5,000 finished AgentRuns whose step pods were collected.
3. **Waiting, 100**: the same, plus 100 runs waiting for a person (each with its Approval).
4. **Waiting, 1,000**: the same, with 1,000 runs waiting.

The runs are real: one run is driven to its goal and one to an approval by the operator with
real step pods, and their records in the store (checkpoint, recorded spec) are copied under new
names, as thousands of real runs would have left them; the AgentRuns are then applied with the
same specs, so the operator reads each as finished, or waiting, exactly as it would the
originals. Each phase is measured after the operator has gone quiet (no API write for 15 s).
Targets: RSS < 250 MB, CPU < 2% of a core at rest; store reads per minute not growing with the
number of waiting runs.

Run: `.venv/bin/python bench/operator_idle.py` (about 10 minutes). It must never touch `.dev/`
or another cluster: everything runs under a temporary directory and is stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from keelgate_e2e import keelgate as kg  # noqa: E402 - the local cluster lives in e2e/
from keelgate_e2e.cluster import Cluster  # noqa: E402
from keelgate_e2e.kube import Kube  # noqa: E402
from keelgate_e2e.shop import ShopServer  # noqa: E402

from cluster_steps import cpu_seconds, metric, namespace, rss_mb  # noqa: E402

JSON = dict[str, Any]
NS = "idle"
RUNS = f"/apis/keelgate.dev/v1alpha1/namespaces/{NS}/agentruns"


def run_doc(name: str, shop: ShopServer, *, approval: bool) -> JSON:
    """A run that reads once and orders once; with ``approval`` its order waits for a person."""
    script: list[JSON] = [
        {"actions": [{"tool": "get_inventory", "args": {"sku": "A1"}}]},
        {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 1}}]},
        {"done": True, "answer": "done"},
    ]
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": "bench idle",
            "model": {"provider": "scripted", "name": "demo", "script": script},
            "tools": [
                {
                    "name": "get_inventory",
                    "sideEffect": "READ",
                    "http": {"url": f"{shop.url}/items/{{sku}}", "method": "GET"},
                },
                {
                    "name": "place_order",
                    "sideEffect": "WRITE",
                    "requiresApproval": approval,
                    "http": {"url": f"{shop.url}/orders", "method": "POST"},
                },
            ],
            "budget": {"maxIterations": 5},
        },
    }


def wait_phase(admin: Kube, name: str, phase: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = admin.get(f"{RUNS}/{name}").get("status") or {}
        if status.get("phase") == phase:
            return
        time.sleep(0.5)
    raise SystemExit(f"{name} did not reach {phase}")


def clone(dsn: str, template: str, names: list[str]) -> None:
    """Copy the template run's checkpoint and recorded spec under each name, as if each had run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, columns in (
            ("keelgate_checkpoints", "seq, state"),
            ("keelgate_specs", "source, generation, spec"),
        ):
            row = conn.execute(
                f"SELECT {columns} FROM {table} WHERE tenant = %s AND run = %s", (NS, template)
            ).fetchone()
            assert row is not None, f"{template} has no row in {table}"
            marks = ", ".join(["%s"] * (len(row) + 2))
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {table} (tenant, run, {columns}) VALUES ({marks})",
                    [
                        (
                            NS,
                            name,
                            *(v.replace(template, name) if isinstance(v, str) else v for v in row),
                        )
                        for name in names
                    ],
                )


def apply_runs(admin: Kube, docs: list[JSON]) -> None:
    for doc in docs:
        admin.create(RUNS, doc)


def transactions(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def quiet(operator: kg.OperatorProcess, *, calm: float = 15.0, timeout: float = 900.0) -> float:
    """Wait until the operator has made no API write for ``calm`` seconds; how long it took."""
    started = time.monotonic()
    last, since = metric(operator.metrics(), "keelgate_api_writes_total"), time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(1.0)
        now = metric(operator.metrics(), "keelgate_api_writes_total")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= calm:
            return time.monotonic() - started
    raise SystemExit("the operator did not go quiet")


def measure(operator: kg.OperatorProcess, dsn: str, seconds: float) -> JSON:
    """The operator at rest for ``seconds``: RSS, CPU share of a core, store transactions and
    API writes per minute."""
    assert operator.proc is not None
    pid = operator.proc.pid
    with psycopg.connect(dsn, autocommit=True) as conn:
        cpu0, tx0 = cpu_seconds(pid), transactions(conn)
        writes0 = metric(operator.metrics(), "keelgate_api_writes_total")
        start = time.monotonic()
        time.sleep(seconds)
        took = time.monotonic() - start
        cpu1, tx1 = cpu_seconds(pid), transactions(conn)
        writes1 = metric(operator.metrics(), "keelgate_api_writes_total")
    per_minute = 60.0 / took
    return {
        "rss_mb": round(rss_mb(pid), 1),
        "cpu_percent_of_a_core": round(100.0 * (cpu1 - cpu0) / took, 2),
        # Less the measurement's own two transactions.
        "store_transactions_per_minute": round(max(0, tx1 - tx0 - 2) * per_minute, 1),
        "api_writes_per_minute": round((writes1 - writes0) * per_minute, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=5000)
    parser.add_argument("--waiting", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0, help="each measurement's length")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="keelgate-bench-"))
    cluster = Cluster(work / "cluster", postgres=True)
    cluster.start()
    shop = ShopServer().start()
    admin = cluster.client()
    report: dict[str, Any] = {"resync_seconds": 10}
    try:
        kg.install(admin)
        config = kg.operator_kubeconfig(cluster, admin, work / "operator.kubeconfig")
        operator = kg.OperatorProcess(
            cluster, config, allow_failpoints=False, extra_args=("--resync=10",)
        )
        operator.start()
        namespace(admin, cluster, NS)
        quiet(operator)
        report["empty"] = measure(operator, cluster.dsn, args.seconds)

        # The two template runs, driven for real by the operator and its step pods.
        apply_runs(admin, [run_doc("tmpl-done", shop, approval=False)])
        apply_runs(admin, [run_doc("tmpl-wait", shop, approval=True)])
        wait_phase(admin, "tmpl-done", "Succeeded")
        wait_phase(admin, "tmpl-wait", "Stopped")

        finished = [f"done-{n:05d}" for n in range(args.finished)]
        clone(cluster.dsn, "tmpl-done", finished)
        started = time.monotonic()
        apply_runs(admin, [run_doc(n, shop, approval=False) for n in finished])
        report["finished_settle_seconds"] = round(time.monotonic() - started + quiet(operator), 1)
        report[f"finished_{args.finished}"] = measure(operator, cluster.dsn, args.seconds)

        first = max(1, args.waiting // 10)
        for count, names in (
            (first, [f"wait-{n:05d}" for n in range(first)]),
            (args.waiting, [f"wait-{n:05d}" for n in range(first, args.waiting)]),
        ):
            clone(cluster.dsn, "tmpl-wait", names)
            apply_runs(admin, [run_doc(n, shop, approval=True) for n in names])
            quiet(operator)
            report[f"waiting_{count}"] = measure(operator, cluster.dsn, args.seconds)

        created_pods = metric(operator.metrics(), 'keelgate_api_writes_total{what="create Pod"}')
        report["step_pods_created"] = int(created_pods)  # the two templates' steps only
        report["orders"] = shop.shop.count()
        operator.stop()
    finally:
        admin.close()
        shop.stop()
        cluster.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
