"""Volumes on the node agent: Secret, ConfigMap, emptyDir, downward-API and the projected
service-account token mounted inside each container's own mount namespace, the in-cluster
configuration of the official Python client, automount off, and that `make down` still leaves
no process when pods run in mount namespaces.

They run against the real API server (the ServiceAccount admission plugin injects the token
volume, TokenRequest issues the token, RBAC decides). Mount points they choose lie under pytest's
tmp_path, so the empty directories the agent creates on the host go with it. They must never
grant anything outside the test's own namespace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from keelgate_e2e import procs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.testing import Kubectl, container_status, get_pod, pod, pod_phase, wait_for

REPO = Path(__file__).resolve().parents[2]
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PY = f"PY={sys.executable}"


def create(admin: Kube, namespace: str, kind: str, manifest: JSON) -> None:
    """Create a namespaced core object (`kind` is the plural resource)."""
    admin.create(f"/api/v1/namespaces/{namespace}/{kind}", manifest)


def finished(admin: Kube, namespace: str, name: str, timeout: float = 60) -> JSON:
    """Wait until the pod has Succeeded or Failed; return it."""
    done: JSON = wait_for(
        lambda: pod_phase(admin, namespace, name, "Succeeded", "Failed"),
        timeout=timeout,
        what=f"{name} to finish",
    )
    return done


def logs_of(kubectl: Kubectl, name: str, container: str = "main") -> str:
    """The container's output so far, through `kubectl logs`; empty while the node has none.

    Until the node has started the container it answers `kubectl logs` with NotFound, as a
    kubelet answers with "waiting to start"; a poll for output must keep polling then.
    """
    result = kubectl("logs", name, "-c", container, check=False)
    return result.stdout if result.returncode == 0 else ""


def test_secret_and_configmap_files_with_items_modes_and_updates(
    admin: Kube, namespace: str, kubectl: Kubectl, tmp_path: Path
) -> None:
    """A Secret volume holds one file per key with defaultMode; a ConfigMap volume with
    `items` holds only the chosen keys at their paths with their modes (binaryData too); a
    missing optional Secret is an empty volume; a subPath mounts one file; API-data volumes
    are read-only; the host sees nothing at the mount points (the mounts are the container's
    own); and a ConfigMap update reaches the running container's files (the resync that also
    refreshes tokens)."""
    ns, base = namespace, tmp_path / "mnt"
    create(
        admin,
        ns,
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "stringData": {"user": "ada", "password": "s3cret"},
        },
    )
    create(
        admin,
        ns,
        "configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg"},
            "data": {"app.conf": "color=blue\n", "unused": "x", "greeting": "hello"},
            "binaryData": {"blob": "AAEC"},  # bytes 0, 1, 2
        },
    )
    script = textwrap.dedent(
        f"""\
        cd {base}
        for f in secret/user secret/password config/conf/app.conf config/raw.bin; do
          printf '%s %s %s\n' "$f" "$(stat -L -c %a $f)" "$(od -An -tx1 $f | tr -d ' \n')"
        done
        echo "config: $(ls config | tr '\\n' ' ')"
        echo "optional: $(ls optional | wc -l)"
        echo "one: $(cat one/greeting.txt)"
        touch secret/new 2>/dev/null && echo "secret writable" || echo "secret read-only"
        while [ "$(cat config/conf/app.conf)" = "color=blue" ]; do sleep 0.5; done
        echo "updated: $(cat config/conf/app.conf)"
        """
    )
    manifest = pod(
        "files",
        ["sh", "-c", script],
        extra={
            "volumeMounts": [
                {"name": "secret", "mountPath": f"{base}/secret"},
                {"name": "config", "mountPath": f"{base}/config"},
                {"name": "optional", "mountPath": f"{base}/optional"},
                {"name": "whole", "mountPath": f"{base}/one/greeting.txt", "subPath": "greeting"},
            ]
        },
    )
    manifest["spec"]["volumes"] = [
        {"name": "secret", "secret": {"secretName": "creds", "defaultMode": 0o400}},
        {
            "name": "config",
            "configMap": {
                "name": "cfg",
                "items": [
                    {"key": "app.conf", "path": "conf/app.conf", "mode": 0o600},
                    {"key": "blob", "path": "raw.bin"},
                ],
            },
        },
        {"name": "optional", "secret": {"secretName": "absent", "optional": True}},
        {"name": "whole", "configMap": {"name": "cfg"}},
    ]
    create(admin, ns, "pods", manifest)
    wait_for(
        lambda: "secret read-only" in logs_of(kubectl, "files"),
        timeout=60,
        what="the pod to read its files",
    )
    lines = logs_of(kubectl, "files").splitlines()
    assert lines[:4] == [
        "secret/user 400 " + b"ada".hex(),
        "secret/password 400 " + b"s3cret".hex(),
        "config/conf/app.conf 600 " + b"color=blue\n".hex(),
        "config/raw.bin 644 000102",
    ], lines
    assert lines[4].split() == ["config:", "conf", "raw.bin"], lines
    assert lines[5:8] == ["optional: 0", "one: hello", "secret read-only"], lines
    # The mounts live in the container's mount namespace: on the host the points are empty.
    for point in ("secret", "config", "optional"):
        assert list((base / point).iterdir()) == [], point
    assert (base / "one" / "greeting.txt").read_text() == ""

    admin.patch(f"/api/v1/namespaces/{ns}/configmaps/cfg", {"data": {"app.conf": "color=red"}})
    done = finished(admin, ns, "files", timeout=120)
    assert done["status"]["phase"] == "Succeeded"
    assert logs_of(kubectl, "files").splitlines()[-1] == "updated: color=red"


def test_empty_dir_shared_by_containers_and_read_only_mount(
    admin: Kube, namespace: str, kubectl: Kubectl, tmp_path: Path
) -> None:
    """An emptyDir is one directory for the whole pod: an init container's file is there for
    both containers, one container's write is seen by the other, and a `readOnly` mount of it
    refuses writes ("Read-only file system") while the other mount stays writable; downward-API
    files carry the pod's labels and name."""
    ns, shared = namespace, tmp_path / "shared"
    manifest = pod(
        "sharing",
        ["sh", "-c", f"cat {shared}/init; echo from-writer > {shared}/w; sleep 2"],
        container="writer",
        extra={"volumeMounts": [{"name": "scratch", "mountPath": str(shared)}]},
    )
    manifest["metadata"]["labels"] = {"app": "volumes", "tier": "e2e"}
    reader_script = textwrap.dedent(
        f"""\
        while [ ! -f {tmp_path}/ro/w ]; do sleep 0.1; done
        cat {tmp_path}/ro/init {tmp_path}/ro/w
        echo no > {tmp_path}/ro/attempt || echo "write refused"
        cat {tmp_path}/info/name; echo; cat {tmp_path}/info/labels; echo
        """
    )
    manifest["spec"]["containers"].append(
        {
            "name": "reader",
            "image": "busybox",
            "command": ["sh", "-c", reader_script],
            "volumeMounts": [
                {"name": "scratch", "mountPath": f"{tmp_path}/ro", "readOnly": True},
                {"name": "info", "mountPath": f"{tmp_path}/info"},
            ],
        }
    )
    manifest["spec"]["initContainers"] = [
        {
            "name": "init",
            "image": "busybox",
            "command": ["sh", "-c", f"echo from-init > {shared}/init"],
            "volumeMounts": [{"name": "scratch", "mountPath": str(shared)}],
        }
    ]
    manifest["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {}},
        {
            "name": "info",
            "downwardAPI": {
                "items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                ]
            },
        },
    ]
    create(admin, ns, "pods", manifest)
    done = finished(admin, ns, "sharing")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert logs_of(kubectl, "sharing", "writer") == "from-init\n"
    reader = logs_of(kubectl, "sharing", "reader").splitlines()
    assert reader[:2] == ["from-init", "from-writer"], reader
    assert "Read-only file system" in reader[2] and reader[3] == "write refused", reader
    assert reader[4:] == ["sharing", 'app="volumes"', 'tier="e2e"'], reader
    assert not (tmp_path / "ro" / "attempt").exists()


