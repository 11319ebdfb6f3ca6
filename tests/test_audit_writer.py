"""The database says who wrote each audit event, and a decision written by a role that may not
make it fails verification.

On a server that checks passwords, tenant B's runs are driven with B's own role (as its step
pods are), and the operator's role settles, approves and signs heads, as the operator does from
Reconciliations, Approvals and ``--audit-sign-key``. Each event records the role that wrote it
and what that role is, set by the database (a trigger the writer cannot disable, and that
refuses an insert naming anyone else); ``keelgate audit --verify``, the signed export and the
inbox's trail show it. Code in B's step pod, holding B's URL, can still append well-formed
events after the operator's last signed head (issue 36, "happens today" 6): a settlement by
"alice", an approval, a copy of a signed head. Each now fails verification, naming the event
and the role, and the export refuses to sign the chain.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from crashkit import Journal, Rig, World, url_opener
from keelgate.adapters.signing import load_private_key, sign_envelope
from keelgate.core.attestation import HEAD_EVENT, head_statement, statement
from keelgate.core.audit import AuditDraft, seal, utc_now
from keelgate.core.loop import Loop
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import StopReason
from keelgate.stores import open_stores
from keelgate.stores.tenancy import TenantStore, tenant_database
from keelgate.testing.pgserver import PgServer, start_postgres
from test_kubectl_plugin import kubeconfig

pytestmark = pytest.mark.postgres

ADMIN_PASSWORD = "Admin-pw-writer-5531"
ORDER = [
    {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]},
    {"done": True, "answer": "ordered A1"},
]


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    pg = start_postgres(password=ADMIN_PASSWORD)
    try:
        yield pg
    finally:
        pg.stop()


@dataclass(frozen=True)
class Store:
    admin: str
    b: str
    operator: str
    ns: str
    role_b: str
    role_operator: str

    @property
    def admin_at_b(self) -> str:
        """The administrator's URL on B's database of its own (``keelgate tenant add``)."""
        home = self.admin.rsplit("/", 1)[1]
        return self.admin.rsplit("/", 1)[0] + "/" + tenant_database(home, self.ns)


@pytest.fixture
def store(server: PgServer) -> Iterator[Store]:
    url = server.create_database()
    ns = f"shop-{secrets.token_hex(3)}"
    role_operator = f"keelgate-operator-{secrets.token_hex(3)}"
    with TenantStore(url) as admin:
        b = admin.add(ns).url
        operator = admin.add("keelgate-system", kind="operator", role=role_operator).url
    try:
        yield Store(url, b, operator, ns, f"keelgate-{ns}", role_operator)
    finally:
        server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def signing(tmp_path: Path) -> tuple[bytes, Path]:
    """The operator's signing key (PEM), and its public key in a file."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = tmp_path / "operator.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pem, public


def _spec(ns: str, run: str) -> LoopSpec:
    return LoopSpec(ns, run, "restock the shop", budget=Budget(max_iterations=5))


