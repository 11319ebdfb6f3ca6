"""Signed audit chain heads on the control plane: the operator as a platform runs it, with its
signing key (issue 29).

A platform gives the operator a key; every run that comes to rest gets its chain head signed on
the chain itself, and an auditor with the public key finds a rewrite of the store that the
store's own links cannot show. These tests must never depend on objects outside their own
namespace, and leave the session's operator running.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from keelgate.core.audit import AuditEvent, event_hash

from keelgate_e2e import runs
from keelgate_e2e.cluster import Cluster
from keelgate_e2e.keelgate import OperatorPod, OperatorProcess, store_url, tenant_dsn
from keelgate_e2e.kube import Kube
from keelgate_e2e.plugin import KubectlKeelgate
from keelgate_e2e.runs import agentrun, apply, order, wait_phase
from keelgate_e2e.shop import ShopServer
from keelgate_e2e.testing import Kubectl, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def signing_operator(
    operator_process: OperatorPod, cluster: Cluster, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, Path]]:
    """The operator with --audit-sign-key (the session's operator is stopped meanwhile); and
    the public key an auditor is given."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = tmp_path / "operator-audit.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = tmp_path / "operator-audit.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    operator_process.stop()
    signing = OperatorProcess(
        cluster,
        operator_process.kubeconfig,
        name="operator-signing",
        env=dict(operator_process.env),
        extra_args=(f"--audit-sign-key={private}",),
    )
    signing.start()
    try:
        yield signing, public
    finally:
        signing.stop()
        operator_process.start()


def test_a_rewrite_of_the_store_is_found_against_the_heads_the_operator_signed(
    signing_operator: tuple[OperatorProcess, Path],
    cluster: Cluster,
    tenant: str,
    admin: Kube,
    kubectl: Kubectl,
    kubectl_bin: Path,
    shop: ShopServer,
) -> None:
    """A run orders once and succeeds; the operator puts its signed head on the chain. An
    auditor runs `kubectl keelgate audit RUN --verify --key PUB`: verified. Someone with the
    store changes who acted in an event and recomputes every hash after it: plain --verify
    still passes, --verify --key exits 1 naming the rewritten chain."""
    _, public = signing_operator
    apply(kubectl, agentrun("signed", shop, [[order("H1", 1)]]))
    wait_phase(admin, tenant, "signed", "Succeeded", timeout=120)

    def signed_head() -> bool:
        events = runs.audit_events(cluster.dsn, tenant, "signed")
        return any(e.type == "audit.head_signed" for e in events)

    wait_for(signed_head, timeout=60, what="the operator's signed head on the chain")
    auditor = KubectlKeelgate(kubectl_bin, cluster.kubeconfig, "admin", tenant).with_env(
        KEELGATE_STORE=store_url(admin, tenant)
    )
    verified = auditor("audit", "signed", "--verify", "--key", str(public))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with psycopg.connect(tenant_dsn(cluster, tenant)) as conn:
        rows = conn.execute(
            "SELECT seq, type, actor, at, data, key, prev, writer, writer_kind "
            "FROM keelgate_audit WHERE tenant = %s AND run = %s ORDER BY seq",
            (tenant, "signed"),
        ).fetchall()
        prev = None
        for seq, type_, actor, at, data, key, old_prev, writer, kind in rows:
            if seq == 2:
                actor = "mallory"
            if seq >= 2:
                event = AuditEvent(
                    seq, type_, actor, at, json.loads(data), key, prev or old_prev, "", writer, kind
                )
                digest = event_hash(tenant, "signed", event)
                conn.execute(
                    "UPDATE keelgate_audit SET actor = %s, prev = %s, hash = %s "
                    "WHERE tenant = %s AND run = %s AND seq = %s",
                    (actor, event.prev, digest, tenant, "signed", seq),
                )
                prev = digest
    plain = auditor("audit", "signed", "--verify")
    assert plain.returncode == 0, plain.stdout  # the links hold: the store alone cannot tell
    caught = auditor("audit", "signed", "--verify", "--key", str(public))
    assert caught.returncode == 1
    assert "the chain up to it was rewritten" in caught.stdout, caught.stdout
