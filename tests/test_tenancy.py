"""Tenants that share a PostgreSQL store cannot touch each other: proof by attack.

Each test here runs on a real server that checks passwords (SCRAM-SHA-256 for every role, as a
production server does), with two tenants and the operator each logging in as their own role,
made by ``keelgate tenant add`` (``keelgate.stores.tenancy``). Tenant B has runs stopped where a
person must act (an unknown outcome, an approval) with specs the operator recorded; tenant A, with
its own URL, tries every read, insert, update and delete of B's checkpoints (plans and approvals
are in them), keys, specs and audit events, straight through psycopg and through Keelgate's own
stores, and tries to rewrite its own history and the rules themselves. It sees nothing and changes
nothing; the operator's role can do what the operator does and no more; and B's runs then finish
with each WRITE once and an audit chain that verifies.
"""

from __future__ import annotations

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
from psycopg import errors

from crashkit import Journal, Rig, World, url_opener
from keelgate.core.loop import Loop
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import KeyState, StopReason, idempotency_key
from keelgate.errors import StoreError
from keelgate.stores import _migrations, open_stores
from keelgate.stores.postgres import PRIVILEGES, PostgresStore
from keelgate.stores.tenancy import TenantStore, scram_verifier, tenant_database
from keelgate.testing.isolation import NOTHING, REFUSED, attack
from keelgate.testing.pgserver import PgServer, start_postgres

pytestmark = pytest.mark.postgres

#: The superuser's password on this module's server: no output may ever show it.
ADMIN_PASSWORD = "Admin-pw-never-shown-4411"
DATA_TABLES = ("keelgate_checkpoints", "keelgate_keys", "keelgate_audit", "keelgate_specs")
ORDER = [
    {"actions": [{"tool": "place_order", "args": {"sku": "A1", "qty": 20}}]},
    {"done": True, "answer": "ordered A1"},
]


@pytest.fixture(scope="module")
def checked_server() -> Iterator[PgServer]:
    """A server of this module's own that asks every connection for its password."""
    server = start_postgres(password=ADMIN_PASSWORD)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def admin_url(checked_server: PgServer) -> Iterator[str]:
    """A fresh database on it, as its owner (the superuser): the administrator's URL."""
    url = checked_server.create_database()
    try:
        yield url
    finally:
        checked_server.drop_database(url.rsplit("/", 1)[1])


@dataclass(frozen=True)
class Shared:
    """One store shared by tenants A and B and the operator, each with its own role's URL:
    each tenant in a database of its own on the server (``keelgate tenant add``), or both in
    the store's own database (``--shared-database``, and every install from before), where
    row-level security alone keeps them apart."""

    admin: str
    a: str
    b: str
    operator: str
    ns_a: str
    ns_b: str
    own_databases: bool

    def at(self, tenant: str) -> str:
        """The administrator's URL on the database ``tenant``'s rows are in."""
        if not self.own_databases:
            return self.admin
        return self.admin.rsplit("/", 1)[0] + "/" + tenant_database(self.home, tenant)

    @property
    def home(self) -> str:
        return self.admin.rsplit("/", 1)[1]


