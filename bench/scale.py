"""One operator, thousands of runs, on kwok's fake nodes: throughput, hand-off, cost (issue 40).

What a platform team asks before trusting one operator with its cluster: how many step pods a
second it drives, how fast a run goes on after a step, and what each step costs the operator,
the API server and PostgreSQL, at 1,000, 5,000 and 10,000 AgentRuns under way at once. Measured
on the local control plane (real etcd, kube-apiserver, controller-manager, scheduler and
PostgreSQL, built by ``e2e/``) with kwok's fake nodes (1,000 by default) in place of kubelets,
and the hollow step executor (``scalebench.executor``) running each step pod's real ``keelgate
step`` (its checkpoints, its claim, its WRITE to a loopback shop) and reporting its end in the
pod's status as a kubelet does. The operator runs unchanged under its own service account.

For each number of runs N (``--runs``): N runs are created and kept in flight (each finished
run deleted and replaced: ``scalebench.load``); after ``--warmup`` seconds a window of
``--window`` seconds (600 by default) is measured:

- step pods a second (created in the window, seen through a watch);
- hand-off: a step pod's end seen to its run's next pod seen created, p50 and p99;
- AgentRun created to its first pod seen, p99 (runs created in the window, as replacements);
- the operator's CPU per step, its RSS (peak, sampled each second), and its API requests per
  step by verb, counted from the API server's audit log (the operator's user only);
- PostgreSQL sessions and transactions per step (``pg_stat_database``), sessions at the peak;
- each component's share of the two cores, and py-spy's profile of the operator;
- and at the end, every WRITE once: each Idempotency-Key at most once at the shop, and each run
  that succeeded with exactly one order (asserted: the bench exits 1 otherwise).

Sharded replicas against one (issue 50): ``--replicas 1,2`` measures every number of runs with one
operator process, then again with two replicas sharing the runs (``--shards``, as many as the
replicas by default; each replica a process under the operator's account, with its own shard
and member Leases), on the same cluster and the same runs under way, and prints each figure of
the replicas beside the one operator's: hand-off p99, and the operator's CPU a step summed over
the replicas (the scale target: no higher than one replica's). Between blocks the replicas of
the last block stop cleanly (a rollout: runs no step pod drives are let go at once), and each
block's first window opens after its warm-up.

Run: ``make bench-scale`` (about 45 minutes for 1,000, 5,000 and 10,000 runs), or smaller:
``.venv/bin/python bench/scale.py --runs 100 --nodes 10 --window 60 --warmup 20``. Everything
runs under a temporary directory and is stopped at the end, whatever happens; it never touches
``.dev/`` or another cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from keelgate_e2e import keelgate as kg  # noqa: E402 - the local cluster lives in e2e/
from keelgate_e2e import procs  # noqa: E402
from keelgate_e2e.cluster import Cluster  # noqa: E402
from keelgate_e2e.kube import Kube  # noqa: E402
from keelgate_e2e.shop import ShopServer  # noqa: E402

from scalebench import counting, report  # noqa: E402
from scalebench.kwok import CONTROLLER_ARGS, Kwok  # noqa: E402
from scalebench.load import Load  # noqa: E402
from scalebench.sample import Peaks, metric_sum, profile, rss_mb, snapshot  # noqa: E402
from scalebench.watch import STEP_SELECTOR, PodTimes, RunEnds, Watch  # noqa: E402

OPERATOR_USER = f"system:serviceaccount:{kg.SYSTEM}:{kg.OPERATOR_SA}"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
- level: None
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def audit_lines(path: Path, offset: int) -> list[str]:
    with path.open("rb") as log_file:
        log_file.seek(offset)
        return log_file.read().decode("utf-8", "replace").splitlines()


def measure(
    n: int,
    args: argparse.Namespace,
    *,
    load: Load,
    pods: PodTimes,
    peaks: Peaks,
    pids: dict[str, int],
    operators: list[kg.OperatorProcess],
    dsn: str,
    audit_log: Path,
    work: Path,
    py_spy: str | None,
) -> dict[str, Any]:
    """One number of runs: ramp to ``n``, warm up, measure a window; the phase's figures (the
    operator's summed over its replicas)."""
    replicas = [operator.proc.pid for operator in operators if operator.proc is not None]
    assert len(replicas) == len(operators)
    log(f"{n} runs: creating (load average {os.getloadavg()[0]:.2f})")
    ramp_start = time.monotonic()
    before = len(load.created)
    load.set_target(n)
    while load.issued() > len(load.created) + load.create_failures:
        time.sleep(0.5)
    ramp = time.monotonic() - ramp_start
    log(f"{n} runs: {len(load.created) - before} created in {ramp:.0f}s")
    # Steady state: every run under way has had its first pod (the burst of the ramp is over).
    deadline = time.monotonic() + args.ramp_timeout
    while time.monotonic() < deadline:
        with load.lock:
            runs = [name for _, name in load.in_flight]
        created, _ = pods.copy()
        missing = sum(1 for name in runs if f"{name}-s1-a1" not in created)
        if missing <= n // 100:
            break
        time.sleep(2.0)
    log(f"{n} runs: first pods made {time.monotonic() - ramp_start:.0f}s after the ramp began")
    # And the hand-offs the ramp held up are made: at most one run in 200 has a step pod ended
    # without its next pod (a window opened on that backlog measures the ramp, not the state).
    while time.monotonic() < deadline:
        created, ended = pods.copy()
        waiting = counting.waiting_handoffs(created, ended)
        if waiting <= max(5, n // 200):
            break
        time.sleep(5.0)
    log(f"{n} runs: steady {time.monotonic() - ramp_start:.0f}s after the ramp began")
    time.sleep(args.warmup)

    offset = audit_log.stat().st_size
    peaks.reset()
    s0 = snapshot(pids, dsn, _metrics(operators))
    profiled: dict[str, Path | None] = {}
    spy = None
    if py_spy and args.profile_seconds:
        out = work / f"operator-{len(operators)}r-{n}.collapsed"

        def spy_run() -> None:
            time.sleep(max(0.0, (args.window - args.profile_seconds) / 2))
            profiled["operator"] = profile(replicas[0], args.profile_seconds, out, py_spy)

        spy = threading.Thread(target=spy_run, daemon=True)
        spy.start()
    log(f"{n} runs: measuring {args.window:.0f}s (load average {os.getloadavg()[0]:.2f})")
    time.sleep(args.window)
    s1 = snapshot(pids, dsn, _metrics(operators))
    rss_end = {pid: rss_mb(pid) for pid in replicas}
    time.sleep(args.settle)  # the next pods of the window's last ends, and the audit batch
    if spy is not None:
        spy.join(timeout=args.profile_seconds + 30)
    created, ended = pods.copy()
    start, end = s0["mono"], s1["mono"]
    took = end - start

    steps = int(
        metric_sum(s1["metrics"], "keelgate_steps_started_total")
        - metric_sum(s0["metrics"], "keelgate_steps_started_total")
    )
    handoffs = counting.handoffs(created, ended, start, end)
    with load.lock:
        runs_created = dict(load.created)
    first = counting.first_pods(runs_created, created, start, end)
    requests = counting.audit_requests(
        audit_lines(audit_log, offset), OPERATOR_USER, s0["wall"], s1["wall"]
    )
    cpu = {name: s1["cpu"][name] - s0["cpu"][name] for name in pids}
    operator_cpu = sum(cpu[name] for name in pids if name.startswith("operator"))
    rss_peaks = [max(peaks.rss.get(pid, 0.0), rss_end[pid]) for pid in replicas]
    machine = s1["machine_cpu"] - s0["machine_cpu"]
    executor_counts: dict[str, Any] = {}
    with_counts = work / "executor" / "executor.json"
    if with_counts.exists():
        executor_counts = json.loads(with_counts.read_text())
    # Summed over the replicas, as the steps are: each replica's text has a line of each.
    writes_by_what = {}
    for line in s1["metrics"].splitlines():
        if line.startswith("keelgate_api_writes_total{"):
            what = line.split('"')[1]
            writes_by_what[what] = round(
                counting.per_step(
                    metric_sum(s1["metrics"], "keelgate_api_writes_total", f'"{what}"')
                    - metric_sum(s0["metrics"], "keelgate_api_writes_total", f'"{what}"'),
                    steps,
                ),
                3,
            )
    phase: dict[str, Any] = {
        "runs": n,
        "replicas": len(operators),
        "shards": args.shards_now,
        "window_s": round(took, 1),
        "ramp_s": round(ramp, 1),
        "steps_started": steps,
        "step_pods_created": counting.in_window(created.values(), start, end),
        "step_pods_ended": counting.in_window(ended.values(), start, end),
        # Steps done: a pod is created at once after its predecessor ends, so in a steady
        # state the two rates agree; ends are what the cluster completed.
        "step_pods_per_second": round(counting.in_window(ended.values(), start, end) / took, 2),
        "step_pods_created_per_second": round(
            counting.in_window(created.values(), start, end) / took, 2
        ),
        "handoffs": len(handoffs),
        "handoff_p50_s": round(counting.quantile(handoffs, 0.5), 3),
        "handoff_p99_s": round(counting.quantile(handoffs, 0.99), 3),
        "handoff_max_s": round(max(handoffs, default=0.0), 3),
        "first_pods": len(first),
        "first_pod_p50_s": round(counting.quantile(first, 0.5), 3),
        "first_pod_p99_s": round(counting.quantile(first, 0.99), 3),
        "operator_cpu_s": round(operator_cpu, 1),
        "operator_cpu_ms_per_step": round(1000 * counting.per_step(operator_cpu, steps), 2),
        "operator_rss_peak_mb": round(max(rss_peaks), 1),
        "operator_rss_peak_summed_mb": round(sum(rss_peaks), 1),
        "operator_rss_end_mb": round(sum(rss_end.values()), 1),
        "api_requests_per_step": {
            f"{verb} {resource}": round(counting.per_step(count, steps), 3)
            for (verb, resource), count in sorted(requests.items())
        },
        "api_requests_per_step_by_verb": {
            verb: round(counting.per_step(count, steps), 3)
            for verb, count in sorted(counting.by_verb(requests).items())
        },
        "api_writes_per_step": round(counting.per_step(counting.writes(requests), steps), 3),
        "operator_counted_writes_per_step": writes_by_what,
        "pg_sessions_per_step": round(
            counting.per_step(s1["pg"]["sessions"] - s0["pg"]["sessions"], steps), 2
        ),
        "pg_transactions_per_step": round(
            counting.per_step(s1["pg"]["transactions"] - s0["pg"]["transactions"], steps), 2
        ),
        "pg_write_transactions_per_step": round(
            counting.per_step(
                s1["pg"]["write_transactions"] - s0["pg"]["write_transactions"], steps
            ),
            2,
        ),
        "pg_sessions_peak": peaks.sessions,
        "cores_used": {name: round(cpu[name] / took, 3) for name in sorted(cpu)},
        "cores_used_machine": round(machine / took, 3),
        "cores_used_elsewhere": round((machine - sum(cpu.values())) / took, 3),
        "load_average": {
            "start": round(s0["load"][0], 2),
            "end": round(s1["load"][0], 2),
            "mean_1min": round(sum(peaks.loads) / len(peaks.loads), 2) if peaks.loads else 0.0,
        },
        "executor": {
            "steps": executor_counts.get("steps", 0),
            "exit_codes": executor_counts.get("exit_codes", {}),
            "killed": executor_counts.get("killed", 0),
            "wait_p50_s": round(counting.quantile(executor_counts.get("waits", []), 0.5), 2),
            "step_p50_s": round(counting.quantile(executor_counts.get("spans", []), 0.5), 3),
            "step_p99_s": round(counting.quantile(executor_counts.get("spans", []), 0.99), 3),
        },
        "failed_pods_so_far": len(pods.failed),
    }
    collapsed = profiled.get("operator")
    if collapsed is not None:
        top = counting.collapsed_top(collapsed.read_text().splitlines())
        phase["operator_profile"] = top
        shutil.copy(collapsed, args.out / collapsed.name)
    log(
        f"{n} runs, {len(operators)} replica(s): {phase['step_pods_per_second']} pods/s, "
        "hand-off p50/p99 "
        f"{phase['handoff_p50_s']}/{phase['handoff_p99_s']} s, operator "
        f"{phase['operator_cpu_ms_per_step']} ms/step, {phase['api_writes_per_step']} writes/step"
    )
    return phase


def _metrics(operators: list[kg.OperatorProcess]) -> str:
    """Every replica's metrics in one text: a counter's samples then sum over the replicas."""
    return "\n".join(operator.metrics() for operator in operators)


#: What a sharded replica needs beyond the operator's ClusterRole (deploy/rbac.yaml), as the
#: chart's ``sharding.enabled`` grants it: the Leases of its release's namespace, and a patch of
#: an AgentRun (its shard label only, which the operator alone writes).
SHARD_RIGHTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{kg.SYSTEM}/roles",
        {
            "metadata": {"name": "scale-operator-lease"},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["list", "create", "get", "update", "delete"],
                }
            ],
        },
    ),
    (
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{kg.SYSTEM}/rolebindings",
        {
            "metadata": {"name": "scale-operator-lease"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "scale-operator-lease",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": kg.OPERATOR_SA, "namespace": kg.SYSTEM}
            ],
        },
    ),
    (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": "scale-operator-shard-label"},
            "rules": [
                {"apiGroups": ["keelgate.dev"], "resources": ["agentruns"], "verbs": ["patch"]}
            ],
        },
    ),
    (
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": "scale-operator-shard-label"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "scale-operator-shard-label",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": kg.OPERATOR_SA, "namespace": kg.SYSTEM}
            ],
        },
    ),
)


