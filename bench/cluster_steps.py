"""The operator on the local control plane: step start, hand-off, API writes, memory, throughput.

What a cluster user pays for running a loop one pod per step, measured side by side in one run
on a private local cluster (real kube-apiserver, etcd, controller-manager, scheduler, the node
agent and PostgreSQL, built by `e2e/`), with the operator under its own service account:

1. **Step start**: `keelgate step` from exec to exit for a run whose checkpoint is final (it
   loads the spec and the checkpoint and stops at once), over 20 starts, against a bare
   `python -c pass` and `python -c "import keelgate"` started the same way: an upper bound on
   "exec to checkpoint loaded". Target < 0.4 s.
2. **Hand-off**: from a step pod seen ended (a watch event) to the next step pod of the same run
   seen created, over at least 100 steps. Target p95 < 1 s.
3. **API writes per step**: the operator's own count of writes (pods, status patches, Events,
   children) over the steps it started, from its /metrics.
4. **Many runs at once** (issue 12): 500 AgentRuns applied together, half of one iteration and
   half of five with a WRITE, one in ten of those crashing after its WRITE and settled by a
   script from the shop's record, under the step-pod cap: runs per minute, hand-off p50/p95, API
   writes and status patches per step, the operator's peak RSS and CPU, PostgreSQL sessions, and
   that every WRITE reached the shop once.

Run: `make bench-cluster` (or `.venv/bin/python bench/cluster_steps.py`). It must never
touch `.dev/` or another cluster: everything runs under a temporary directory and is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from keelgate_e2e import keelgate as kg  # noqa: E402 - the local cluster lives in e2e/
from keelgate_e2e.cluster import Cluster  # noqa: E402
from keelgate_e2e.kube import Kube  # noqa: E402
from keelgate_e2e.shop import ShopServer  # noqa: E402

JSON = dict[str, Any]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """The operator's RSS (its process; the keelgate console script execs Python in place)."""
    return rss_mb(pid)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def scale_docs(shop: ShopServer, count: int) -> list[JSON]:
    """Half one-iteration runs, half five-iteration runs with a WRITE; one in ten of these
    crashes right after its WRITE (a failpoint) and waits for a Reconciliation."""
    docs = []
    for n in range(count):
        doc = run_doc(f"m{n}", shop, 1 if n % 2 == 0 else 5)
        if n % 2:
            write = {"tool": "place_order", "args": {"sku": f"m{n}", "qty": 1}}
            doc["spec"]["model"]["script"][0] = {"actions": [write]}
            doc["spec"]["tools"].append(
                {
                    "name": "place_order",
                    "sideEffect": "WRITE",
                    "http": {"url": f"{shop.url}/orders", "method": "POST"},
                }
            )
            if n % 10 == 1:
                doc["metadata"]["annotations"] = {"keelgate.dev/failpoints": "after_gateway_call@1"}
        docs.append(doc)
    return docs


def settle_from_shop(admin: Kube, ns: str, shop: ShopServer) -> None:
    """What a person (or a script of theirs) does: settle each unknown outcome with what the
    shop's record says, in their own name."""
    listed = admin.get(f"/apis/keelgate.dev/v1alpha1/namespaces/{ns}/reconciliations")
    for rec in listed["items"]:
        if "executed" in rec["spec"]:
            continue
        executed = shop.shop.by_key()[rec["spec"]["idempotencyKey"]] > 0
        admin.patch(
            f"/apis/keelgate.dev/v1alpha1/namespaces/{ns}/reconciliations/"
            f"{rec['metadata']['name']}",
            {"spec": {"executed": executed, "by": "admin"}},
        )


def namespace(admin: Kube, cluster: Cluster, name: str) -> None:
    admin.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    kg.store_secret(admin, name, cluster.dsn)