def _service_account_with_configmap_reader(admin: Kube, namespace: str) -> None:
    create(
        admin,
        namespace,
        "serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
    )
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    admin.create(
        f"{rbac}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    admin.create(
        f"{rbac}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader-reads-configmaps"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "configmap-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )


IN_CLUSTER = textwrap.dedent(
    """\
    import json
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    config.load_incluster_config()
    conf = client.Configuration.get_default_copy()
    out = {"host": conf.host, "verify_ssl": conf.verify_ssl, "ca": conf.ssl_ca_cert}
    core = client.CoreV1Api()
    ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    out["namespace"] = ns
    out["configmaps"] = sorted(c.metadata.name for c in core.list_namespaced_config_map(ns).items)
    try:
        core.list_namespaced_secret(ns)
        out["secrets"] = "allowed"
    except ApiException as exc:
        out["secrets"] = exc.status
    review = client.AuthenticationV1Api().create_self_subject_review(
        client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    )
    info = review.status.user_info
    out["user"] = info.username
    out["extra"] = {k: v for k, v in (info.extra or {}).items() if "pod-" in k}
    print(json.dumps(out))
    """
)


def test_in_cluster_client_acts_as_the_pods_service_account(
    admin: Kube, namespace: str, kubectl: Kubectl, cluster: Cluster
) -> None:
    """The ServiceAccount admission plugin's projected volume (token, kube-root-ca.crt's
    ca.crt, namespace) is mounted at /var/run/secrets/kubernetes.io/serviceaccount, so the
    official client's `load_incluster_config()` works: TLS verifies against the mounted ca.crt,
    the service account may list ConfigMaps (its RoleBinding) and is Forbidden to list Secrets,
    and the API server knows the caller as that service account, bound to this very pod."""
    ns = namespace
    _service_account_with_configmap_reader(admin, ns)
    manifest = pod("incluster", [sys.executable, "-c", IN_CLUSTER])
    manifest["spec"]["serviceAccountName"] = "reader"
    create(admin, ns, "pods", manifest)
    done = finished(admin, ns, "incluster")
    assert done["status"]["phase"] == "Succeeded", logs_of(kubectl, "incluster")

    injected = [v for v in done["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert len(injected) == 1, done["spec"]["volumes"]
    sources = injected[0]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"

    out = json.loads(logs_of(kubectl, "incluster").splitlines()[-1])
    assert out["host"] == cluster.server  # KUBERNETES_SERVICE_HOST/PORT: the API server itself
    assert out["verify_ssl"] is True and out["ca"] == f"{TOKEN_DIR}/ca.crt"
    assert out["namespace"] == ns
    assert "kube-root-ca.crt" in out["configmaps"]
    assert out["secrets"] == 403
    assert out["user"] == f"system:serviceaccount:{ns}:reader"
    assert out["extra"]["authentication.kubernetes.io/pod-name"] == ["incluster"]
    assert out["extra"]["authentication.kubernetes.io/pod-uid"] == [done["metadata"]["uid"]]


def test_automount_off_means_no_token(admin: Kube, namespace: str, kubectl: Kubectl) -> None:
    """`automountServiceAccountToken: false` on the pod, or on its service account, means the
    API server injects no token volume and the pod finds no token file (not even one the host
    may have at that path), so the in-cluster configuration is refused."""
    ns = namespace
    create(
        admin,
        ns,
        "serviceaccounts",
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "quiet"},
            "automountServiceAccountToken": False,
        },
    )
    script = textwrap.dedent(
        f"""\
        import os
        from kubernetes import config
        print("entries", len(os.listdir("{TOKEN_DIR}")) if os.path.isdir("{TOKEN_DIR}") else 0)
        try:
            config.load_incluster_config()
            print("configured")
        except config.ConfigException as exc:
            print("refused:", exc)
        """
    )
    off = pod("pod-off", [sys.executable, "-c", script])
    off["spec"]["automountServiceAccountToken"] = False
    by_account = pod("account-off", [sys.executable, "-c", script])
    by_account["spec"]["serviceAccountName"] = "quiet"
    for manifest in (off, by_account):
        create(admin, ns, "pods", manifest)
    for name in ("pod-off", "account-off"):
        done = finished(admin, ns, name)
        assert done["status"]["phase"] == "Succeeded", logs_of(kubectl, name)
        assert not any(
            v["name"].startswith("kube-api-access-") for v in done["spec"].get("volumes") or []
        ), done["spec"]
        assert logs_of(kubectl, name).splitlines() == [
            "entries 0",
            "refused: Service token file does not exist.",
        ]


def test_missing_secret_holds_pod_in_container_creating(admin: Kube, namespace: str) -> None:
    """A Secret volume whose Secret does not exist keeps the pod Pending with its container
    waiting in ContainerCreating (saying why), as the kubelet does; once the Secret exists the
    pod runs."""
    ns = namespace
    manifest = pod("waits", ["sh", "-c", "exit 0"])
    manifest["spec"]["volumes"] = [{"name": "later", "secret": {"secretName": "later"}}]

    def waiting() -> JSON | None:
        obj = get_pod(admin, ns, "waits")
        statuses = obj.get("status", {}).get("containerStatuses") or []
        state = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return obj if "not found" in state.get("message", "") else None

    create(admin, ns, "pods", manifest)
    held = wait_for(waiting, timeout=30, what="ContainerCreating with a message")
    assert held["status"]["phase"] == "Pending"
    waiting_state = container_status(held)["state"]["waiting"]
    assert waiting_state["reason"] == "ContainerCreating"
    assert 'secret "later" not found' in waiting_state["message"]
    create(
        admin,
        ns,
        "secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "later"}, "data": {}},
    )
    assert finished(admin, ns, "waits")["status"]["phase"] == "Succeeded"


def _make(target: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", "e2e/e2e.mk", target, f"DEV_DIR={run_dir}", PY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_make_down_sweeps_pods_in_mount_namespaces(tmp_path: Path) -> None:
    """Pods whose containers run in their own mount namespaces (an emptyDir and the injected
    token mounted) are still found and stopped: after the node agent is SIGKILLed, leaving a
    pod's processes orphaned (one of them outside its process group), `make down` stops every
    process of the run and leaves none."""
    run_dir = tmp_path / "dev"
    cluster = Cluster(run_dir)
    cluster.start()
    try:
        admin = cluster.client()
        manifest = pod(
            "orphan",
            ["sh", "-c", "setsid sleep 3600 & exec sleep 3600"],
            extra={"volumeMounts": [{"name": "scratch", "mountPath": str(tmp_path / "s")}]},
        )
        manifest["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        admin.create("/api/v1/namespaces/default/pods", manifest)
        wait_for(lambda: pod_phase(admin, "default", "orphan", "Running"), timeout=60)
        admin.close()

        def sleepers() -> list[int]:
            return [
                pid
                for pid in procs.marked_pids(run_dir)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
            ]

        found: list[int] = wait_for(
            lambda: sleepers() if len(sleepers()) == 2 else None, timeout=10
        )
        ours = os.readlink("/proc/self/ns/mnt")
        for pid in found:
            assert os.readlink(f"/proc/{pid}/ns/mnt") != ours
            mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            mounted = {line.split()[4] for line in mountinfo}
            assert {str(tmp_path / "s"), TOKEN_DIR.replace("/var/run", "/run")} <= mounted
        agent = next(p.pid for p in cluster.procs if p.name == "node-agent")
        os.kill(agent, signal.SIGKILL)
        wait_for(lambda: not procs.pid_alive(agent), timeout=10)
        assert sorted(sleepers()) == sorted(found)  # orphaned, still running
    finally:
        down = _make("down", run_dir)
        cluster.stop()  # reaps our children; a no-op for what `make down` already stopped
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no process of this run is left" in down.stdout
    assert procs.marked_pids(run_dir) == []
