"""`make up` and `make down` (e2e/e2e.mk) on a second, private run directory: everything starts,
the kubeconfig has the three users, and `make down` leaves no process behind, even when the node
agent was killed first and its pods' processes (one of which left its process group) are
orphaned.

It must never touch `.dev/` or the session's cluster: it runs its own under pytest's tmp_path.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from keelgate.kube.naming import action_object_name

from keelgate_e2e import procs
from keelgate_e2e.testing import Kubectl, find_kubectl, keelgate_venv, wait_for

REPO = Path(__file__).resolve().parents[2]


def make(target: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run `make -f e2e/e2e.mk <target>` for `run_dir` with this interpreter as PY."""
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-f",
            "e2e/e2e.mk",
            target,
            f"DEV_DIR={run_dir}",
            f"PY={sys.executable}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def listening_addresses(pids: list[int]) -> set[str]:
    """The local addresses (ip:port) of TCP sockets listening in processes `pids`."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir() if fd_dir.exists() else ():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A = LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            if width == 4:
                ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                ip = socket.inet_ntop(socket.AF_INET6, words)
            found.add(f"{ip}:{int(hex_port, 16)}")
    return found


def port_open(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_make_up_then_down_leaves_no_process(tmp_path: Path) -> None:
    """`make up` starts etcd, the API server, controller-manager, scheduler, node agent and
    PostgreSQL (which asks every connection for a password; the administrator's stays in the
    run directory, the operator gets a role of its own), and installs Keelgate with its Helm
    chart (the operator a pod under the chart's RBAC), all listening on 127.0.0.1 only, and
    writes a kubeconfig with contexts admin
    (current), alice and bob; when the node agent is SIGKILLed with pods running, the
    node-lifecycle controller marks the node unreachable, and `make down` still stops every
    process of the run (pods included) and frees every port."""
    run_dir = tmp_path / "dev"
    up = make("up", run_dir)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((run_dir / "state.json").read_text())
        names = [p["name"] for p in state["processes"]]
        assert names == [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "node-agent",
            "postgres",
        ]
        # Keelgate is installed and its operator answers (on loopback, like everything else).
        kubectl_admin = Kubectl(find_kubectl(), run_dir / "kubeconfig", namespace="default")
        crds = kubectl_admin("get", "crds", "-o", "name").stdout
        assert "agentruns.keelgate.dev" in crds and "reconciliations.keelgate.dev" in crds
        policies = kubectl_admin("get", "validatingadmissionpolicies", "-o", "name").stdout
        assert "keelgate-decided-by-requester" in policies
        # The operator runs as a pod of the chart's Deployment, installed by helm --wait.
        ready = kubectl_admin(
            "-n", "keelgate-system", "get", "deploy", "keelgate-operator",
            "-o", "jsonpath={.status.availableReplicas}",
        ).stdout  # fmt: skip
        assert ready == "1"
        config = yaml.safe_load((run_dir / "kubeconfig").read_text())
        assert config["current-context"] == "admin"
        assert {c["name"] for c in config["contexts"]} == {"admin", "alice", "bob", "carol"}
        kubectl = Kubectl(find_kubectl(), run_dir / "kubeconfig", namespace="default")
        assert "keelgate-node" in kubectl("get", "nodes", "-o", "name").stdout
        pg = subprocess.run(
            ["psql", state["postgres_dsn"], "-Atc", "select 1"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert pg.stdout.strip() == "1", pg.stderr
        # PostgreSQL asks every connection for a password; only the run directory holds the
        # administrator's, readable by its owner alone, and `make up` never prints it.
        admin_password = state["postgres_dsn"].split("://", 1)[1].split("@")[0].split(":")[1]
        no_password = state["postgres_dsn"].replace(f":{admin_password}@", "@", 1)
        refused = subprocess.run(
            ["psql", no_password, "-Atc", "select 1"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PGPASSWORD": "", "PGPASSFILE": "/nonexistent"},
        )
        assert refused.returncode != 0 and "password" in refused.stderr, refused.stderr
        for private in ("state.json", "env"):
            assert (run_dir / private).stat().st_mode & 0o077 == 0, private
        assert admin_password not in up.stdout + up.stderr
        # The operator logs in as its own role, not as the administrator.
        operator_url = base64.b64decode(
            kubectl_admin(
                "-n", "keelgate-system", "get", "secret", "keelgate-store",
                "-o", "jsonpath={.data.url}",
            ).stdout
        ).decode()  # fmt: skip
        assert operator_url.startswith("postgresql://keelgate-operator:")

        listening = listening_addresses(procs.marked_pids(run_dir))
        assert {f"127.0.0.1:{port}" for port in state["ports"].values()} <= listening
        assert {a.rsplit(":", 1)[0] for a in listening} == {"127.0.0.1"}, listening

        # A pod with a process that escapes its process group, then the agent dies.
        kubectl(
            "run",
            "orphan",
            "--image=busybox",
            "--restart=Never",
            "--command",
            "--",
            "sh",
            "-c",
            "setsid sleep 3600 & exec sleep 3600",
        )
        wait_for(
            lambda: (
                kubectl("get", "pod", "orphan", "-o", "jsonpath={.status.phase}").stdout
                == "Running"
            ),
            timeout=60,
            what="the orphan pod to run",
        )
        agent = next(p["pid"] for p in state["processes"] if p["name"] == "node-agent")
        os.kill(agent, signal.SIGKILL)
        wait_for(lambda: not procs.pid_alive(agent), timeout=10)
        sleepers = [
            pid
            for pid in procs.marked_pids(run_dir)
            if b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(sleepers) == 2, sleepers  # both still running after the agent died

        # A dead agent is a node fault: its Lease goes stale and the real node-lifecycle
        # controller marks the Node Ready=Unknown and taints it unreachable.
        def unreachable() -> bool:
            node = json.loads(kubectl("get", "node", "keelgate-node", "-o", "json").stdout)
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            return ready[0]["status"] == "Unknown" and "node.kubernetes.io/unreachable" in taints

        wait_for(unreachable, timeout=120, interval=2, what="the node to be marked unreachable")
    finally:
        down = make("down", run_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no process of this run is left" in down.stdout
    assert procs.marked_pids(run_dir) == []
    for pid in (p["pid"] for p in state["processes"]):
        assert not procs.pid_alive(pid), pid
    for port in state["ports"].values():
        assert not port_open(port), port
    assert not (run_dir / "state.json").exists()


def up_venv(tmp_path: Path) -> Path:
    """A venv holding keelgate with only the extras `make up` installs (the Makefile's
    UP_EXTRAS), installed from the wheel the image's build makes (tests/support/image.py)."""
    extras = re.search(r"^UP_EXTRAS\s*:=\s*(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert extras is not None, "the Makefile names no UP_EXTRAS"
    return keelgate_venv(extras.group(1), tmp_path)


def test_make_demo_tells_the_cluster_story_with_one_order(tmp_path: Path) -> None:
    """`make demo` on a private run directory, on a venv holding only the extras `make up`
    installs: the cluster and the operator come up, the
    restock run's step pod is killed right after the shop took the order, the run stops
    OutcomeUnknown, alice settles the Reconciliation with kubectl, the run Succeeds with
    exactly one order, and the audit trail verifies; `make demo` again tells the same story
    (a new cluster, a new shop with an empty book: a second run once found the first's order and
    failed); `make down` leaves nothing behind."""
    run_dir = tmp_path / "dev"
    venv = up_venv(tmp_path)
    # make's own venv is a folder holding only its stamp: make takes it as installed and runs
    # everything on the venv above (kept unwritten, so the next run may reuse it).
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    (stamps / ".installed-up").touch()
    python = venv / "bin" / "python"
    try:
        for _ in range(2):
            _demo_once(run_dir, stamps, python)
    finally:
        down = make("down", run_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert procs.marked_pids(run_dir) == []


def _demo_once(run_dir: Path, stamps: Path, python: Path) -> None:
    demo = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "demo",
            f"DEV_DIR={run_dir}",
            f"VENV={stamps}",
            f"PY={python}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "outcome_unknown" in out
    rec = action_object_name("restock", "1:1", "place_order")
    assert f"reconciliation.keelgate.dev/{rec} patched" in out
    assert "condition met" in out
    assert "the shop took 1 order(s)" in out
    assert "chain verified" in out
    assert "tenant shop: role keelgate-shop created" in out  # its own database role
    dsn = json.loads((run_dir / "state.json").read_text())["postgres_dsn"]
    assert dsn.split("://", 1)[1].split("@")[0].split(":")[1] not in out
    orders = (run_dir / "demo" / "orders").read_text().splitlines()
    assert len(orders) == 1
