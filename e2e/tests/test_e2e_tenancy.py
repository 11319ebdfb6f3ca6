"""Tenants that share the store cannot touch each other, on the control plane through real step
pods: tenant A's own code, a Python tool in A's step pod holding A's store URL (its Secret, made
by `keelgate tenant add`), attacks tenant B's runs while they wait for a person, and B's runs then
finish with each WRITE once.

The cluster's PostgreSQL asks every connection for a password, so A's pod can log in only as A's
role. It must never settle anything against the shop's record.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from keelgate.core.types import idempotency_key

from keelgate_e2e import keelgate as kg
from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.runs import agentrun, apply, look, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, condition, wait_for

pytestmark = pytest.mark.e2e

TABLES = ("keelgate_checkpoints", "keelgate_keys", "keelgate_audit", "keelgate_specs")


@pytest.fixture
def attacker(admin: Kube, cluster: Cluster, tenant: str) -> Iterator[str]:
    """A second tenant namespace beside the test's, with its own role and store Secret."""
    name = f"{tenant[:50]}-a"
    kg.make_namespace(admin, name)
    kg.add_tenant(cluster, name)
    yield name
    admin.delete(f"/api/v1/namespaces/{name}")


def _rows(cluster: Cluster, tenant: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tenant``, as the administrator reads them in its database."""
    with psycopg.connect(kg.tenant_dsn(cluster, tenant), autocommit=True) as conn:
        return {
            table: conn.execute(
                f"SELECT * FROM {table} WHERE tenant = %s ORDER BY 1, 2, 3", (tenant,)
            ).fetchall()
            for table in TABLES
        }


def _reports(dsn: str, tenant: str, run: str) -> list[JSON]:
    """The probe's reports, as its step pods recorded them in the run's checkpoint."""
    from keelgate.stores import open_stores

    stores = open_stores(dsn)
    try:
        checkpoint = stores.checkpoints.load(tenant, run)
    finally:
        stores.close()
    assert checkpoint is not None
    found: list[JSON] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "isolation" in value and isinstance(value["isolation"], dict):
                found.append(value["isolation"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(checkpoint.state)
    return found


def test_a_python_tool_in_a_tenants_step_pod_reads_and_changes_nothing_of_another_tenant(
    operator: kg.OperatorPod,
    tenant: str,
    attacker: str,
    admin: Kube,
    kubectl: Kubectl,
    alice: Kubectl,
    shop: ShopServer,
    cluster: Cluster,
) -> None:
    """B (the test's tenant) has a run stopped on an unknown outcome (its step pod killed right
    after the shop took the order) and one waiting for approval. A's run calls the Python tool
    `keelgate.testing.isolation:probe` in its own step pods, with the store URL A's pods hold:
    every read of B's checkpoints, plans, approvals, keys, specs and audit events sees nothing,
    every write is refused or touches nothing, settling or deciding for B through Keelgate
    fails, and A cannot rewrite its own history; B's rows are exactly as before. Then alice
    settles B's unknown outcome with the shop's word and approves B's action: both runs finish,
    each order placed once, and `keelgate audit --verify` with B's own URL passes."""
    b, a = tenant, attacker
    apply(
        kubectl,
        agentrun(
            "victim",
            shop,
            [[order("V1", 1)]],
            annotations={"keelgate.dev/failpoints": "after_gateway_call@1"},
        ),
        agentrun("waiting", shop, [[look("W1"), order("W1", 2)]], approval=True),
    )
    stopped = wait_phase(admin, b, "victim", "Stopped", timeout=120)
    assert stopped["status"]["stopReason"] == "outcome_unknown"
    waiting = wait_phase(admin, b, "waiting", "Stopped", timeout=120)
    assert condition(waiting, "AwaitingApproval")["status"] == "True"  # type: ignore[index]
    wait_for(lambda: runs.reconciliations(admin, b), what="B's Reconciliation")
    wait_for(lambda: runs.approvals(admin, b), what="B's Approval")
    key = runs.reconciliations(admin, b)[0]["spec"]["idempotencyKey"]
    approval_key = idempotency_key(b, "waiting", "place_order", {"sku": "W1", "qty": 2})
    before = _rows(cluster, b)
    assert all(before[table] for table in TABLES)

    probe = {
        "name": "probe",
        "sideEffect": "READ",
        "timeoutSeconds": 60,
        "python": {"callable": "keelgate.testing.isolation:probe"},
    }
    script = [
        {"actions": [{"tool": "probe", "args": {"victim": b, "own": a, "key": key}}]},
        {"actions": [{"tool": "probe", "args": {"victim": b, "own": a, "run": "waiting"}}]},
        {"done": True, "answer": "probed"},
    ]
    prober = {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "prober"},
        "spec": {
            "goal": "try to reach another tenant's runs",
            "model": {"provider": "scripted", "name": "demo", "script": script},
            "tools": [probe],
            "budget": {"maxIterations": 5},
        },
    }
    in_a = Kubectl(kubectl.binary, kubectl.kubeconfig, "admin", a)
    apply(in_a, prober)
    wait_phase(admin, a, "prober", "Succeeded", timeout=180)
    reports = _reports(cluster.dsn, a, "prober")
    assert len(reports) == 2, reports
    for report in reports:
        assert report["role"] == f"keelgate-{a}"
        assert report["breaches"] == {} and report["unexpected"] == {}, report["outcomes"]
    assert _rows(cluster, b) == before
    pods = admin.get(f"/api/v1/namespaces/{a}/pods")["items"]
    env = [e for p in pods for c in p["spec"]["containers"] for e in c.get("env", [])]
    from_secret = {"secretKeyRef": {"name": "keelgate-store", "key": "url"}}
    assert {"name": "KEELGATE_STORE", "valueFrom": from_secret} in env  # A's own Secret

    assert runs.settle_truly(alice, admin, b, shop) == 1
    name = runs.approvals(admin, b)[0]["metadata"]["name"]
    patch = '{"spec": {"approved": true, "by": "alice"}}'
    alice("patch", "approval", name, "--type=merge", "-p", patch)
    for run in ("victim", "waiting"):
        wait_phase(admin, b, run, "Succeeded", timeout=180)
    assert shop.shop.by_key() == {key: 1, approval_key: 1}
    own = kg.store_url(admin, b)
    keelgate = str(Path(sys.executable).parent / "keelgate")
    for run in ("victim", "waiting"):
        verified = subprocess.run(
            [keelgate, "audit", run, "-n", b, "--verify"],
            env={"KEELGATE_STORE": own, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert verified.returncode == 0, verified.stderr
        assert "chain verified" in verified.stdout
        assert kg.password_of(own) not in verified.stdout + verified.stderr


def test_the_step_pods_store_url_logs_in_as_the_tenants_role_only(
    operator: kg.OperatorPod, tenant: str, admin: Kube, cluster: Cluster
) -> None:
    """The cluster's PostgreSQL asks every connection for its password: the tenant's URL (from
    its Secret) logs in as the tenant's role, which is no superuser; the same URL with the
    superuser's name, or with no password, is refused; and the administrator's URL is not what
    any tenant or the operator holds."""
    own = kg.store_url(admin, tenant)
    with psycopg.connect(own) as conn:
        row = conn.execute(
            "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert row == (f"keelgate-{tenant}", False, False)
    as_admin = own.replace(f"keelgate-{tenant}:", "keelgate:", 1)
    no_password = own.replace(f":{kg.password_of(own)}@", "@", 1)
    for url in (as_admin, no_password):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(url, connect_timeout=5).close()
    assert operator.store_url.split("@", 1)[0] != cluster.dsn.split("@", 1)[0]
    assert "keelgate-operator:" in operator.store_url


def test_keelgate_tenant_add_list_remove_with_the_namespaces_secret(
    admin: Kube, namespace: str, cluster: Cluster, keelgate_installed: None
) -> None:
    """`keelgate tenant add NS` as a user of the cluster (kubeconfig context admin) writes the
    namespace's Secret with the role's URL, and run again leaves it unchanged; a new --host is
    written with the same password; --rotate sets a new one (the old URL no longer logs in) and
    keeps the Secret's host.
    alice, who may not write Secrets there, is refused in one line before the database
    changes, and so is a namespace that does not exist (naming NAMESPACE). `tenant list` names
    the role; `tenant remove` drops it and deletes the Secret. No
    output shows a password."""
    keelgate = str(Path(sys.executable).parent / "keelgate")
    env = {"KEELGATE_STORE": cluster.dsn, "KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin"}

    def run(*args: str, context: str = "admin") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [keelgate, "tenant", *args, "--context", context] if args[0] != "list"
            else [keelgate, "tenant", *args],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    role = f"keelgate-{namespace}"
    outputs = []
    refused = run("add", namespace, context="alice")
    outputs.append(refused)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") == 1 and "secret" in refused.stderr.lower()
    nowhere = run("add", f"{namespace[:40]}-nowhere")
    outputs.append(nowhere)
    assert nowhere.returncode == 2
    assert nowhere.stderr.startswith("keelgate: error: NAMESPACE: no namespace"), nowhere.stderr
    first = run("add", namespace)
    outputs.append(first)
    assert first.returncode == 0, first.stderr
    assert f"role {role} created" in first.stdout
    assert f"Secret {namespace}/keelgate-store written" in first.stdout
    url = kg.store_url(admin, namespace)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (role,)
    again = run("add", namespace)
    outputs.append(again)
    assert again.returncode == 0 and "unchanged" in again.stdout and "kept" in again.stdout
    assert kg.store_url(admin, namespace) == url
    moved = run("add", namespace, "--host", "db.example:6432")
    outputs.append(moved)
    assert moved.returncode == 0 and "password unchanged" in moved.stdout
    assert kg.store_url(admin, namespace) == url.replace(
        url.rsplit("@", 1)[1].split("/")[0], "db.example:6432"
    )
    rotated = run("add", namespace, "--rotate")  # the Secret's host is kept
    outputs.append(rotated)
    assert rotated.returncode == 0 and "a new password" in rotated.stdout
    new_url = kg.store_url(admin, namespace)
    assert "@db.example:6432/" in new_url
    assert kg.password_of(new_url) != kg.password_of(url)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(url, connect_timeout=5).close()
    here = url.rsplit("@", 1)[1].split("/")[0]
    with psycopg.connect(new_url.replace("db.example:6432", here)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (role,)
    listed = run("list")
    outputs.append(listed)
    rows = [line.split()[:3] for line in listed.stdout.splitlines()]
    assert [namespace, role, "tenant"] in rows
    assert not any(row[0].endswith("-nowhere") for row in rows)  # refused before the database
    removed = run("remove", namespace)
    outputs.append(removed)
    assert removed.returncode == 0, removed.stderr
    assert f"role {role} dropped" in removed.stdout and "Secret" in removed.stdout
    assert not admin.exists(f"/api/v1/namespaces/{namespace}/secrets/keelgate-store")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            new_url.replace("db.example:6432", url.rsplit("@", 1)[1].split("/")[0]),
            connect_timeout=5,
        ).close()
    passwords = (kg.STORE_PASSWORD, kg.password_of(url), kg.password_of(new_url))
    for done in outputs:
        assert all(p not in done.stdout + done.stderr for p in passwords)