def run_doc(name: str, shop: ShopServer, iterations: int) -> JSON:
    script: list[JSON] = [
        {"actions": [{"tool": "get_inventory", "args": {"sku": f"{name}-{i}"}}]}
        for i in range(iterations - 1)
    ]
    script.append({"done": True, "answer": "done"})
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": f"bench {name}",
            "model": {"provider": "scripted", "name": "demo", "script": script},
            "tools": [
                {
                    "name": "get_inventory",
                    "sideEffect": "READ",
                    "http": {"url": f"{shop.url}/items/{{sku}}", "method": "GET"},
                }
            ],
            "budget": {"maxIterations": iterations + 1},
        },
    }


class PodWatch:
    """Watch a namespace's pods; note when each step pod is first seen and seen ended."""

    def __init__(self, admin: Kube, ns: str) -> None:
        self.admin, self.ns = admin, ns
        self.created: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                for event in self.admin.watch(f"/api/v1/namespaces/{self.ns}/pods", {}, 60):
                    pod = event.get("object", {})
                    name = pod.get("metadata", {}).get("name")
                    if not name or event.get("type") == "BOOKMARK":
                        continue
                    now = time.monotonic()
                    self.created.setdefault(name, now)
                    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                        self.ended.setdefault(name, now)
                    if self.stop.is_set():
                        return
            except Exception:  # a dropped watch: start another
                time.sleep(0.2)

    def handoffs(self) -> list[float]:
        """Seconds from each step pod ended to its run's next step pod created."""
        pattern = re.compile(r"^(?P<run>.+)-s(?P<step>\d+)-a1$")
        by_run: dict[str, dict[int, str]] = {}
        for name in self.created:
            match = pattern.match(name)
            if match:
                by_run.setdefault(match["run"], {})[int(match["step"])] = name
        out = []
        for steps in by_run.values():
            for number, name in steps.items():
                following = steps.get(number + 1)
                if following and name in self.ended:
                    out.append(max(0.0, self.created[following] - self.ended[name]))
        return out