def _keelgate(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEELGATE_STORE": store}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _sign_head(operator_url: str, ns: str, run: str, pem: bytes) -> None:
    """What the operator does when a run comes to rest (``kube/controller/signed_heads.py``):
    sign the chain's head and put the envelope on the chain, with the operator's role."""
    stores = open_stores(operator_url)
    try:
        head = stores.audit.events(ns, run)[-1]
        document = head_statement(ns, run, head.seq, head.hash, signed_at=utc_now())
        payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        envelope = dict(sign_envelope(payload, load_private_key(pem)))
        draft = AuditDraft(
            HEAD_EVENT,
            {"seq": head.seq, "hash": head.hash, "envelope": envelope},
            actor="keelgate-operator",
            key=f"head-signed-{head.seq}",
        )
        stores.audit.append(ns, run, [draft])
    finally:
        stores.close()


def _finished_with_decisions(store: Store, tmp_path: Path, pem: bytes) -> None:
    """B's "restock" dies inside its WRITE (the shop took the order); the operator's role
    settles it (executed); B's "approve-me" waits for approval, which the operator's role
    gives; B finishes both; the operator signs each head."""
    ns = store.ns
    world = World(Journal(tmp_path / "world.jsonl", fsync=False))
    rig = Rig(url_opener(store.b), world, ORDER)
    try:
        rig.attempt(_spec(ns, "restock"), crash=("mid_tool", 1))
        stopped = rig.loop.run_or_resume(_spec(ns, "restock"))
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN
    finally:
        rig.die()
    asking = World(world.journal, approval=frozenset({"place_order"}))
    rig = Rig(url_opener(store.b), asking, ORDER)
    try:
        waiting = rig.loop.run_or_resume(_spec(ns, "approve-me"))
        assert waiting.stop.reason is StopReason.AWAITING_APPROVAL
    finally:
        rig.die()
    operator = open_stores(store.operator)
    try:
        Loop(stores=operator).reconcile(ns, "restock", "1:0", executed=True, by="alice")
        Loop(stores=operator).approve(ns, "approve-me", "1:0", approved=True, by="bob")
    finally:
        operator.close()
    for run, this in (("restock", world), ("approve-me", asking)):
        rig = Rig(url_opener(store.b), this, ORDER)
        try:
            assert rig.loop.run_or_resume(_spec(ns, run)).stop.reason is StopReason.GOAL_MET
        finally:
            rig.die()
        _sign_head(store.operator, ns, run, pem)


def test_each_event_names_the_role_that_wrote_it_and_the_operators_decisions_verify(
    store: Store, tmp_path: Path, signing: tuple[bytes, Path]
) -> None:
    """The run's own events are written by B's role (a tenant's), the settlement, the approval
    and the signed heads by the operator's role, as the database recorded them. `keelgate audit
    --verify --key` passes and shows each writer; `-o json` carries writer and writerKind; the
    signed export (predicate version 2) carries them, and `keelgate audit verify` passes."""
    pem, public = signing
    _finished_with_decisions(store, tmp_path, pem)
    stores = open_stores(store.admin)
    try:
        events = stores.audit.events(store.ns, "restock")
    finally:
        stores.close()
    writers = {(e.type, e.writer, e.writer_kind) for e in events}
    assert ("loop.started", store.role_b, "tenant") in writers
    assert ("loop.reconciled", store.role_operator, "operator") in writers
    assert (HEAD_EVENT, store.role_operator, "operator") in writers
    assert {e.writer for e in events} == {store.role_b, store.role_operator}
    approvals = [e for e in open_stores(store.admin).audit.events(store.ns, "approve-me")]
    assert [(e.writer, e.writer_kind) for e in approvals if e.type == "loop.approved"] == [
        (store.role_operator, "operator")
    ]
    shown = _keelgate(
        "audit", "restock", "-n", store.ns, "--verify", "--key", str(public), store=store.b
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "written by" in shown.stdout and store.role_operator in shown.stdout
    assert "chain verified" in shown.stdout
    as_json = _keelgate("audit", "restock", "-n", store.ns, "-o", "json", store=store.b)
    document = json.loads(as_json.stdout)
    assert {(e["writer"], e["writerKind"]) for e in document["events"]} == {
        (store.role_b, "tenant"),
        (store.role_operator, "operator"),
    }
    (tmp_path / "sign.pem").write_bytes(pem)
    out = tmp_path / "restock.dsse.json"
    exported = _keelgate(
        "audit", "export", "restock", "-n", store.ns, "--sign-key", str(tmp_path / "sign.pem"),
        "--output-file", str(out), store=store.b,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    payload = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
    assert payload["predicateType"] == "https://keelgate.dev/audit-chain/v2"
    assert all(
        e["writer"] in (store.role_b, store.role_operator) for e in payload["predicate"]["events"]
    )
    checked = _keelgate("audit", "verify", str(out), "--key", str(public), store=store.b)
    assert checked.returncode == 0, checked.stderr


def _append_as_b(store: Store, run: str, drafts: list[AuditDraft]) -> None:
    """What code in B's step pod can do with the URL it holds: append well-formed events."""
    stores = open_stores(store.b, pooled=False)
    try:
        stores.audit.append(store.ns, run, drafts)
    finally:
        stores.close()


def test_a_decision_a_step_pod_writes_after_the_last_signed_head_fails_verification(
    store: Store, tmp_path: Path, signing: tuple[bytes, Path]
) -> None:
    """Issue 36, "happens today" 6: after the operator signed the head, B's role (what a step
    pod's code holds) appends a settlement by alice, an approval by bob and a copy of the
    operator's own signed head, each well formed and chained. `keelgate audit --verify` (with
    and without --key) fails with one line for each, naming the role; `keelgate audit export`
    refuses to sign; the inbox's trail shows the chain broken and who wrote each event."""
    from keelgate.cli.plugin.target import Target
    from keelgate.cli.plugin.ui.views import Views

    pem, public = signing
    _finished_with_decisions(store, tmp_path, pem)
    stores = open_stores(store.b)
    try:
        head = stores.audit.events(store.ns, "restock")[-1]
    finally:
        stores.close()
    assert head.type == HEAD_EVENT
    _append_as_b(
        store,
        "restock",
        [
            AuditDraft(
                "loop.reconciled",
                {"action": "1:0", "tool": "place_order", "source": "human", "verdict": "abandoned"},
                actor="alice",
            ),
            AuditDraft("loop.approved", {"action": "2:0", "verdict": "approved"}, actor="bob"),
            AuditDraft(HEAD_EVENT, dict(head.data), actor="keelgate-operator"),
        ],
    )
    for key in ([], ["--key", str(public)]):
        verified = _keelgate("audit", "restock", "-n", store.ns, "--verify", *key, store=store.b)
        assert verified.returncode == 1, verified.stdout
        broken = [line for line in verified.stdout.splitlines() if "chain BROKEN" in line]
        assert len(broken) == 3, verified.stdout
        assert all(f"role {store.role_b}" in line for line in broken)
        assert "a person's settlement" in broken[0] and "a signed head" in broken[2]
    (tmp_path / "sign.pem").write_bytes(pem)
    exported = _keelgate(
        "audit", "export", "restock", "-n", store.ns, "--sign-key", str(tmp_path / "sign.pem"),
        "--output-file", str(tmp_path / "out.json"), store=store.b,
    )  # fmt: skip
    assert exported.returncode == 1 and "not signed" in exported.stderr
    assert not (tmp_path / "out.json").exists()
    config = kubeconfig(tmp_path / "kubeconfig", server="https://127.0.0.1:9", me="shop")
    recorded = Views(Target(str(config), "me", store.ns), store=store.b).recorded(
        store.ns, "restock", trail=True
    )
    assert recorded.verified is False and len(recorded.problems) == 3
    html = _trail_html(recorded)
    assert f"{store.role_b} (tenant)" in html and f"{store.role_operator} (operator)" in html
    assert "Chain broken" in html


def _trail_html(recorded: Any) -> str:
    from types import SimpleNamespace

    from keelgate.cli.plugin.ui import pages

    return pages._trail(SimpleNamespace(recorded=recorded))  # type: ignore[arg-type]


def test_a_settlement_by_a_confirmer_in_the_step_pod_verifies(store: Store, tmp_path: Path) -> None:
    """A confirmer runs in the tenant's step pod, so its settlement is written by the tenant's
    role; that is its word, and the chain verifies."""
    world = World(Journal(tmp_path / "world.jsonl", fsync=False))
    rig = Rig(url_opener(store.b), world, ORDER, confirm=True)
    try:
        spec = _spec(store.ns, "confirmed")
        rig.attempt(spec, crash=("mid_tool", 1))
        assert rig.loop.run_or_resume(spec).stop.reason is StopReason.GOAL_MET
        events = rig.loop.audit(store.ns, "confirmed")
        settled = [e for e in events if e.type == "loop.reconciled"]
        assert [(e.data["source"], e.writer_kind) for e in settled] == [("confirmer", "tenant")]
        assert rig.loop.verify_audit(store.ns, "confirmed").ok
    finally:
        rig.die()


def test_an_event_sealed_without_its_writer_verifies_and_a_changed_writer_does_not(
    store: Store, tmp_path: Path
) -> None:
    """A client of the release before seals events without their writer and inserts none: the
    database records it all the same, and the chain verifies (its hash is the old kind). An
    event sealed with its writer covers it: the owner changing the writer afterwards (say, to
    make a tenant's settlement look like the operator's) breaks the chain at that event."""
    ns = store.ns
    world = World(Journal(tmp_path / "world.jsonl", fsync=False))
    rig = Rig(url_opener(store.b), world, ORDER)
    try:
        assert rig.loop.run_or_resume(_spec(ns, "r")).stop.reason is StopReason.GOAL_MET
        head = rig.loop.audit(ns, "r")[-1]
    finally:
        rig.die()
    old = seal(ns, "r", head, AuditDraft("loop.note", {"by": "an older release"}))
    with psycopg.connect(store.b, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO keelgate_audit (tenant, run, seq, type, actor, at, data, key, prev, "
            "hash) VALUES (%s, 'r', %s, %s, %s, %s, %s, NULL, %s, %s)",
            (ns, old.seq, old.type, old.actor, old.at, json.dumps(old.data), old.prev, old.hash),
        )
    stores = open_stores(store.b)
    try:
        last = stores.audit.events(ns, "r")[-1]
        assert (last.seq, last.writer, last.writer_kind) == (old.seq, store.role_b, "tenant")
        assert Loop(stores=stores).verify_audit(ns, "r").ok
        stores.audit.append(
            ns, "r", [AuditDraft("loop.reconciled", {"source": "confirmer"}, actor="x")]
        )
        forged = stores.audit.events(ns, "r")[-1]
    finally:
        stores.close()
    with psycopg.connect(store.admin_at_b, autocommit=True) as conn:
        conn.execute(
            "UPDATE keelgate_audit SET writer = %s, writer_kind = 'operator' "
            "WHERE tenant = %s AND run = 'r' AND seq = %s",
            (store.role_operator, ns, forged.seq),
        )
    stores = open_stores(store.admin)
    try:
        report = Loop(stores=stores).verify_audit(ns, "r")
    finally:
        stores.close()
    assert report.problems == (f"event {forged.seq} (loop.reconciled) was altered",)


def test_a_signed_export_whose_decision_a_tenant_wrote_fails_offline(
    store: Store, tmp_path: Path, signing: tuple[bytes, Path]
) -> None:
    """Whoever signs it, a version-2 export holding a person's settlement written by a
    tenant's role does not verify offline: `keelgate audit verify` names the event and role."""
    pem, public = signing
    _finished_with_decisions(store, tmp_path, pem)
    _append_as_b(
        store,
        "restock",
        [AuditDraft("loop.reconciled", {"source": "human", "verdict": "executed"}, actor="al")],
    )
    stores = open_stores(store.b)
    try:
        events = stores.audit.events(store.ns, "restock")
    finally:
        stores.close()
    document = statement(store.ns, "restock", events, spec_sha256="0" * 64, exported_at=utc_now())
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    file = tmp_path / "forged.dsse.json"
    file.write_text(json.dumps(sign_envelope(payload, load_private_key(pem))))
    checked = _keelgate("audit", "verify", str(file), "--key", str(public), store=store.b)
    assert checked.returncode == 1
    assert f"written by role {store.role_b}" in checked.stderr
    assert checked.stderr.count("\n") == 1