def _unique(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"  # roles belong to the server: one per test


@pytest.fixture(params=["own-databases", "shared-database"])
def shared(admin_url: str, request: pytest.FixtureRequest) -> Shared:
    own = request.param == "own-databases"
    ns_a, ns_b = _unique("shop-a"), _unique("shop-b")
    with TenantStore(admin_url) as admin:
        a = admin.add(ns_a, shared=not own).url
        b = admin.add(ns_b, shared=not own).url
        operator = admin.add(
            "keelgate-system", kind="operator", role=_unique("keelgate-operator")
        ).url
    return Shared(admin_url, a, b, operator, ns_a, ns_b, own)


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(url, autocommit=True)


def _spec(tenant: str, run: str) -> LoopSpec:
    return LoopSpec(tenant, run, "restock the shop", budget=Budget(max_iterations=5))


@dataclass
class Victim:
    """Tenant B's runs, stopped where a person must act, and the world they change."""

    world: World
    unknown: LoopSpec
    approval: LoopSpec
    unknown_key: str
    approval_key: str


def _stop_bs_runs(shared: Shared, tmp_path: Path) -> Victim:
    """B runs two restocks with its own role: one dies inside its WRITE (the shop took the
    order), so the next attempt stops with outcome_unknown; one waits for approval. The
    operator's role recorded both specs, as the operator does before every step pod."""
    world = World(Journal(tmp_path / "b-world.jsonl", fsync=False), approval=frozenset())
    unknown, approval = _spec(shared.ns_b, "restock"), _spec(shared.ns_b, "approve-me")
    operator = open_stores(shared.operator)
    try:
        for spec in (unknown, approval):
            assert operator.specs is not None
            assert operator.specs.record_spec(
                spec.tenant, spec.run, spec.to_json(), source="uid-b", generation=1
            )
    finally:
        operator.close()
    rig = Rig(url_opener(shared.b), world, ORDER)
    try:
        rig.attempt(unknown, crash=("mid_tool", 1))
        stopped = rig.loop.run_or_resume(unknown)
        assert stopped.stop.reason is StopReason.OUTCOME_UNKNOWN, stopped.to_json()
    finally:
        rig.die()
    asking = World(world.journal, approval=frozenset({"place_order"}))
    _run_to(shared.b, asking, approval, StopReason.AWAITING_APPROVAL)
    args = {"sku": "A1", "qty": 20}
    return Victim(
        world,
        unknown,
        approval,
        idempotency_key(shared.ns_b, "restock", "place_order", args),
        idempotency_key(shared.ns_b, "approve-me", "place_order", args),
    )


def _a_runs_its_own(shared: Shared, tmp_path: Path) -> World:
    """A runs a restock of its own to the end, with its own role: a tenant's role can do
    everything a run needs (claims, completions, checkpoints, audit appends, liveness)."""
    world = World(Journal(tmp_path / "a-world.jsonl", fsync=False))
    _run_to(shared.a, world, _spec(shared.ns_a, "mine"), StopReason.GOAL_MET)
    return world


def _run_to(url: str, world: World, spec: LoopSpec, reason: StopReason) -> None:
    """Run or resume ``spec`` with ``url``'s stores (a process of its own) to a stop for
    ``reason``."""
    rig = Rig(url_opener(url), world, ORDER)
    try:
        stopped = rig.loop.run_or_resume(spec)
        assert stopped.stop.reason is reason, stopped.to_json()
    finally:
        rig.die()


def _rows_of(shared: Shared, tenant: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tenant`` in every table, as the administrator reads them."""
    with _connect(shared.at(tenant)) as conn:
        return {
            table: conn.execute(
                f"SELECT * FROM {table} WHERE tenant = %s ORDER BY 1, 2, 3",
                (tenant,),
            ).fetchall()
            for table in DATA_TABLES
        }


def _refused_or_nothing(conn: psycopg.Connection[tuple[Any, ...]], statement: str) -> str:
    """Run one attack; say how PostgreSQL stopped it: "refused" (a privilege or a policy) or
    "nothing" (it touched no row). Anything else fails the test."""
    try:
        cursor = conn.execute(statement)  # type: ignore[arg-type]
    except errors.InsufficientPrivilege:
        return REFUSED
    if cursor.description is not None:  # a read: it must see no row
        rows = cursor.fetchall()
        assert rows == [] or rows == [(0,)], f"{statement}: saw {rows}"
        return NOTHING
    assert cursor.rowcount == 0, f"{statement}: changed {cursor.rowcount} row(s)"
    return NOTHING


def test_a_tenant_reads_and_changes_nothing_of_another_tenant_and_not_its_own_history(
    shared: Shared, tmp_path: Path
) -> None:
    """With A's URL (``keelgate.testing.isolation.attack``, the same attack a Python tool makes
    in A's step pod on the control plane): every read of B's checkpoints (with their plans and
    approvals), keys, specs and audit events sees nothing; every insert as B, upsert over B's
    rows, update and delete of B's rows, move of A's own rows into B, rewrite of A's own audit
    history and change of the rules or of who A is, is refused or touches nothing, each as
    PostgreSQL must answer it; Keelgate's loop with A's stores cannot settle B's unknown
    outcome, decide B's approval or write as B. B's rows, read by the administrator, are
    exactly as before, and B's key still waits for a person."""
    victim = _stop_bs_runs(shared, tmp_path)
    _a_runs_its_own(shared, tmp_path)
    before = _rows_of(shared, shared.ns_b)
    assert all(before[table] for table in DATA_TABLES), "B has rows in every table"
    report = attack(
        shared.a, victim=shared.ns_b, own=shared.ns_a, key=victim.unknown_key, run="restock"
    )
    assert report.role == f"keelgate-{shared.ns_a}"
    assert report.breaches == {} and report.unexpected == {}
    assert report.outcomes["move own keys"] == REFUSED  # A has keys: a policy refuses the move
    waiting = attack(shared.a, victim=shared.ns_b, own=shared.ns_a, run="approve-me")
    assert waiting.breaches == {}
    assert _rows_of(shared, shared.ns_b) == before
    seen = open_stores(shared.admin)
    try:
        record = seen.idempotency.get(shared.ns_b, victim.unknown_key)
        assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
        state = Loop(stores=seen).state(shared.ns_b, "approve-me")
        assert [p.action for p in state.pending] == ["1:0"] and not state.approvals
    finally:
        seen.close()


def test_bs_runs_finish_with_each_write_once_and_a_verified_trail_after_the_attacks(
    shared: Shared, tmp_path: Path
) -> None:
    """After A's attacks, the operator's role settles B's unknown outcome (the shop has the
    order) and approves B's waiting action, as the operator does from a Reconciliation and an
    Approval; B's own role finishes both runs: each order was placed exactly once, and
    `keelgate audit --verify` with B's URL passes for both."""
    victim = _stop_bs_runs(shared, tmp_path)
    for run, key in (("restock", victim.unknown_key), ("approve-me", victim.approval_key)):
        report = attack(shared.a, victim=shared.ns_b, own=shared.ns_a, key=key, run=run)
        assert report.breaches == {}
    operator = open_stores(shared.operator)
    try:
        loop = Loop(stores=operator)
        assert victim.world.happened(victim.unknown_key) == 1  # the shop took it before the death
        loop.reconcile(shared.ns_b, "restock", "1:0", executed=True, by="alice")
        loop.approve(shared.ns_b, "approve-me", "1:0", approved=True, by="bob")
    finally:
        operator.close()
    asking = World(victim.world.journal, approval=frozenset({"place_order"}))
    for spec, world in ((victim.unknown, victim.world), (victim.approval, asking)):
        _run_to(shared.b, world, spec, StopReason.GOAL_MET)
    assert dict(victim.world.effects()) == {victim.unknown_key: 1, victim.approval_key: 1}
    for run in ("restock", "approve-me"):
        verified = _keelgate("audit", run, "-n", shared.ns_b, "--verify", store=shared.b)
        assert verified.returncode == 0, verified.stderr
        assert "chain verified" in verified.stdout


def test_a_tenant_cannot_forge_who_it_is(shared: Shared, tmp_path: Path) -> None:
    """What a session may set for itself changes nothing, even where the administrator lets
    it create temporary tables: a setting named like a tenant, and a temporary table shadowing
    the role lookup (the policies were bound to the real table when made; Keelgate's functions
    and the audit trigger read it through a fixed search_path) leave A seeing its own rows
    only, driving no run of B's, and recorded as the tenant role it is on every audit event it
    writes: naming itself the operator is refused."""
    _stop_bs_runs(shared, tmp_path)
    _a_runs_its_own(shared, tmp_path)
    a, b = shared.ns_a, shared.ns_b
    with _connect(shared.at(a)) as admin:
        database = shared.at(a).rsplit("/", 1)[1]
        admin.execute(f'GRANT TEMPORARY ON DATABASE "{database}" TO "keelgate-{a}"')
    with _connect(shared.a) as conn:
        conn.execute("SELECT set_config('keelgate.tenant', %s, false)", (b,))
        conn.execute("CREATE TEMP TABLE keelgate_tenants (role text, tenant text, kind text)")
        conn.execute("INSERT INTO keelgate_tenants VALUES (current_user, %s, 'operator')", (b,))
        assert conn.execute(
            "SELECT count(*) FROM keelgate_keys WHERE tenant = %s", (b,)
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM keelgate_checkpoints WHERE tenant = %s", (b,)
        ).fetchone() == (0,)
        own = conn.execute("SELECT tenant, kind FROM public.keelgate_tenants").fetchall()
        assert own == [(a, "tenant")]
        spec = f"INSERT INTO keelgate_specs VALUES ('{a}', 'mine', 'self', 1, '{{}}')"
        assert _refused_or_nothing(conn, spec) == REFUSED  # specs are the operator's to write
        with pytest.raises(errors.InsufficientPrivilege, match="may not drive runs"):
            conn.execute("SELECT keelgate_lock_run(%s, 'restock')", (b,))
        forged = (
            "INSERT INTO keelgate_audit VALUES (%s, 'mine', 999, 'loop.reconciled', 'alice', "
            "'2026-01-01T00:00:00Z', '{}', NULL, '', 'x', current_user, %s)"
        )
        with pytest.raises(errors.InsufficientPrivilege, match="names its writer"):
            conn.execute(forged, (a, "operator"))
        conn.execute(forged.replace("current_user, %s", "NULL, NULL"), (a,))
        writer = conn.execute(
            "SELECT writer, writer_kind FROM public.keelgate_audit WHERE tenant = %s AND seq = 999",
            (a,),
        ).fetchone()
        assert writer == (f"keelgate-{a}", "tenant")
    verified = _keelgate("audit", "restock", "-n", b, "--verify", store=shared.b)
    assert verified.returncode == 0 and "chain verified" in verified.stdout


def test_the_operators_role_reads_every_tenant_and_writes_only_what_the_operator_writes(
    shared: Shared, tmp_path: Path
) -> None:
    """The operator's role lists and reads both tenants' runs, keys and chains (it mirrors
    status; what it writes, specs, settlements and approval decisions with their events, is
    what records B's specs and finishes B's runs above); it cannot claim, complete or forget
    a key, rewrite a key's result or tenant, update or delete audit events or checkpoints, or
    write the role lookup."""
    victim = _stop_bs_runs(shared, tmp_path)
    _a_runs_its_own(shared, tmp_path)
    stores = open_stores(shared.operator)
    try:
        listed = {(r.tenant, r.run) for r in stores.checkpoints.runs()}
        assert listed == {
            (shared.ns_a, "mine"),
            (shared.ns_b, "restock"),
            (shared.ns_b, "approve-me"),
        }
        assert stores.audit.events(shared.ns_a, "mine")
        assert stores.idempotency.get(shared.ns_b, victim.unknown_key) is not None
        with pytest.raises(StoreError, match="permission denied for table keelgate_keys"):
            stores.idempotency.claim(shared.ns_b, "kg-x", run="r", action="1:0", tool="t")
    finally:
        stores.close()
    b = shared.ns_b
    with _connect(shared.operator) as conn:
        for statement in (
            f"UPDATE keelgate_keys SET result = '\"forged\"' WHERE tenant = '{b}'",
            f"UPDATE keelgate_keys SET tenant = 'elsewhere' WHERE tenant = '{b}'",
            f"DELETE FROM keelgate_keys WHERE tenant = '{b}'",
            f"UPDATE keelgate_audit SET actor = 'x' WHERE tenant = '{b}'",
            f"DELETE FROM keelgate_audit WHERE tenant = '{b}'",
            f"DELETE FROM keelgate_checkpoints WHERE tenant = '{b}'",
            f"INSERT INTO keelgate_tenants VALUES ('x', '{b}', 'tenant', 'now')",
            "DELETE FROM keelgate_tenants",
        ):
            assert _refused_or_nothing(conn, statement) == REFUSED, statement


def _role_of(url: str) -> str:
    return url.split("://", 1)[1].split(":", 1)[0]


def test_a_role_the_store_does_not_know_sees_nothing(shared: Shared, tmp_path: Path) -> None:
    """A role given every right on the tables by hand but not registered with `keelgate
    tenant add` reads no row and can write none: row-level security admits registered
    roles only."""
    _stop_bs_runs(shared, tmp_path)
    stranger = _unique("stranger")
    where = shared.at(shared.ns_b)
    with _connect(where) as conn:
        conn.execute(f"CREATE ROLE \"{stranger}\" LOGIN PASSWORD '{scram_verifier('pw-1')}'")
        database = where.rsplit("/", 1)[1]
        conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{stranger}"')
        for table in (*DATA_TABLES, "keelgate_tenants"):
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO "{stranger}"')
    host = where.rsplit("@", 1)[1]
    with _connect(f"postgresql://{stranger}:pw-1@{host}") as conn:
        assert conn.execute("SELECT count(*) FROM keelgate_keys").fetchone() == (0,)
        assert _refused_or_nothing(conn, "DELETE FROM keelgate_keys") == NOTHING
        planted = f"INSERT INTO keelgate_checkpoints VALUES ('{shared.ns_b}', 'p', 1, '{{}}')"
        assert _refused_or_nothing(conn, planted) == REFUSED


def test_every_keelgate_table_has_row_level_security_and_the_grants_of_its_kind(
    shared: Shared,
) -> None:
    """On a migrated database every Keelgate table has row-level security on, and each role
    holds exactly its kind's rights (PRIVILEGES) where its rows are: nothing on a table it was
    not given. A tenant with a database of its own has no right at all in the home database
    (but reading the routes, which row-level security shows it none of), nor may connect to
    it."""
    if shared.own_databases:
        with _connect(shared.admin) as conn:
            role = _role_of(shared.a)
            for table in PRIVILEGES["tenant"]:
                held = conn.execute(
                    "SELECT has_any_column_privilege(%s, %s, 'INSERT') "
                    "OR has_any_column_privilege(%s, %s, 'UPDATE') "
                    "OR has_table_privilege(%s, %s, 'DELETE') OR has_table_privilege(%s, %s, "
                    "'TRUNCATE') OR (has_table_privilege(%s, %s, 'SELECT') "
                    "AND %s <> 'keelgate_databases')",
                    (role, table) * 5 + (table,),
                ).fetchone()
                assert held == (False,), table
            connects = conn.execute(
                "SELECT has_database_privilege(%s, current_database(), 'CONNECT')", (role,)
            ).fetchone()
            assert connects == (False,)
    with _connect(shared.at(shared.ns_a)) as conn:
        tables = conn.execute(
            "SELECT relname, relrowsecurity FROM pg_class WHERE relname LIKE 'keelgate%%' "
            "AND relkind = 'r' ORDER BY relname"
        ).fetchall()
        assert tables and all(secured for _, secured in tables), tables
        assert {name for name, _ in tables} == set(PRIVILEGES["tenant"])
        for url, kind in ((shared.a, "tenant"), (shared.operator, "operator")):
            role = _role_of(url)
            for table, wanted in PRIVILEGES[kind].items():
                for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"):
                    # A grant on some columns counts: UPDATE (seq, state) is an UPDATE right.
                    by_column = privilege in ("SELECT", "INSERT", "UPDATE")
                    held = conn.execute(
                        "SELECT has_table_privilege(%s, %s, %s) OR "
                        "(%s AND has_any_column_privilege(%s, %s, %s))",
                        (role, table, privilege, by_column, role, table, privilege),
                    ).fetchone()
                    assert held is not None
                    assert held[0] == (privilege in wanted), (kind, table, privilege)


def test_a_step_process_of_a_tenant_dies_mid_write_and_the_run_still_orders_once(
    shared: Shared, tmp_path: Path
) -> None:
    """`keelgate step` as a real process with tenant B's URL (what B's step pods hold), the
    spec recorded by the operator's role: killed (os._exit) right after the shop took the
    order, the next step stops with the outcome unknown; the operator's role settles it; the
    next steps finish the run. One order, and the chain verifies."""
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    data = Path(__file__).parent / "data"
    from keelgate.manifest import load_agentrun

    spec = load_agentrun((data / "runner-task.yaml").read_text()).to_loop_spec()
    document = {**spec.to_json(), "tenant": shared.ns_b, "run": "restock"}
    operator = open_stores(shared.operator)
    try:
        assert operator.specs is not None
        operator.specs.record_spec(shared.ns_b, "restock", document, source="u", generation=1)
    finally:
        operator.close()

    def step(failpoints: str = "") -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KEELGATE_STORE": shared.b,
            "KG_RUNNER_LEDGER": str(ledger),
            "PYTHONPATH": str(Path(__file__).parent / "support_tools"),
            "KEELGATE_FAILPOINTS": failpoints,
        }
        argv = [sys.executable, "-m", "keelgate", "step", "-n", shared.ns_b, "--run", "restock"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    def orders() -> int:
        return sum(1 for line in ledger.read_text().splitlines() if '"place_order"' in line)

    assert step().returncode == 0  # iteration 1: the READ
    died = step("after_gateway_call@1")
    assert died.returncode == 137, died.stderr
    assert orders() == 1
    stopped = step()
    assert stopped.returncode == 3, stopped.stderr
    last = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert (last["stopReason"], last["unknownActions"][0]["action"]) == ("outcome_unknown", "2:0")
    unknown = "2:0"
    operator = open_stores(shared.operator)
    try:
        Loop(stores=operator).reconcile(shared.ns_b, "restock", unknown, executed=True, by="ann")
    finally:
        operator.close()
    for _ in range(5):
        done = step()
        assert done.returncode in (0, 3), done.stderr
        if json.loads(done.stdout.strip().splitlines()[-1])["phase"] == "Succeeded":
            break
    assert orders() == 1
    verified = _keelgate("audit", "restock", "-n", shared.ns_b, "--verify", store=shared.b)
    assert verified.returncode == 0, verified.stderr


def test_an_owner_id_another_session_holds_is_passed_over_not_waited_for(
    shared: Shared,
) -> None:
    """A session that may call the advisory-lock functions (here the administrator's, as
    another application's in the same database could) can take the lock of an owner id nobody
    has drawn yet. B's store then skips that id (it opens at once, with a later one) instead of
    hanging on it, and its keys are judged by its own id. A tenant's role cannot do this: it
    may call no advisory-lock function (tests/test_tenant_contention.py)."""
    with _connect(shared.at(shared.ns_b)) as admin:
        nxt = admin.execute(
            "SELECT last_value + CAST(is_called AS integer) FROM keelgate_owner_seq"
        ).fetchone()
        assert nxt is not None
    with _connect(shared.at(shared.ns_b)) as squatter:
        for owner in range(int(nxt[0]), int(nxt[0]) + 3):
            squatter.execute("SELECT pg_advisory_lock(CAST(%s AS bigint))", (owner,))
        store = PostgresStore(shared.b, pooled=False, connect_timeout=5)
        try:
            assert store.owner >= int(nxt[0]) + 3
            assert store.claim(shared.ns_b, "kg-1", run="r", action="1:0", tool="t") is None
            record = store.get(shared.ns_b, "kg-1")
            assert record is not None and record.state is KeyState.IN_FLIGHT
        finally:
            store.close()


def test_a_tenant_on_a_schema_older_than_its_code_is_told_to_migrate_with_the_admin_url(
    shared: Shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's role cannot migrate (it may create nothing): opening a database one
    migration behind is refused in one line saying what to do, and changes nothing; once
    the administrator's URL opened it, the tenant opens it, and the new table is granted to
    it in that same migration."""
    later = _migrations.Migration(
        _migrations.SCHEMA_VERSION + 1, "a later table", "CREATE TABLE keelgate_later (tenant TEXT)"
    )
    monkeypatch.setattr(_migrations, "MIGRATIONS", (*_migrations.MIGRATIONS, later))
    with pytest.raises(StoreError) as refused:
        open_stores(shared.a)
    message = str(refused.value)
    assert "\n" not in message and "keelgate tenant list --store ADMIN_URL" in message
    assert ADMIN_PASSWORD not in message
    with TenantStore(shared.admin) as admin:
        assert admin.migrate_tenants() == []  # what `keelgate tenant list` does first
    open_stores(shared.a).close()


def _keelgate(*args: str, store: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEELGATE_STORE": store} if store else dict(os.environ)
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _logs_in(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as error:
        assert "password authentication failed" in str(error), error
        return False
    return True


def test_tenant_add_print_makes_a_role_that_logs_in_with_its_password_only(
    admin_url: str,
) -> None:
    """`keelgate tenant add NS --print` creates the role and prints its URL (the one output
    that holds the password): that URL logs in, the same role with another password does
    not; the administrator's password never shows. Asked again with --print, it refuses in
    one line naming --rotate (the old password cannot be read back); with --rotate it sets a
    new one and the old URL stops working."""
    ns = _unique("shop")
    first = _keelgate("tenant", "add", ns, "--print", store=admin_url)
    assert first.returncode == 0, first.stderr
    url = first.stdout.strip()
    role = f"keelgate-{ns}"
    assert url.startswith(f"postgresql://{role}:") and _logs_in(url)
    assert f"role {role} created" in first.stderr and url.split("@")[0] not in first.stderr
    wrong = url.replace(url.split(":")[2].split("@")[0], "not-the-password")
    assert not _logs_in(wrong)
    again = _keelgate("tenant", "add", ns, "--print", store=admin_url)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.startswith("keelgate: error: --rotate:") and again.stderr.count("\n") == 1
    rotated = _keelgate("tenant", "add", ns, "--print", "--rotate", store=admin_url)
    assert rotated.returncode == 0, rotated.stderr
    assert _logs_in(rotated.stdout.strip()) and not _logs_in(url)
    for done in (first, again, rotated):
        assert ADMIN_PASSWORD not in done.stdout + done.stderr


def test_tenant_add_refuses_a_role_registered_to_another_tenant(admin_url: str) -> None:
    """`keelgate tenant add B --role <A's role>` would hand B a role that reads and writes every
    row of A's: refused (exit 2, nothing printed) in one line naming --role, the tenant the
    role belongs to and how to free it, even with --rotate; A's password still logs in (it was
    not changed), the role stays A's and B has none. The operator's role is refused to a
    tenant the same way."""
    ns_a, ns_b = _unique("shop-a"), _unique("shop-b")
    first = _keelgate("tenant", "add", ns_a, "--print", store=admin_url)
    assert first.returncode == 0, first.stderr
    url_a, role_a = first.stdout.strip(), f"keelgate-{ns_a}"
    operator_role = _unique("keelgate-operator")
    made = _keelgate(
        "tenant", "add", "keelgate-system", "--operator", "--role", operator_role, "--print",
        store=admin_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    for role, owner in ((role_a, f"tenant {ns_a}'s"), (operator_role, "the operator's")):
        taken = _keelgate(
            "tenant", "add", ns_b, "--role", role, "--print", "--rotate", store=admin_url
        )
        assert taken.returncode == 2 and taken.stdout == "", taken.stderr
        assert taken.stderr.startswith(f"keelgate: error: --role: role {role} is registered as ")
        assert owner in taken.stderr and "remove that first" in taken.stderr
        assert taken.stderr.count("\n") == 1
    assert _logs_in(url_a)
    with TenantStore(admin_url) as admin:
        registered = {t.role: (t.tenant, t.kind) for t in admin.tenants()}
    assert registered[role_a] == (ns_a, "tenant")
    assert registered[operator_role] == ("keelgate-system", "operator")
    assert ns_b not in {tenant for tenant, _ in registered.values()}


def test_tenant_list_shows_roles_and_tenants_left_on_a_shared_url(
    shared: Shared, tmp_path: Path
) -> None:
    """`keelgate tenant list` names each registered role with its tenant, kind and runs, and
    each tenant whose runs are in the store without a role of its own; as JSON too. It shows
    no password, and refuses a tenant's URL (which may not administer) naming --store."""
    _stop_bs_runs(shared, tmp_path)
    rig = Rig(url_opener(shared.admin), World(Journal(tmp_path / "w.jsonl", fsync=False)), ORDER)
    try:
        rig.loop.run_or_resume(_spec("legacy", "old-run"))
    finally:
        rig.die()
    listed = _keelgate("tenant", "list", "--output", "json", store=shared.admin)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout.strip().splitlines()[-1])
    rows = {(t["namespace"], t["kind"], t["runs"]) for t in document["tenants"]}
    assert rows == {
        (shared.ns_a, "tenant", 0),
        (shared.ns_b, "tenant", 2),
        ("keelgate-system", "operator", 0),
    }
    assert document["withoutRole"] == ["legacy"]
    text = _keelgate("tenant", "list", store=shared.admin)
    assert f"keelgate-{shared.ns_b}" in text.stdout and "none (shared URL)" in text.stdout
    refused = _keelgate("tenant", "list", store=shared.a)
    assert refused.returncode == 2 and refused.stderr.startswith("keelgate: error: --store:")
    for done in (listed, text, refused):
        assert ADMIN_PASSWORD not in done.stdout + done.stderr
        assert shared.a.split(":")[2].split("@")[0] not in done.stdout + done.stderr


def test_tenant_remove_takes_the_role_away_and_keeps_the_data(
    shared: Shared, tmp_path: Path
) -> None:
    """`keelgate tenant remove NS` drops the tenant's role (its URL no longer logs in, a
    session it held is ended) and says what stays: B's runs, keys, events and specs, which
    the administrator still reads. Run again, it finds nothing to remove and says so."""
    _stop_bs_runs(shared, tmp_path)
    before = _rows_of(shared, shared.ns_b)
    held = _connect(shared.b)
    try:
        removed = _keelgate(
            "tenant", "remove", shared.ns_b, "--keep-secret", "-o", "json", store=shared.admin
        )
        assert removed.returncode == 0, removed.stderr
        document = json.loads(removed.stdout.strip().splitlines()[-1])
        assert document["removed"][0]["dropped"] is True
        assert document["removed"][0]["sessionsEnded"] == 1
        assert document["kept"]["runs"] == 2 and document["kept"]["events"] > 0
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
    finally:
        held.close()
    assert not _logs_in(shared.b)
    assert _rows_of(shared, shared.ns_b) == before
    again = _keelgate("tenant", "remove", shared.ns_b, "--keep-secret", store=shared.admin)
    assert again.returncode == 0 and "no role was registered" in again.stdout
    assert "2 run(s)" in again.stdout


def test_an_operator_running_before_a_tenant_is_added_serves_it_on_its_own_database(
    admin_url: str,
) -> None:
    """The operator opens its stores before any tenant has a database of its own, and has
    just looked for a run of C's (C was then nobody's: the home database's). C is added with a
    database of its own; the operator's next write for C (the spec it records before a step
    pod) is refused by the home database (a restrictive policy keeps C's rows out of it), and
    is made in C's database instead, where C's role reads it; nothing of C's is left in the
    home database."""
    ns = _unique("shop-c")
    with TenantStore(admin_url) as admin:
        operator = admin.add("keelgate-system", kind="operator", role=_unique("kg-op")).url
    stores = open_stores(operator)
    try:
        assert stores.checkpoints.load(ns, "restock") is None  # C: the home database's
        with TenantStore(admin_url) as admin:
            c = admin.add(ns).url
        assert stores.specs is not None
        spec = _spec(ns, "restock")
        assert stores.specs.record_spec(ns, "restock", spec.to_json(), source="uid", generation=1)
    finally:
        stores.close()
    own = open_stores(c)
    try:
        assert own.specs is not None
        recorded = own.specs.recorded_spec(ns, "restock")
        assert recorded is not None and recorded.generation == 1
    finally:
        own.close()
    with _connect(admin_url) as conn:
        row = conn.execute("SELECT count(*) FROM keelgate_specs WHERE tenant = %s", (ns,))
        assert row.fetchone() == (0,)


def test_tenant_move_takes_a_tenant_of_one_database_into_its_own(
    admin_url: str, tmp_path: Path
) -> None:
    """An install from before: A and B in one database, B with a run stopped on an unknown
    outcome and one waiting for approval. `keelgate tenant move B --print` refuses (exit 2, one
    line naming the operator's role) while the operator is connected, changing nothing; once
    the operator is stopped, it moves B: B's rows, read by the administrator, are in B's own
    database exactly as they were and none is left in the shared one, which B's old URL no
    longer reads; the printed URL (with a new password) finishes B's runs, the operator's
    settling and approving on B's database, each WRITE once and the trails verifying; A, left
    in the shared database, is as it was. Moved again, nothing moves. Removing the operator's
    role then takes it out of every database, B's included, and drops it."""
    ns_a, ns_b = _unique("shop-a"), _unique("shop-b")
    operator_role = _unique("keelgate-operator")
    with TenantStore(admin_url) as admin:
        a = admin.add(ns_a, shared=True).url
        b = admin.add(ns_b, shared=True).url
        operator = admin.add("keelgate-system", kind="operator", role=operator_role).url
    shared = Shared(admin_url, a, b, operator, ns_a, ns_b, own_databases=False)
    victim = _stop_bs_runs(shared, tmp_path)
    _a_runs_its_own(shared, tmp_path)
    before_a, before_b = _rows_of(shared, ns_a), _rows_of(shared, ns_b)
    held = open_stores(operator)
    try:
        refused = _keelgate("tenant", "move", ns_b, "--print", store=admin_url)
    finally:
        held.close()
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr.count("\n") == 1 and f"of role {operator_role}" in refused.stderr
    assert "stop the operator" in refused.stderr
    assert _rows_of(shared, ns_b) == before_b
    moved = _keelgate("tenant", "move", ns_b, "--print", store=admin_url)
    assert moved.returncode == 0, moved.stderr
    assert "moved 2 run(s)" in moved.stderr and ADMIN_PASSWORD not in moved.stderr
    url = moved.stdout.strip()
    own = Shared(admin_url, a, url, operator, ns_a, ns_b, own_databases=True)
    assert url.rsplit("/", 1)[1] == own.at(ns_b).rsplit("/", 1)[1]
    assert _rows_of(own, ns_b) == before_b
    assert all(rows == [] for rows in _rows_of(shared, ns_b).values())
    assert _rows_of(shared, ns_a) == before_a
    with pytest.raises(psycopg.OperationalError):
        _connect(b).close()  # its old password is gone with the move's new one
    operator_stores = open_stores(operator)
    try:
        loop = Loop(stores=operator_stores)
        loop.reconcile(ns_b, "restock", "1:0", executed=True, by="alice")
        loop.approve(ns_b, "approve-me", "1:0", approved=True, by="bob")
    finally:
        operator_stores.close()
    asking = World(victim.world.journal, approval=frozenset({"place_order"}))
    for spec, world in ((victim.unknown, victim.world), (victim.approval, asking)):
        _run_to(url, world, spec, StopReason.GOAL_MET)
    assert dict(victim.world.effects()) == {victim.unknown_key: 1, victim.approval_key: 1}
    for run in ("restock", "approve-me"):
        verified = _keelgate("audit", run, "-n", ns_b, "--verify", store=url)
        assert verified.returncode == 0 and "chain verified" in verified.stdout
    with TenantStore(admin_url) as admin:
        again = admin.move(ns_b)
        assert again.database == own.at(ns_b).rsplit("/", 1)[1]
        (gone,) = admin.remove("keelgate-system")
    assert gone.dropped


@pytest.mark.parametrize(
    ("args", "code", "field"),
    [
        (["add", "Not_A_Namespace", "--print"], 2, "NAMESPACE"),
        (["add", "shop", "--print", "--role", "pg_evil"], 2, "--role"),
        (["add", "shop", "--print", "--role", "postgres"], 2, "--role"),
        (["add", "shop", "--print", "--host", "a b"], 2, "--host"),
        (["list", "--store", "sqlite:///x.db"], 2, "--store"),
        (["list", "--store", "postgresql://u:Pw-9q@127.0.0.1:1/db"], 5, "--store"),
    ],
    ids=["namespace", "reserved-role", "superuser-role", "host", "sqlite", "unreachable"],
)
def test_tenant_errors_are_one_line_naming_the_field(
    admin_url: str, args: list[str], code: int, field: str
) -> None:
    """Bad input exits 2 and a store that cannot be reached exits 5, each with one line that
    names the field, and no password of either URL in any output."""
    done = _keelgate("tenant", *args, store=admin_url)
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith(f"keelgate: error: {field}"), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert ADMIN_PASSWORD not in done.stderr and "Pw-9q" not in done.stderr


def test_tenant_add_sets_the_roles_limits_and_warns_of_what_it_could_not_close(
    admin_url: str, checked_server: PgServer
) -> None:
    """`keelgate tenant add NS --connection-limit N --lock-limit M` gives the role those limits
    (PostgreSQL's connection limit, and the runs its sessions may drive at once); run again
    without them, it keeps them; a limit out of range is bad input naming its flag. It warns,
    one line each, of what it could not close: here the server's other databases, open to
    PUBLIC. An administrator that is not a superuser cannot revoke the advisory-lock functions
    or the views of other sessions, and is told so; the role works all the same."""
    ns = _unique("shop")
    role = f"keelgate-{ns}"
    first = _keelgate(
        "tenant", "add", ns, "--print", "--connection-limit", "5", "--lock-limit", "7",
        store=admin_url,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "at most 5 session(s) and 7 run(s) at once" in first.stderr
    warnings = [line for line in first.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 2, warnings
    assert "database(s) postgres, template1" in warnings[0]
    # What no setting of PostgreSQL 15 bounds per role, and what closes it.
    assert "before it logs in" in warnings[1] and "authentication_timeout (1min)" in warnings[1]
    again = _keelgate("tenant", "add", ns, "--print", "--rotate", store=admin_url)
    assert again.returncode == 0, again.stderr
    with _connect(admin_url) as conn:
        limits = conn.execute(
            "SELECT r.rolconnlimit, t.lock_limit FROM pg_roles r JOIN keelgate_tenants t "
            "ON t.role = r.rolname WHERE r.rolname = %s",
            (role,),
        ).fetchone()
    assert limits == (5, 7)
    for flag in ("--connection-limit", "--lock-limit"):
        bad = _keelgate("tenant", "add", ns, "--print", flag, "0", store=admin_url)
        assert bad.returncode == 2 and bad.stderr.startswith(f"keelgate: error: {flag}")
    # An administrator that owns its database and may create roles, but is no superuser.
    keeper = _unique("kg-admin")
    database = _unique("kg_plain").replace("-", "_")
    with _connect(checked_server.url) as conn:
        conn.execute(
            f"CREATE ROLE \"{keeper}\" LOGIN CREATEROLE PASSWORD '{scram_verifier('pw-2')}'"
        )
        conn.execute(f'CREATE DATABASE {database} OWNER "{keeper}"')
    try:
        host = admin_url.rsplit("@", 1)[1].rsplit("/", 1)[0]
        keepers = f"postgresql://{keeper}:pw-2@{host}/{database}"
        # It may not create the tenant a database of its own: told so, naming the way out.
        refused = _keelgate("tenant", "add", ns, "--print", "--rotate", store=keepers)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.startswith("keelgate: error: --store: role ")
        assert "CREATEDB" in refused.stderr and "--shared-database" in refused.stderr
        plain = _keelgate(
            "tenant", "add", ns, "--print", "--rotate", "--shared-database", store=keepers
        )
        assert plain.returncode == 0, plain.stderr
        assert "keeps its rows in database" in plain.stderr
        assert "may call the advisory-lock functions (pg_advisory_lock" in plain.stderr
        assert "sees every session and lock on the server" in plain.stderr
        url = plain.stdout.strip()
        stores = open_stores(url)
        try:
            assert stores.checkpoints.runs() == []
        finally:
            stores.close()
    finally:
        checked_server.drop_database(database)
