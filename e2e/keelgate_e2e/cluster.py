"""Start and stop the local cluster: etcd, kube-apiserver, controller-manager, scheduler, node agent
and (for `make up`) PostgreSQL, each on a free 127.0.0.1 port, health-checked, logging to files.

Why it exists: the e2e tests and `make up` need a real Kubernetes control plane without Docker.
`Cluster.start` brings every component up in dependency order and waits until the node is Ready
and the `default` service account exists; it records pids and ports in `<run dir>/state.json`, so
that `Cluster.stop` (or `python -m keelgate_e2e down`, from another process) stops them all and
then sweeps any process still carrying the run's marker.

It must never bind anything but 127.0.0.1, never touch files outside its run directory (and
Go's caches, through the build), and never leave a process behind after `stop`.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keelgate_e2e import build, pki, procs
from keelgate_e2e.kube import Kube
from keelgate_e2e.procs import LOOPBACK, Proc

NODE_NAME = "keelgate-node"
#: The API server's client certificate for the kubelet port; the node agent accepts only it.
KUBELET_CLIENT_CN = "kube-apiserver-kubelet-client"
SERVICE_CIDR = "10.0.0.0/24"
USERS = ("admin", "alice", "bob", "carol")
#: The group bob and carol are authenticated in (their certificates' organisation): an approval
#: rule may count only its members.
APPROVERS = "payments-approvers"

#: Controllers the controller-manager runs (the issue's list plus what Deployments, Jobs,
#: CronJobs, Services, RBAC aggregation and pod clean-up need).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "statefulset-controller",
    "disruption-controller",
    "resourcequota-controller",
    "clusterrole-aggregation-controller",
)


def _postgres_bin() -> Path:
    explicit = os.environ.get("PG_BIN")
    if explicit:
        return Path(explicit)
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "postgres").exists():
            return Path(out.stdout.strip())
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    raise procs.StartError("no PostgreSQL server found (set PG_BIN to its bin directory)")


@dataclass
class Cluster:
    """A local cluster rooted at `run_dir` (e.g. `.dev/`)."""

    run_dir: Path
    node: bool = True
    postgres: bool = False
    backoff_base: float = 10.0
    #: More flags for kube-apiserver and kube-controller-manager, after the usual ones (a
    #: repeated flag's last value wins): the scale bench's audit log and node-health timings.
    apiserver_args: tuple[str, ...] = ()
    controller_manager_args: tuple[str, ...] = ()
    procs: list[Proc] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: The administrator's URL of the cluster's PostgreSQL (the superuser ``keelgate``, with its
    #: password): for `make up`'s and the tests' own use, never a pod's.
    dsn: str = ""
    #: The superuser's password; generated when empty. The server asks every connection for
    #: a password (scram-sha-256), so a pod holds only what its tenant's role was given.
    pg_password: str = ""
    #: PostgreSQL's directory when it had to live outside the run directory.
    pg_root: str = ""
    #: How each component was started (for `restart`).
    _commands: dict[str, tuple[list[str], dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dir = self.run_dir.resolve()

    # -- paths --------------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        """Certificates and keys."""
        return self.run_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        """One log file per component."""
        return self.run_dir / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The users' kubeconfig: contexts admin (current), alice, bob, carol."""
        return self.run_dir / "kubeconfig"

    @property
    def node_state_dir(self) -> Path:
        """The node agent's pod state (pid files, container logs)."""
        return self.run_dir / "node"

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://{LOOPBACK}:{self.ports['apiserver']}"

    def client(self, user: str = "admin") -> Kube:
        """An API client as one of USERS."""
        return Kube.from_kubeconfig(self.kubeconfig, context=user)

    # -- start --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every component; on failure stop what was started and re-raise."""
        if (self.run_dir / "state.json").exists():
            Cluster.load(self.run_dir).stop()  # a previous run here was not stopped
        binaries = build.ensure(build.CLUSTER_PROGRAMS)
        for sub in ("etcd", "pki", "node", "logs", "certs", "postgres"):
            shutil.rmtree(self.run_dir / sub, ignore_errors=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir()
        begin = time.monotonic()
        try:
            self._pki()
            self._etcd(binaries["etcd"].path)
            self._apiserver(binaries["kube-apiserver"].path)
            self._controller_manager(binaries["kube-controller-manager"].path)
            self._scheduler(binaries["kube-scheduler"].path)
            if self.node:
                self._node_agent()
            if self.postgres:
                self._postgres()
            self._wait_usable()
        except BaseException:
            self._save()
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - begin
        self._save()

    def _pki(self) -> None:
        d = self.pki_dir
        ca = pki.CertificateAuthority(d)
        self.authority = ca  # issues more nodes' certificates (add_node)
        self.ca = ca.pair.cert
        self.apiserver_cert = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=(LOOPBACK, "10.0.0.1"),
        )
        self.kubelet_client = ca.issue(
            "apiserver-kubelet-client", KUBELET_CLIENT_CN, ("system:masters",), client=True
        )
        self.node_serving = ca.issue(
            "node-serving", NODE_NAME, server=True, dns=(NODE_NAME, "localhost"), ips=(LOOPBACK,)
        )
        self.users = {
            "admin": ca.issue("admin", "admin", ("system:masters",), client=True),
            "alice": ca.issue("alice", "alice", client=True),
            "bob": ca.issue("bob", "bob", (APPROVERS,), client=True),
            "carol": ca.issue("carol", "carol", (APPROVERS,), client=True),
        }
        self.components = {
            "controller-manager": ca.issue(
                "controller-manager", "system:kube-controller-manager", client=True
            ),
            "scheduler": ca.issue("scheduler", "system:kube-scheduler", client=True),
            "node": ca.issue("node", f"system:node:{NODE_NAME}", ("system:nodes",), client=True),
        }
        self.sa_key, self.sa_pub = pki.write_service_account_keys(d)
        # The aggregation layer's front proxy, as a real cluster has: the API server publishes
        # this CA, and the controller-manager and scheduler's delegated authentication reads it.
        front = pki.CertificateAuthority(d, "keelgate-e2e-front-proxy-ca", "front-proxy-ca")
        self.front_proxy_ca = front.pair.cert
        self.front_proxy_client = front.issue(
            "front-proxy-client", "front-proxy-client", client=True
        )

    def _spawn(self, name: str, argv: list[str], **kw: Any) -> Proc:
        proc = procs.spawn(
            name, argv, run_dir=self.run_dir, log=self.logs_dir / f"{name}.log", **kw
        )
        self.procs.append(proc)
        self._commands[name] = (argv, kw)
        self._save()
        return proc

    def adopt(self, proc: Proc) -> None:
        """Record a process started beside the cluster (the operator), so `down` stops it."""
        self.procs.append(proc)
        self._save()

    def restart(
        self,
        name: str,
        ready: Callable[[], bool],
        *,
        kill: bool = False,
        away: float = 0.0,
        while_down: Callable[[], None] | None = None,
    ) -> float:
        """Stop one component (SIGKILL with `kill`, else as `down` would), leave it stopped for
        `away` seconds (doing `while_down` meanwhile), and start it again with the same command
        line, ports and data; returns seconds until `ready`."""
        proc = next(p for p in self.procs if p.name == name)
        if kill:
            procs.stop(proc, self.run_dir, sig=signal.SIGKILL, grace=5)
        elif name == "postgres":
            procs.stop(proc, self.run_dir, sig=signal.SIGINT, grace=10, group=False)
        else:
            procs.stop(proc, self.run_dir, grace=10)
        self.procs.remove(proc)
        if while_down is not None:
            while_down()
        time.sleep(away)
        argv, kw = self._commands[name]
        fresh = self._spawn(name, argv, **kw)
        return procs.wait_until(fresh, ready, timeout=120, what=f"{name} ready again")

    def delete_from_etcd(self, key: str) -> int:
        """Delete one key from etcd itself, behind the API server's back (its v3 JSON gateway);
        returns how many keys went. With the API server down, this is an object deleted while
        every watch was away: no watcher is ever told."""
        answer = httpx.post(
            f"http://{LOOPBACK}:{self.ports['etcd']}/v3/kv/deleterange",
            json={"key": base64.b64encode(key.encode()).decode()},
            timeout=10,
            trust_env=False,
        )
        answer.raise_for_status()
        return int(answer.json().get("deleted", 0))

    def _etcd(self, binary: Path) -> None:
        client, peer = procs.free_port(), procs.free_port()
        self.ports.update(etcd=client, etcd_peer=peer)
        url, peer_url = f"http://{LOOPBACK}:{client}", f"http://{LOOPBACK}:{peer}"
        proc = self._spawn(
            "etcd",
            [
                str(binary),
                "--name=keelgate-e2e",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=keelgate-e2e={peer_url}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )
        self.timings["etcd"] = procs.wait_until(
            proc,
            lambda: (
                httpx.get(f"{url}/health", timeout=2, trust_env=False).json().get("health")
                == "true"
            ),
            timeout=60,
        )

    def _apiserver(self, binary: Path) -> None:
        port = procs.free_port()
        self.ports["apiserver"] = port
        d = self.pki_dir
        proc = self._spawn(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports['etcd']}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'certs'}",
                f"--tls-cert-file={self.apiserver_cert.cert}",
                f"--tls-private-key-file={self.apiserver_cert.key}",
                f"--client-ca-file={self.ca}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--kubelet-client-certificate={self.kubelet_client.cert}",
                f"--kubelet-client-key={self.kubelet_client.key}",
                f"--kubelet-certificate-authority={self.ca}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--requestheader-client-ca-file={self.front_proxy_ca}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={self.front_proxy_client.cert}",
                f"--proxy-client-key-file={self.front_proxy_client.key}",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *self.apiserver_args,
            ],
        )
        kubeconfig = d / "probe.kubeconfig"
        pki.kubeconfig(kubeconfig, self.server, self.ca, {"admin": self.users["admin"]}, "admin")

        def ready() -> bool:
            kube = Kube.from_kubeconfig(kubeconfig)
            try:
                return kube.text("/readyz") == "ok"
            finally:
                kube.close()

        self.timings["kube-apiserver"] = procs.wait_until(proc, ready, timeout=120)
        pki.kubeconfig(self.kubeconfig, self.server, self.ca, self.users, "admin")
        for name, pair in self.components.items():
            pki.kubeconfig(d / f"{name}.kubeconfig", self.server, self.ca, {name: pair}, name)

    def _secure_health(self, proc: Proc, port: int) -> float:
        # Their serving certificates are self-signed (in --cert-dir); /healthz is public.
        def healthy() -> bool:
            resp = httpx.get(
                f"https://{LOOPBACK}:{port}/healthz", verify=False, timeout=2, trust_env=False
            )
            return resp.status_code == 200 and resp.text == "ok"

        return procs.wait_until(proc, healthy, timeout=120)

    def _controller_manager(self, binary: Path) -> None:
        port = procs.free_port()
        self.ports["controller-manager"] = port
        d = self.pki_dir
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={d / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={d / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={d / 'controller-manager.kubeconfig'}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'certs' / 'controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.sa_key}",
                f"--root-ca-file={self.ca}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--cluster-name=keelgate-e2e",
                f"--controllers={','.join(CONTROLLERS)}",
                # A node that stops reporting is seen within seconds, not the default 50 s: the
                # lost-node tests wait for it (a node agent's own restarts take less).
                "--node-monitor-period=2s",
                "--node-monitor-grace-period=12s",
                "--profiling=false",
                "--v=1",
                *self.controller_manager_args,
            ],
        )
        self.timings["kube-controller-manager"] = self._secure_health(proc, port)

    def _scheduler(self, binary: Path) -> None:
        port = procs.free_port()
        self.ports["scheduler"] = port
        d = self.pki_dir
        proc = self._spawn(
            "kube-scheduler",
            [
                str(binary),
                f"--kubeconfig={d / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={d / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={d / 'scheduler.kubeconfig'}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--cert-dir={self.run_dir / 'certs' / 'scheduler'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        self.timings["kube-scheduler"] = self._secure_health(proc, port)

    def _node_agent(self) -> None:
        self._start_node(
            NODE_NAME,
            "node-agent",
            "node",
            self.pki_dir / "node.kubeconfig",
            self.node_serving,
            self.node_state_dir,
        )

    def add_node(self, name: str) -> Proc:
        """Start one more node agent, `name`, beside the first (its own certificates, port and
        pod state under `<run dir>/nodes/<name>`), and wait until the node is Ready. Stopping
        its process (`Proc.kill`, SIGKILL) is a node lost as a kubelet is lost: its pods'
        processes go on running, and nothing reports on them any more."""
        ca = self.authority  # only the process that started the cluster holds its CA's key
        serving = ca.issue(
            f"{name}-serving", name, server=True, dns=(name, "localhost"), ips=(LOOPBACK,)
        )
        client = ca.issue(name, f"system:node:{name}", ("system:nodes",), client=True)
        config = self.pki_dir / f"{name}.kubeconfig"
        pki.kubeconfig(config, self.server, self.ca, {name: client}, name)
        state = self.run_dir / "nodes" / name
        state.mkdir(parents=True, exist_ok=True)
        return self._start_node(name, f"node-agent-{name}", name, config, serving, state)

    def _start_node(
        self,
        name: str,
        proc_name: str,
        port_name: str,
        config: Path,
        serving: pki.Pair,
        state: Path,
    ) -> Proc:
        port = procs.free_port()
        self.ports[port_name] = port
        e2e_dir = Path(__file__).resolve().parent.parent
        python_path = os.pathsep.join(
            p for p in (str(e2e_dir), os.environ.get("PYTHONPATH", "")) if p
        )
        proc = self._spawn(
            proc_name,
            [
                sys.executable,
                "-m",
                "keelgate_e2e.node",
                f"--kubeconfig={config}",
                f"--name={name}",
                f"--state-dir={state}",
                f"--port={port}",
                f"--tls-cert={serving.cert}",
                f"--tls-key={serving.key}",
                f"--client-ca={self.ca}",
                f"--allowed-client={KUBELET_CLIENT_CN}",
                f"--backoff-base={self.backoff_base}",
            ],
            # Pods run host programs: this venv's `keelgate` stands in for the step image's.
            env={
                "PYTHONPATH": python_path,
                "PYTHONUNBUFFERED": "1",
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            },
        )
        kube = self.client()

        def node_ready() -> bool:
            node = kube.get(f"/api/v1/nodes/{name}")
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node["status"].get("conditions", [])
            )
            taints = node["spec"].get("taints") or []
            return ready and not any(t["key"] == "node.kubernetes.io/not-ready" for t in taints)

        try:
            self.timings[proc_name] = procs.wait_until(proc, node_ready, timeout=120, what="Ready")
        finally:
            kube.close()
        return proc

    def _postgres(self) -> None:
        bindir = _postgres_bin()
        port = procs.free_port()
        self.ports["postgres"] = port
        root = self.run_dir / "postgres"
        user = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as "postgres"
            user = "postgres"
            if all(p.stat().st_mode & 0o001 for p in self.run_dir.parents):
                self.run_dir.chmod(self.run_dir.stat().st_mode | 0o001)  # let it traverse
            else:  # it cannot reach the run directory: use a private one that it can reach
                root = Path(tempfile.mkdtemp(prefix="keelgate-e2e-pg-"))
                self.pg_root = str(root)
                self._save()
        root.mkdir(exist_ok=True)
        data = root / "data"
        data.mkdir()
        self.pg_password = self.pg_password or secrets.token_urlsafe(18)
        pwfile = root / "superuser-password"
        pwfile.write_text(self.pg_password + "\n")
        pwfile.chmod(0o600)
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (root, data, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        try:
            # Every connection, TCP or the unix socket, gives a password (scram-sha-256), as
            # on a real server: a step pod can log in only as the role its Secret names.
            self._run_pg(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "keelgate",
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ],
                user=user,
                cwd=root,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        server = [str(bindir / "postgres"), "-D", str(data), "-h", LOOPBACK, "-p", str(port)]
        server += ["-k", str(data), "-c", "fsync=off", "-c", "full_page_writes=off"]
        proc = self._spawn("postgres", server, user=user, cwd=root)

        def accepting() -> bool:
            out = subprocess.run(
                [str(bindir / "pg_isready"), "-h", LOOPBACK, "-p", str(port)],
                capture_output=True,
                check=False,
            )
            return out.returncode == 0

        self.timings["postgres"] = procs.wait_until(proc, accepting, timeout=60)
        self._run_pg(
            [
                str(bindir / "createdb"),
                "-h",
                LOOPBACK,
                "-p",
                str(port),
                "-U",
                "keelgate",
                "keelgate",
            ],
            env={"PGPASSWORD": self.pg_password},
        )
        self.dsn = f"postgresql://keelgate:{self.pg_password}@{LOOPBACK}:{port}/keelgate"

    @staticmethod
    def _run_pg(
        argv: list[str],
        user: str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        environment = {**os.environ, **env} if env else None
        out = subprocess.run(
            argv, capture_output=True, text=True, user=user, cwd=cwd, env=environment, check=False
        )
        if out.returncode != 0:
            raise procs.StartError(f"{Path(argv[0]).name} failed:\n{out.stdout}{out.stderr}")

    def _wait_usable(self) -> None:
        kube = self.client()
        try:
            apiserver = next(p for p in self.procs if p.name == "kube-apiserver")
            started = time.monotonic()
            procs.wait_until(
                apiserver,
                lambda: kube.exists("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout=60,
                what="serving the default service account",
            )
            self.timings["default-serviceaccount"] = time.monotonic() - started
        finally:
            kube.close()

    # -- state and stop -----------------------------------------------------------------------

    def _save(self) -> None:
        state = {
            "run_dir": str(self.run_dir),
            "processes": [{"name": p.name, "pid": p.pid, "log": str(p.log)} for p in self.procs],
            "ports": self.ports,
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "kubeconfig": str(self.kubeconfig),
            "node_state_dir": str(self.node_state_dir),
            "postgres_dsn": self.dsn,
            "postgres_root": self.pg_root,
        }
        # Both files hold the administrator's URL (with its password): the user's own only.
        tmp = self.run_dir / "state.json.tmp"
        tmp.touch(mode=0o600)
        tmp.chmod(0o600)
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.run_dir / "state.json")
        env_lines = [f"export KUBECONFIG={self.kubeconfig}"]
        if self.dsn:
            env_lines.append(f"export KEELGATE_PG_DSN={self.dsn}")
        env = self.run_dir / "env"
        env.touch(mode=0o600)
        env.chmod(0o600)
        env.write_text("\n".join(env_lines) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Cluster:
        """The cluster recorded in `run_dir/state.json` (to stop it from another process)."""
        state = json.loads((run_dir / "state.json").read_text())
        cluster = cls(run_dir)
        cluster.procs = [Proc(p["name"], int(p["pid"]), Path(p["log"])) for p in state["processes"]]
        cluster.ports = {k: int(v) for k, v in state["ports"].items()}
        cluster.timings = {k: float(v) for k, v in state.get("timings", {}).items()}
        cluster.dsn = str(state.get("postgres_dsn", ""))
        cluster.pg_root = str(state.get("postgres_root", ""))
        return cluster

    def stop(self) -> list[int]:
        """Stop every component (last started first), sweep stragglers; return swept pids."""
        swept = procs.stop_all(reversed(self.procs), self.run_dir)
        self.procs = []
        (self.run_dir / "state.json").unlink(missing_ok=True)
        (self.run_dir / "env").unlink(missing_ok=True)
        if self.pg_root:
            shutil.rmtree(self.pg_root, ignore_errors=True)
        return swept
