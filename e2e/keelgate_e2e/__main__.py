"""Command line for the local cluster: `python -m keelgate_e2e up|down|status|build`.

Why it exists: `make up`, `make down` and `make e2e-build` call it. `up` starts everything in the
background and returns; `down` stops everything recorded in the run directory and sweeps any
process still carrying its marker. It must never stop processes of another run directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from keelgate_e2e import build, keelgate, procs
from keelgate_e2e.cluster import Cluster


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch the subcommand."""
    parser = argparse.ArgumentParser(prog="python -m keelgate_e2e", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path(".dev"), help="run directory")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster (and PostgreSQL) in the background")
    up.add_argument("--no-postgres", action="store_true")
    up.add_argument(
        "--no-operator", action="store_true", help="do not install Keelgate or run its operator"
    )
    up.add_argument(
        "--store-of",
        type=Path,
        help="a standby cluster: no PostgreSQL of its own; its operator uses the one of the "
        "cluster `up` started in this run directory (its operator's store Secret)",
    )
    up.add_argument(
        "--cluster-name",
        default="",
        help="the operator's cluster name (the chart's runOwnership.cluster; default: default)",
    )
    sub.add_parser("down", help="stop everything started by `up` in --dir")
    sub.add_parser("status", help="print the recorded state")
    sub.add_parser("build", help="build missing control-plane binaries")
    args = parser.parse_args(argv)
    run_dir: Path = args.dir.resolve()

    if args.command == "build":
        return build.main([])
    if args.command == "up":
        started = time.monotonic()
        store = ""
        if args.store_of is not None:
            store = _store_of(args.store_of.resolve())
            if not store:
                print(
                    f"error: no cluster with PostgreSQL is up in {args.store_of}", file=sys.stderr
                )
                return 1
        cluster = Cluster(run_dir, postgres=not args.no_postgres and not store)
        try:
            cluster.start()
            operator = None
            if not args.no_operator and (cluster.dsn or store):
                operator = _keelgate(cluster, store=store, name=args.cluster_name)
        except (procs.StartError, build.BuildError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(
            f"cluster up in {time.monotonic() - started:.1f}s "
            f"(components: {json.dumps({k: round(v, 1) for k, v in cluster.timings.items()})})"
        )
        print(f"  kubeconfig: {cluster.kubeconfig} (contexts admin [default], alice, bob)")
        print(f"  API server: {cluster.server}")
        if store:
            print(
                f"  PostgreSQL: the one of {args.store_of} (a standby cluster: no PostgreSQL here)"
            )
        if cluster.dsn:
            where = cluster.dsn.rsplit("@", 1)[1]
            print(
                f"  PostgreSQL: {where}, passwords required (scram-sha-256); the administrator's "
                f"URL is KEELGATE_PG_DSN in {run_dir / 'env'}"
            )
        print(f"  logs:       {cluster.logs_dir}/")
        if operator is not None:
            print(
                "  operator:   helm release keelgate in keelgate-system (allowFailpoints=true), "
                f"metrics http://127.0.0.1:{operator.port}/metrics, "
                "logs: kubectl -n keelgate-system logs deploy/keelgate-operator"
            )
            if store:
                print(
                    "  a tenant:   copy its keelgate-store Secret from the first cluster's "
                    "namespace NS into NS here (docs/operator.md, a standby cluster)"
                )
            else:
                print(
                    "  a tenant:   kubectl create namespace NS && "
                    'keelgate tenant add NS --store "$KEELGATE_PG_DSN"   (its own database role)'
                )
        print(f"  use it:     source {run_dir / 'env'}   (or KUBECONFIG={cluster.kubeconfig})")
        return 0
    if args.command == "down":
        if (run_dir / "state.json").exists():
            swept = Cluster.load(run_dir).stop()
        else:
            swept = procs.sweep(run_dir)
        left = procs.marked_pids(run_dir)
        if swept:
            print(f"killed {len(swept)} straggler process(es): {swept}")
        if left:
            print(f"error: processes still running: {left}", file=sys.stderr)
            return 1
        print("down: no process of this run is left")
        return 0
    state = run_dir / "state.json"
    print(state.read_text() if state.exists() else "not running")
    return 0


def _keelgate(cluster: Cluster, *, store: str = "", name: str = "") -> keelgate.OperatorPod:
    """Install Keelgate as a user does: `keelgate tenant add keelgate-system --operator` (the
    operator's own database role, in the Secret keelgate-store), then `helm install --wait` of
    charts/keelgate into keelgate-system reading it, with failpoints allowed: it is a
    development cluster. With ``store`` (a standby cluster) the operator's URL on the other
    cluster's PostgreSQL instead (the chart's store.url), and ``name`` as its cluster's."""
    values = (f"runOwnership.cluster={name}",) if name else ()
    operator = keelgate.OperatorPod(cluster, store=store, values=values)
    operator.install()
    return operator


def _store_of(first: Path) -> str:
    """The operator's store URL in the cluster `up` started in ``first`` (its Secret
    keelgate-system/keelgate-store); "" when none is up there with PostgreSQL."""
    if not (first / "state.json").exists() or not Cluster.load(first).dsn:
        return ""
    kube = Cluster(first).client()
    try:
        return keelgate.store_url(kube, keelgate.SYSTEM)
    finally:
        kube.close()


if __name__ == "__main__":
    sys.exit(main())