def wait_all(admin: Kube, ns: str, names: list[str], timeout: float) -> float:
    started = time.monotonic()
    pending = set(names)
    while pending:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"bench: {len(pending)} runs did not finish in {timeout:.0f}s")
        listed = admin.get(f"/apis/keelgate.dev/v1alpha1/namespaces/{ns}/agentruns")["items"]
        for run in listed:
            if run.get("status", {}).get("phase") == "Succeeded":
                pending.discard(run["metadata"]["name"])
        time.sleep(0.5)
    return time.monotonic() - started


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=False)
        out.append(time.perf_counter() - started)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoff-runs", type=int, default=20, help="runs of 6 steps each")
    parser.add_argument("--scale-runs", type=int, default=500, help="runs applied at once")
    parser.add_argument("--cap", type=int, default=20, help="the operator's step-pod cap")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="keelgate-bench-"))
    cluster = Cluster(work / "cluster", postgres=True)
    cluster.start()
    shop = ShopServer().start()
    admin = cluster.client()
    report: dict[str, Any] = {}
    try:
        kg.install(admin)
        config = kg.operator_kubeconfig(cluster, admin, work / "operator.kubeconfig")
        operator = kg.OperatorProcess(
            cluster, config, allow_failpoints=False, max_step_pods=args.cap
        )
        operator.start()
        assert operator.proc is not None

        # 2 and 3: hand-off and writes per step.
        namespace(admin, cluster, "handoff")
        watch = PodWatch(admin, "handoff")
        names = [f"h{n}" for n in range(args.handoff_runs)]
        for name in names:
            admin.create(
                "/apis/keelgate.dev/v1alpha1/namespaces/handoff/agentruns", run_doc(name, shop, 6)
            )
        took = wait_all(admin, "handoff", names, timeout=900)
        watch.stop.set()
        handoffs = watch.handoffs()
        text = operator.metrics()
        steps = metric(text, "keelgate_steps_started_total")
        writes = metric(text, "keelgate_api_writes_total")
        report["handoff"] = {
            "steps": int(steps),
            "handoffs_measured": len(handoffs),
            "p50_s": round(quantile(handoffs, 0.5), 3),
            "p95_s": round(quantile(handoffs, 0.95), 3),
            "max_s": round(max(handoffs), 3),
        }
        report["api_writes_per_step"] = round(writes / steps, 2)
        report["writes_by_kind"] = {
            line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("keelgate_api_writes_total{")
        }
        report["handoff_runs_per_minute"] = round(len(names) / took * 60, 1)

        # 1: step start, on a finished run of the hand-off batch.
        env = {**os.environ, "KEELGATE_STORE": cluster.dsn}
        keelgate = str(Path(sys.executable).parent / "keelgate")
        step = timed([keelgate, "step", "-n", "handoff", "--run", "h0"], env, 20)
        bare = timed([sys.executable, "-c", "pass"], env, 20)
        imported = timed([sys.executable, "-c", "import keelgate"], env, 20)
        report["step_start"] = {
            "keelgate_step_median_s": round(statistics.median(step), 3),
            "keelgate_step_p95_s": round(quantile(step, 0.95), 3),
            "python_pass_median_s": round(statistics.median(bare), 3),
            "import_keelgate_median_s": round(statistics.median(imported), 3),
            "ratio_to_bare_python": round(statistics.median(step) / statistics.median(bare), 1),
        }

        # 4: many runs at once (issue 12): a mix of 1- and 5-iteration runs, one in ten
        # crashing after its WRITE and settled by a script from the shop's record.
        namespace(admin, cluster, "many")
        watch = PodWatch(admin, "many")
        before_metrics = operator.metrics()
        pid = operator.proc.pid
        rss_before = tree_rss_mb(pid)
        cpu_before = cpu_seconds(pid)
        docs = scale_docs(shop, args.scale_runs)
        names = [d["metadata"]["name"] for d in docs]
        peaks = {"rss": rss_before, "sessions": 0.0}
        done = threading.Event()

        def sample() -> None:
            import psycopg

            with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                while not done.wait(0.5):
                    peaks["rss"] = max(peaks["rss"], tree_rss_mb(pid))
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    ).fetchone()
                    peaks["sessions"] = max(peaks["sessions"], float(row[0]) if row else 0.0)
                    settle_from_shop(admin, "many", shop)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        for doc in docs:
            admin.create("/apis/keelgate.dev/v1alpha1/namespaces/many/agentruns", doc)
        wait_all(admin, "many", names, timeout=3600)
        took = time.monotonic() - started
        done.set()
        sampler.join()
        watch.stop.set()
        after = operator.metrics()
        steps = metric(after, "keelgate_steps_started_total") - metric(
            before_metrics, "keelgate_steps_started_total"
        )
        writes = metric(after, "keelgate_api_writes_total") - metric(
            before_metrics, "keelgate_api_writes_total"
        )
        patches = metric(after, 'keelgate_api_writes_total{what="patch AgentRun/status"}') - metric(
            before_metrics, 'keelgate_api_writes_total{what="patch AgentRun/status"}'
        )
        handoffs = watch.handoffs()
        counts = shop.shop.by_key()
        report["many_runs"] = {
            "runs": len(names),
            "steps": int(steps),
            "cap": args.cap,
            "runs_per_minute": round(len(names) / took * 60, 1),
            "handoff_p50_s": round(quantile(handoffs, 0.5), 3),
            "handoff_p95_s": round(quantile(handoffs, 0.95), 3),
            "api_writes_per_step": round(writes / steps, 2),
            "status_patches_per_step": round(patches / steps, 2),
            "operator_rss_before_mb": round(rss_before, 1),
            "operator_rss_peak_mb": round(peaks["rss"], 1),
            "operator_cpu_seconds": round(cpu_seconds(pid) - cpu_before, 1),
            "postgres_sessions_peak": int(peaks["sessions"]),
            "writes_exactly_once": bool(counts) and max(counts.values()) == 1,
        }
        operator.stop()
    finally:
        admin.close()
        shop.stop()
        cluster.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
