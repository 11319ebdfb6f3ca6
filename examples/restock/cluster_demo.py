"""`make demo`: Keelgate's promise on a real Kubernetes control plane, with a real pod death.

`make up` has started the local cluster, PostgreSQL and the Keelgate operator. This script plays
a user: it starts a small shop on loopback (the system the agent's WRITE changes), applies the
restock AgentRun with `kubectl`, armed (through an annotation the development operator honours)
to kill its step pod right after the shop took the order and before Keelgate recorded it. The
run then stops with OutcomeUnknown instead of ordering again; alice checks the shop and settles
the Reconciliation with `kubectl patch`; the run finishes; the shop has exactly one order; the
audit trail verifies. Every step is a command you can type yourself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.rule import Rule

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from keelgate_e2e import procs  # noqa: E402 - the local cluster's helpers live in e2e/
from keelgate_e2e.cluster import Cluster  # noqa: E402

console = Console(highlight=False)
NAMESPACE = "shop"


def sh(*args: str, env: dict[str, str], check: bool = True, quiet: bool = False) -> str:
    """Run one command as a user would, showing it first (and its output)."""
    console.print(f"[bold cyan]$ {' '.join(shlex.quote(a) for a in args)}[/]")
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    out = (done.stdout + done.stderr).rstrip()
    if out and not quiet:
        console.print(out, markup=False)
    if check and done.returncode != 0:
        raise SystemExit(f"demo: the command above failed (exit {done.returncode})")
    return done.stdout


def manifest(shop_url: str) -> str:
    """The restock run: read the stock and order in one plan, then done. The annotation arms a
    crash at the 2nd gateway call of the first step pod: right after the order went out."""
    run = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "name": "restock",
            "namespace": NAMESPACE,
            "annotations": {"keelgate.dev/failpoints": "after_gateway_call@2"},
        },
        "spec": {
            "goal": "Restock SKU A1 if fewer than 10 are left",
            "model": {
                "provider": "scripted",
                "name": "demo",
                "script": [
                    {
                        "actions": [
                            {"tool": "get_inventory", "args": {"sku": "A1"}},
                            {"tool": "place_order", "args": {"sku": "A1", "qty": 20}},
                        ],
                        "usage": {"inputTokens": 180, "outputTokens": 25},
                    },
                    {"done": True, "answer": "A1 had 3 left; ordered 20 more."},
                ],
            },
            "tools": [
                {
                    "name": "get_inventory",
                    "sideEffect": "READ",
                    "http": {"url": f"{shop_url}/items/{{sku}}", "method": "GET"},
                },
                {
                    "name": "place_order",
                    "sideEffect": "WRITE",
                    "timeoutSeconds": 10,
                    "http": {"url": f"{shop_url}/orders", "method": "POST"},
                },
            ],
            "budget": {"maxIterations": 5},
        },
    }
    return json.dumps(run, indent=2)


def wait(what: str, probe: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return
        except (httpx.HTTPError, OSError):
            pass  # not up yet
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=ROOT / ".dev", help="`make up`'s directory")
    args = parser.parse_args()
    run_dir = args.dir.resolve()
    if not (run_dir / "state.json").exists():
        raise SystemExit("demo: no cluster is running here: run `make up` first")
    cluster = Cluster.load(run_dir)
    demo = run_dir / "demo"
    demo.mkdir(exist_ok=True)
    # KEELGATE_STORE is the store's administrator URL (`make up` keeps it in .dev/): it adds
    # the tenant and reads the audit trail; the shop's step pods get a role of their own.
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "KEELGATE_STORE": cluster.dsn}
    keelgate = str(Path(sys.executable).parent / "keelgate")

    console.print(Rule("1. A shop on loopback: the system the agent's WRITE changes"))
    port = procs.free_port()
    # `make up` started a new cluster and database, so the shop starts a new book too: the
    # orders of an earlier demo are not this run's (a second `make demo` once counted them).
    book = demo / "orders"
    book.unlink(missing_ok=True)
    shop = procs.spawn(
        "shop",
        [sys.executable, "-m", "keelgate_e2e.shop", f"--port={port}", f"--book={book}"],
        run_dir=run_dir,
        log=cluster.logs_dir / "shop.log",
        env={"PYTHONPATH": str(ROOT / "e2e")},
    )
    cluster.adopt(shop)
    shop_url = f"http://127.0.0.1:{port}"
    wait("the shop", lambda: httpx.get(f"{shop_url}/orders", timeout=2).status_code == 200)
    console.print(f"shop listening on {shop_url}; it never deduplicates orders itself")

    console.print(Rule("2. A tenant namespace: its own database role, and alice may edit"))
    sh("kubectl", "create", "namespace", NAMESPACE, env=env, check=False)
    # The store's administrator URL is KEELGATE_STORE (from .dev/env): never on a command line.
    sh(keelgate, "tenant", "add", NAMESPACE, env=env)
    sh(
        "kubectl", "-n", NAMESPACE, "create", "rolebinding", "alice-edit",
        "--clusterrole=edit", "--user=alice", env=env, check=False,
    )  # fmt: skip

    console.print(Rule("3. Apply the restock run, armed to crash right after the order"))
    path = demo / "restock.json"
    path.write_text(manifest(shop_url))
    sh("kubectl", "apply", "-f", str(path), env=env)

    def stopped() -> bool:
        out = sh(
            "kubectl", "-n", NAMESPACE, "get", "agentrun", "restock",
            "-o", "jsonpath={.status.stopReason}", env=env, quiet=True,
        )  # fmt: skip
        return out == "outcome_unknown"

    console.print("waiting for the step pod to die and the next one to see the unknown outcome")
    wait("OutcomeUnknown", stopped)
    sh("kubectl", "-n", NAMESPACE, "get", "pods", env=env)
    sh("kubectl", "-n", NAMESPACE, "get", "agentrun", "restock", env=env)
    sh(
        "kubectl", "-n", NAMESPACE, "get", "agentrun", "restock", "-o",
        'jsonpath={.status.conditions[?(@.type=="OutcomeUnknown")].message}{"\\n"}', env=env,
    )  # fmt: skip
    sh("kubectl", "-n", NAMESPACE, "get", "reconciliations", env=env)

    console.print(Rule("4. alice asks the shop, then settles it with kubectl"))
    records = json.loads(
        sh("kubectl", "-n", NAMESPACE, "get", "reconciliations", "-o", "json", env=env, quiet=True)
    )["items"]
    rec = records[0]
    key = rec["spec"]["idempotencyKey"]
    sh("curl", "-s", f"{shop_url}/orders/{key}", env=env)
    patch = json.dumps({"spec": {"executed": True, "by": "alice", "note": "in the shop's book"}})
    sh(
        "kubectl", "--context", "alice", "-n", NAMESPACE, "patch", "reconciliation",
        rec["metadata"]["name"], "--type", "merge", "-p", patch, env=env,
    )  # fmt: skip
    sh(
        "kubectl", "-n", NAMESPACE, "wait", "--for=condition=Succeeded", "agentrun/restock",
        "--timeout=120s", env=env,
    )  # fmt: skip
    sh("kubectl", "-n", NAMESPACE, "get", "agentrun", "restock", env=env)

    console.print(Rule("5. One crash, one order, and the audit trail"))
    orders = httpx.get(f"{shop_url}/orders", timeout=5).json()["orders"]
    console.print(f"the shop took {len(orders)} order(s)")
    sh(keelgate, "audit", "restock", "-n", NAMESPACE, "--verify", env=env)
    if len(orders) != 1:
        raise SystemExit(f"demo: expected exactly one order, found {len(orders)}")
    console.print("[bold green]one crash, one order: nothing ran twice[/]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