def grant_shard_rights(admin: Kube) -> None:
    for path, body in SHARD_RIGHTS:
        kind = "ClusterRole" if "clusterrole" in path else "Role"
        kind += "Binding" if path.endswith("bindings") else ""
        admin.create(path, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, **body})


def start_replicas(
    cluster: Cluster,
    config: Path,
    count: int,
    shards: int,
    args: argparse.Namespace,
    *,
    cap: int,
    block: int,
) -> list[kg.OperatorProcess]:
    """``count`` operator processes: one unsharded (as the bench always measured it), or
    ``count`` replicas sharing ``shards`` shards, each under its own identity."""
    operators = []
    for i in range(count):
        sharding = (
            (
                f"--shards={shards}",
                f"--lease-namespace={kg.SYSTEM}",
                f"--identity=scale-{block}-{i}",
            )
            if count > 1
            else ()
        )
        operator = kg.OperatorProcess(
            cluster,
            config,
            name=f"operator-{block}-{i}",
            allow_failpoints=False,
            max_step_pods=cap,
            extra_args=(
                f"--workers={args.workers}",
                f"--resync={args.resync}",
                *sharding,
                *args.operator_arg,
            ),
        )
        operator.start()
        assert operator.proc is not None
        cluster.adopt(operator.proc)
        operators.append(operator)
    return operators


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", default="1000,5000,10000", help="runs under way, per phase")
    parser.add_argument("--nodes", type=int, default=1000, help="kwok's fake nodes")
    parser.add_argument("--window", type=float, default=600.0, help="seconds measured per phase")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--ramp-timeout", type=float, default=1800.0)
    parser.add_argument("--parallel", type=int, default=12, help="steps the executor runs at once")
    parser.add_argument("--cap", type=int, default=0, help="--max-step-pods (0: runs + 1,000)")
    parser.add_argument("--workers", type=int, default=4, help="the operator's --workers")
    parser.add_argument(
        "--replicas",
        default="1",
        help="operator replicas, a block of phases each (1,2: one, then two sharded)",
    )
    parser.add_argument(
        "--shards", type=int, default=0, help="shards when replicas > 1 (0: one per replica)"
    )
    parser.add_argument("--resync", type=float, default=30.0, help="the operator's --resync")
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--profile-seconds", type=int, default=60, help="0: no py-spy profile")
    parser.add_argument("--operator-arg", action="append", default=[], help="more operator flags")
    parser.add_argument("--out", type=Path, default=None, help="where the JSON and profiles go")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNG plot here")
    args = parser.parse_args()
    # Stopped by a signal, it still stops everything it started (a background job's SIGINT is
    # ignored by the shell that started it: SIGTERM is the way to stop one).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sizes = [int(x) for x in args.runs.split(",") if x.strip()]
    blocks = [int(x) for x in args.replicas.split(",") if x.strip()]
    if not blocks or min(blocks) < 1:
        parser.error("--replicas: give counts of at least 1, such as 1,2")
    cap = args.cap or max(sizes) + 1000
    work = Path(tempfile.mkdtemp(prefix="keelgate-scale-"))
    args.out = args.out or work / "out"
    args.out.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")

    (work / "audit").mkdir()
    policy = work / "audit" / "policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = work / "audit" / "audit.log"
    cluster = Cluster(
        work / "cluster",
        node=False,
        postgres=True,
        apiserver_args=(
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=batch",
            "--audit-log-maxsize=0",
        ),
        controller_manager_args=CONTROLLER_ARGS,
    )
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "settings": {
            "nodes": args.nodes,
            "cap": cap,
            "workers": args.workers,
            "resync_s": args.resync,
            "executor_parallel": args.parallel,
            "namespaces": args.namespaces,
            "operator_args": args.operator_arg,
            "replicas": blocks,
            "shards": args.shards,
        },
        "phases": [],
    }
    watches: list[Watch] = []
    clients: list[Kube] = []
    load: Load | None = None
    peaks: Peaks | None = None
    shop = ShopServer().start()
    code = 0
    log(f"starting the control plane in {work} (load average {os.getloadavg()[0]:.2f})")
    cluster.start()
    try:
        admin = cluster.client()
        clients.append(admin)
        kwok = Kwok(cluster, work / "kwok")
        kwok.start()
        started = time.monotonic()
        kwok.add_nodes(admin, args.nodes)
        log(f"{args.nodes} fake nodes Ready in {time.monotonic() - started:.0f}s")
        kg.install(admin)
        config = kg.operator_kubeconfig(cluster, admin, work / "operator.kubeconfig")
        namespaces = [f"scale-{i}" for i in range(args.namespaces)]
        for ns in namespaces:
            admin.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
            kg.store_secret(admin, ns, cluster.dsn)
        if max(blocks) > 1:
            grant_shard_rights(admin)
        executor = procs.spawn(
            "executor",
            [
                sys.executable,
                "-m",
                "scalebench.executor",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--work={work / 'executor'}",
                f"--parallel={args.parallel}",
            ],
            run_dir=cluster.run_dir,
            log=cluster.logs_dir / "executor.log",
            env={
                "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT / "e2e")]),
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            },
        )
        cluster.adopt(executor)
        pods = PodTimes()
        load = Load(cluster.client(), namespaces, shop.url)
        for path, params, seen in (
            ("/api/v1/pods", {"labelSelector": STEP_SELECTOR}, pods.seen),
            ("/apis/keelgate.dev/v1alpha1/agentruns", {}, RunEnds(load.finished).seen),
        ):
            client = cluster.client()
            clients.append(client)
            watches.append(Watch(client, path, params, seen).start())
        peaks = Peaks([], cluster.dsn).start()
        by_name = {p.name: p.pid for p in cluster.procs}
        pids = {
            "kube-apiserver": by_name["kube-apiserver"],
            "etcd": by_name["etcd"],
            "kube-controller-manager": by_name["kube-controller-manager"],
            "kube-scheduler": by_name["kube-scheduler"],
            "kwok": by_name["kwok"],
            "postgres": by_name["postgres"],
            "executor": executor.pid,
            "bench": os.getpid(),
        }
        operators: list[kg.OperatorProcess] = []
        for block, count in enumerate(blocks):
            for operator in operators:
                operator.stop()  # a clean stop: the next block's replicas take the runs
            args.shards_now = (args.shards or count) if count > 1 else 0
            log(f"block {block}: {count} replica(s), shards {args.shards_now or 'off'}")
            operators = start_replicas(
                cluster, config, count, args.shards_now, args, cap=cap, block=block
            )
            replicas = {f"operator-{i}": op.proc.pid for i, op in enumerate(operators) if op.proc}
            peaks.watch(list(replicas.values()))
            for n in sizes:
                phase = measure(
                    n,
                    args,
                    load=load,
                    pods=pods,
                    peaks=peaks,
                    pids={**pids, **replicas},
                    operators=operators,
                    dsn=cluster.dsn,
                    audit_log=audit_log,
                    work=work,
                    py_spy=py_spy,
                )
                result["phases"].append(phase)
                (args.out / "scale.json").write_text(json.dumps(result, indent=2))
        load.set_target(0)
        with shop.shop.lock:
            orders = list(shop.shop.orders)
        with load.lock:
            succeeded = list(load.succeeded)
            result["runs_ended_otherwise"] = dict(load.other_ends)
            result["create_failures"] = load.create_failures
        once = counting.writes_once(orders, succeeded)
        result["writes_once"] = {
            **once,
            "keys_twice_or_missing": once["keys_twice_or_missing"][:20],
            "succeeded_runs_without_exactly_one_order": once[
                "succeeded_runs_without_exactly_one_order"
            ][:20],
        }
        for phase in result["phases"]:
            phase["writes_once"] = "yes" if once["ok"] else "NO"
        if not once["ok"]:
            code = 1
        for operator in operators:
            operator.stop()
    finally:
        for watch in watches:
            watch.stop.set()
        if load is not None:
            load.stop()
        if peaks is not None:
            peaks.stop.set()
        cluster.stop()
        shop.stop()
        for client in clients:
            client.close()
        # Keep the logs; the cluster's data (etcd, PostgreSQL) and the audit log can be GBs.
        shutil.copytree(cluster.logs_dir, args.out / "logs", dirs_exist_ok=True)
        shutil.rmtree(work / "cluster", ignore_errors=True)
        (work / "audit" / "audit.log").unlink(missing_ok=True)
    result["ended"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    (args.out / "scale.json").write_text(json.dumps(result, indent=2))
    print(report.table(result["phases"]))
    if len(blocks) > 1:
        print(report.side_by_side(result["phases"]))
    print(json.dumps(result, indent=2))
    if args.plot and result["phases"] and len(blocks) == 1:
        title = (
            f"Keelgate operator on kwok ({args.nodes:,} fake nodes), 2 shared cores, "
            f"{time.strftime('%Y-%m-%d')}"
        )
        log(f"plot: {report.plot(result['phases'], args.plot, title=title)}")
    log(f"results in {args.out}")
    if code:
        log("FAILED: a WRITE did not reach the shop exactly once (see writes_once)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
