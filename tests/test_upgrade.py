"""An operator upgrade never strands a run in flight: stores and checkpoints written by the
previous release open, migrate and run with today's code.

The fixtures in ``data/release-*/`` were written by those releases' own code (each
``make_fixture.py`` says how): a SQLite file and a PostgreSQL script holding three runs stopped
mid-way (an unknown outcome, a budget stop with its plan saved, a max_iterations stop), the
shop's journal of what really happened, and (8b37f73) one checkpoint document. 8b37f73 is the
last release before schema versions; 1e7a642 the last before row-level security (migration 3),
after which the shop's runs are finished by a database role of the shop's own; 7071ff6 the last
before migrations 4 to 6 (lock functions, bigint owner ids, audit writers), whose dead owner's
integer id must still read unknown and whose chains, which name no writer, must still verify.
Every test works on copies. Also here: numbered migrations run once, in order, atomically and
under a lock, and a store or a checkpoint newer than this code is refused in one line.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from crashkit import Journal, Rig, World, drive, url_opener
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.core.loop import Loop
from keelgate.core.model import ModelReply, ModelRequest
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.state import UPGRADES, VERSION, RunState
from keelgate.core.types import KeyState, StopReason, idempotency_key
from keelgate.errors import StoreError
from keelgate.stores import _migrations, open_stores
from keelgate.testing.store_contract import race
from support.stores import backend_params

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "release-8b37f73"
#: Each the last release before a schema change it proves: versions (8b37f73), row-level
#: security (1e7a642), scoped lock functions with bigint owner ids and audit writers (7071ff6).
RELEASES = ("release-8b37f73", "release-1e7a642", "release-7071ff6")
TENANT = "shop"
PASSWORD = "s3cret-pw"  # in the store URL the release's Postgres checkpoints carried


def _release_params(backends: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param((release, param.values[0]), id=f"{release}-{param.id}", marks=param.marks)
        for release in RELEASES
        for param in backend_params(backends)
    ]


def _load(release: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A store URL over a copy of what ``release`` left in ``backend``."""
    if backend == "sqlite":
        shutil.copyfile(DATA / release / "keelgate.db", tmp_path / "keelgate.db")
        return f"sqlite:///{tmp_path / 'keelgate.db'}"
    url = str(request.getfixturevalue("pg_url"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((DATA / release / "postgres.sql").read_text())  # type: ignore[arg-type]
    return url


@pytest.fixture(params=_release_params(("sqlite", "postgres")))
def previous(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, World]]:
    """A store URL over a copy of what a previous release left, and the shop's journal."""
    release, backend = request.param
    journal = tmp_path / "world.jsonl"
    shutil.copyfile(DATA / release / f"world-{backend}.jsonl", journal)
    url = _load(release, backend, tmp_path, request)
    yield url, World(Journal(journal, fsync=False))


class Asked:
    """A scripted model that notes every (phase, call) it is asked."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.inner = ScriptedModel(script)
        self.name = self.inner.name
        self.asked: list[tuple[str, int]] = []

    def call(self, request: ModelRequest) -> ModelReply:
        self.asked.append((request.phase, request.call))
        return self.inner.call(request)


def _spec(run: str, budget: Budget) -> LoopSpec:
    return LoopSpec(TENANT, run, "restock the shop", budget=budget)


# What each run's remaining planning calls answer now. Call 0 of "budget" would order something
# else: the saved plan must run, not a new answer.
RESUMES: dict[str, tuple[Budget, list[dict[str, Any]], dict[str, Any]]] = {
    "unknown": (
        Budget(max_iterations=5, max_verifier_rejections=None),
        [{"actions": []}, {"done": True, "answer": "ordered A1"}],
        {"sku": "A1", "qty": 20},
    ),
    "budget": (
        Budget(max_iterations=5, tokens=100_000, max_verifier_rejections=None),
        [
            {"actions": [{"tool": "place_order", "args": {"sku": "B2", "qty": 999}}]},
            {"done": True, "answer": "ordered B2"},
        ],
        {"sku": "B2", "qty": 5},
    ),
    "iterations": (
        Budget(max_iterations=3, max_verifier_rejections=None),
        [
            {"actions": []},
            {"actions": [{"tool": "place_order", "args": {"sku": "C3", "qty": 7}}]},
            {"done": True, "answer": "ordered C3"},
        ],
        {"sku": "C3", "qty": 7},
    ),
}


@pytest.mark.parametrize("run", sorted(RESUMES))
def test_a_run_stopped_by_the_previous_release_finishes_with_exactly_one_effect(
    previous: tuple[str, World], run: str
) -> None:
    """Today's code opens the previous release's store (migrating it), resumes a run that
    release stopped part-way, settles what is unknown from the shop's own record, and finishes
    it: its WRITE happened exactly once, a saved plan ran as saved without the model being asked
    again, the audit chain (old events and new) verifies, and the checkpoint is today's format
    with no store URL left in it."""
    url, world = previous
    budget, script, ordered = RESUMES[run]
    model = Asked(script)
    rig = Rig(url_opener(url), world, script, model=lambda: model)
    try:
        spec = _spec(run, budget)
        before = rig.loop.state(TENANT, run)
        assert before.stop is not None and before.plan is not None
        outcomes, settled = drive(rig, spec)
        assert outcomes[-1].stop.reason is StopReason.GOAL_MET, outcomes[-1].to_json()
        key = idempotency_key(TENANT, run, "place_order", ordered)
        assert world.happened(key) == 1
        assert all(count == 1 for count in world.effects().values())  # nothing else twice
        record = rig.stores.idempotency.get(TENANT, key)
        assert record is not None and record.state is KeyState.COMPLETED
        if run == "unknown":
            assert settled == [("1:0", True)]  # the shop had taken the order before the death
        if run == "budget":
            assert ("plan", 0) not in model.asked  # the saved plan ran; no new answer was asked
            other = idempotency_key(TENANT, run, "place_order", {"sku": "B2", "qty": 999})
            assert world.happened(other) == 0
        report = rig.loop.verify_audit(TENANT, run)
        assert report.ok, report.problems
        saved = rig.stores.checkpoints.load(TENANT, run)
        assert saved is not None
        assert saved.state["version"] == VERSION and "store" not in saved.state["spec"]
        assert PASSWORD not in json.dumps(saved.state)
    finally:
        rig.die()


@pytest.mark.postgres
@pytest.mark.parametrize("moved", [False, True], ids=["kept-in-the-shared-database", "moved"])
@pytest.mark.parametrize("release", RELEASES)
def test_after_the_upgrade_the_shop_finishes_its_runs_with_a_role_of_its_own(
    release: str, moved: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A database every tenant shared through one URL is migrated by its administrator, who
    then gives the shop its own role (``keelgate tenant add``: its runs are there, so it stays
    there; a new tenant gets a database of its own) and the operator its, and, where
    ``moved``, moves the shop into a database of its own (``keelgate tenant move``: its rows
    copied, checked and deleted from the shared one). The rows the old release wrote are the
    shop's (its role lists its three runs, and another tenant's role sees none), and the
    shop's role finishes every run, the operator's role settling the unknown outcome as it does
    from a Reconciliation, with each WRITE once and a chain that verifies (its old events,
    which name no writer, and the new ones, which do)."""
    from keelgate.stores.tenancy import TenantStore

    url = _load(release, "postgres", tmp_path, request)
    journal = tmp_path / "world.jsonl"
    shutil.copyfile(DATA / release / "world-postgres.jsonl", journal)
    world = World(Journal(journal, fsync=False))
    suffix = secrets.token_hex(3)  # roles belong to the server, shared by the session's tests
    with TenantStore(url) as admin:  # the administrator's first open migrates
        added = admin.add(TENANT, role=f"keelgate-shop-{suffix}")
        assert added.tenant.database == ""  # its runs are in the shared database: it stays
        assert any("keeps its rows in database" in way for way in added.open)
        shop = added.url
        other = admin.add("other", role=f"keelgate-other-{suffix}").url
        operator = admin.add(
            "keelgate-system", kind="operator", role=f"keelgate-operator-{suffix}"
        ).url
        if moved:
            kept = admin.kept(TENANT)
            went = admin.move(TENANT)
            assert went.database and went.kept == kept
            assert admin.kept(TENANT, database="") == type(kept)(0, 0, 0, 0)
            # Its old URL named the shared database: a new one, as `tenant move --print` makes.
            shop = admin.add(TENANT, role=f"keelgate-shop-{suffix}", rotate=True).url
            assert shop.rsplit("/", 1)[1] == went.database
    stores = open_stores(other)
    try:
        assert stores.checkpoints.runs() == [] and stores.audit.events(TENANT, "unknown") == []
    finally:
        stores.close()
    stores = open_stores(shop)
    try:
        assert [r.run for r in stores.checkpoints.runs()] == sorted(RESUMES)
    finally:
        stores.close()
    settler = open_stores(operator)
    try:
        for run, (budget, script, ordered) in sorted(RESUMES.items()):
            rig = Rig(url_opener(shop), world, script)
            try:
                outcomes, _ = drive(rig, _spec(run, budget), settler=Loop(stores=settler))
                assert outcomes[-1].stop.reason is StopReason.GOAL_MET, outcomes[-1].to_json()
                assert world.happened(idempotency_key(TENANT, run, "place_order", ordered)) == 1
                report = rig.loop.verify_audit(TENANT, run)
                assert report.ok, report.problems
                events = rig.loop.audit(TENANT, run)
                assert events[0].writer is None and events[-1].writer == _role_of(shop)
            finally:
                rig.die()
    finally:
        settler.close()
    assert all(count == 1 for count in world.effects().values())


def _role_of(url: str) -> str:
    return url.split("://", 1)[1].split(":", 1)[0]


def test_a_store_of_the_previous_release_is_migrated_to_todays_schema(
    previous: tuple[str, World], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The previous release's database gains what it lacked (recorded specs, write deadlines)
    and every schema version, and then has exactly the tables, columns, keys and indexes of a
    fresh database."""
    url, _ = previous
    stores = open_stores(url)
    try:
        assert stores.specs is not None
        assert stores.specs.record_spec(TENANT, "unknown", {"a": 1}, source="u", generation=1)
    finally:
        stores.close()
    if url.startswith("sqlite"):
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        fresh = str(server.create_database())
        request.addfinalizer(lambda: server.drop_database(fresh.rsplit("/", 1)[1]))
    open_stores(fresh).close()
    assert _schema(url) == _schema(fresh)
    assert _versions(url) == [(m.version, m.description) for m in _migrations.MIGRATIONS]


def _schema(url: str) -> dict[str, Any]:
    """Tables with their columns (name, type, not null, default), primary keys and indexes."""
    if url.startswith("sqlite"):
        with _sqlite(url) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            return {
                table: (
                    db.execute(f"PRAGMA table_info({table})").fetchall(),
                    sorted(
                        (r[1], r[2], db.execute(f"PRAGMA index_info({r[1]})").fetchall())
                        for r in db.execute(f"PRAGMA index_list({table})")
                    ),
                )
                for table in sorted(tables)
            }
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'public' "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE schemaname = 'public' ORDER BY indexname"
        ).fetchall()
        sequences = conn.execute(
            "SELECT sequence_name, data_type FROM information_schema.sequences"
        ).fetchall()
        secured = conn.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relname LIKE 'keelgate%%' AND relkind = 'r' ORDER BY relname"
        ).fetchall()
        policies = conn.execute(
            "SELECT tablename, policyname, cmd, roles, qual, with_check FROM pg_policies "
            "WHERE schemaname = 'public' ORDER BY tablename, policyname"
        ).fetchall()
    return {
        "columns": columns,
        "indexes": indexes,
        "sequences": sequences,
        "secured": secured,
        "policies": policies,
    }


def _versions(url: str) -> list[tuple[int, str]]:
    query = "SELECT version, description FROM keelgate_schema ORDER BY version"
    if url.startswith("sqlite"):
        with _sqlite(url) as db:
            return [(int(v), str(d)) for v, d in db.execute(query)]
    with psycopg.connect(url) as conn:
        return [(int(v), str(d)) for v, d in conn.execute(query)]


class _sqlite:
    """A plain connection to a SQLite store's file, closed on exit."""

    def __init__(self, url: str) -> None:
        self.db = sqlite3.connect(url.split("://", 1)[1][1:])

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.close()


# Numbered migrations


@pytest.fixture(params=backend_params(("sqlite", "postgres")))
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'keelgate.db'}"
    return str(request.getfixturevalue("pg_url"))


def _execute(url: str, statement: str) -> None:
    if url.startswith("sqlite"):
        with _sqlite(url) as db:
            db.execute(statement)
            db.commit()
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]


def _later(
    monkeypatch: pytest.MonkeyPatch, *migrations: tuple[str, str]
) -> Callable[[], list[str]]:
    """Make the code know later migrations (description, DDL), as a next release would."""
    added = tuple(
        _migrations.Migration(len(_migrations.MIGRATIONS) + i, description, ddl)
        for i, (description, ddl) in enumerate(migrations, start=1)
    )
    monkeypatch.setattr(_migrations, "MIGRATIONS", (*_migrations.MIGRATIONS, *added))
    return lambda: [m.description for m in added]


def test_pending_migrations_run_once_in_order_however_many_stores_open_at_once(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores opened at the same instant on a database one migration behind all open, and the
    migration (here one that fails if run twice) ran exactly once, recorded after the others."""
    open_stores(fresh_url).close()
    today = len(_migrations.MIGRATIONS)
    _later(monkeypatch, ("a later table", "CREATE TABLE keelgate_later (id INTEGER)"))
    opened = race([lambda: open_stores(fresh_url) for _ in range(6)])
    for stores in opened:
        stores.close()
    assert [v for v, _ in _versions(fresh_url)] == list(range(1, today + 2))
    _execute(fresh_url, "INSERT INTO keelgate_later (id) VALUES (1)")


def test_a_migration_that_fails_changes_nothing(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration is one transaction with its version row: if any statement fails, none of it
    stays, the store does not open, and the version is still the old one."""
    open_stores(fresh_url).close()
    today = len(_migrations.MIGRATIONS)
    _later(
        monkeypatch,
        ("half a change", "CREATE TABLE keelgate_half (id INTEGER); SELECT * FROM no_such_table"),
    )
    with pytest.raises(StoreError):
        open_stores(fresh_url)
    assert [v for v, _ in _versions(fresh_url)] == list(range(1, today + 1))
    with pytest.raises((sqlite3.Error, psycopg.Error)):
        _execute(fresh_url, "INSERT INTO keelgate_half (id) VALUES (1)")


def test_a_store_newer_than_this_code_is_refused_in_one_line(fresh_url: str) -> None:
    """A database a newer release migrated is not opened at all (this code cannot know what it
    must not do there): one StoreError line naming both versions, and nothing written."""
    open_stores(fresh_url).close()
    today = len(_migrations.MIGRATIONS)
    _execute(
        fresh_url,
        "INSERT INTO keelgate_schema (version, description, applied_at) "
        f"VALUES ({today + 1}, 'from the future', '2030-01-01T00:00:00Z')",
    )
    with pytest.raises(StoreError) as refused:
        open_stores(fresh_url)
    message = str(refused.value)
    assert "\n" not in message
    assert f"version {today + 1}" in message and f"({today})" in message
    assert [v for v, _ in _versions(fresh_url)] == list(range(1, today + 2))


# Checkpoint formats


def _previous_checkpoint() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURE / "checkpoint-v1.json").read_text())
    return document


def test_a_checkpoint_of_the_previous_release_is_read_through_its_upgrade_steps() -> None:
    """The previous release's checkpoint (format 1, its spec carrying the store URL) loads into
    today's format: the store URL is gone, the run is exactly where it was, and it writes back
    as today's format and reads back identical."""
    document = _previous_checkpoint()
    assert document["version"] == 1 and "store" in document["spec"]
    state = RunState.from_json(document)
    assert (state.tenant, state.run, state.seq, state.step.value) == ("shop", "unknown", 3, "act")
    assert state.stop is not None and state.stop.reason is StopReason.OUTCOME_UNKNOWN
    assert state.plan is not None and [a.key for a in state.plan.actions] == [
        u["idempotencyKey"] for u in document["unknown"]
    ]
    written = state.to_json()
    assert written["version"] == VERSION and "store" not in written["spec"]
    assert {k: v for k, v in written.items() if k not in ("version", "spec")} == {
        k: v for k, v in document.items() if k not in ("version", "spec")
    }
    assert RunState.from_json(written).to_json() == written
    assert sorted(UPGRADES) == list(range(1, VERSION))


def test_a_checkpoint_newer_than_this_code_or_without_a_version_is_refused_in_one_line() -> None:
    """A checkpoint a newer release wrote is refused, never half-read; so is one with no
    format version. One StoreError line each, naming the run."""
    document = RunState.from_json(_previous_checkpoint()).to_json()
    for version in (VERSION + 1, None, 0, "2"):
        with pytest.raises(StoreError) as refused:
            RunState.from_json({**document, "version": version})
        message = str(refused.value)
        assert "\n" not in message and "'unknown'" in message, message
        if version == VERSION + 1:
            assert f"format {VERSION + 1}" in message and f"({VERSION})" in message


# Migrations 4 to 6 on what the release before left


@pytest.mark.postgres
def test_registered_tenants_get_their_own_lock_space_and_keep_their_rights(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Release 7071ff6's database (schema 3), with a tenant and the operator registered as its
    `keelgate tenant add` left them, migrates: the tenant gets a run-lock space of its own and
    the default lock limit, both roles are granted the lock functions in the migration's
    transaction, and the tenant's role drives its run (and only its own tenant's) at once."""
    from keelgate.stores.tenancy import scram_verifier

    pg_url = _load("release-7071ff6", "postgres", tmp_path, request)
    suffix = secrets.token_hex(3)
    shop, operator = f"keelgate-shop-{suffix}", f"keelgate-operator-{suffix}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for role, tenant, kind in ((shop, TENANT, "tenant"), (operator, "system", "operator")):
            conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{scram_verifier('pw-1')}'")  # type: ignore[arg-type]
            conn.execute(
                "INSERT INTO keelgate_tenants VALUES (%s, %s, %s, '2026-11-01T00:00:00Z')",
                (role, tenant, kind),
            )
            conn.execute(f'GRANT SELECT ON keelgate_tenants TO "{role}"')  # type: ignore[arg-type]
    open_stores(pg_url).close()  # the owner's open migrates (4, 5, 6)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT role, space, lock_limit FROM keelgate_tenants ORDER BY kind DESC"
        ).fetchall()
    assert rows == [(shop, _migrations.TENANT_SPACES + 1, 64), (operator, None, 64)]
    host = pg_url.rsplit("@", 1)[1]
    stores = open_stores(f"postgresql://{shop}:pw-1@{host}")
    try:
        loop = Loop(stores=stores)
        assert loop.run_or_resume(_spec("mine", Budget(max_iterations=1))) is not None
        with pytest.raises(StoreError, match="may not drive runs of tenant other"):
            stores.idempotency.lock_run("other", "theirs")  # type: ignore[attr-defined]
    finally:
        stores.close()


@pytest.mark.postgres
def test_a_key_of_a_process_of_the_release_before_is_judged_by_its_old_lock(
    pg_url: str,
) -> None:
    """A process of the release before, still running through the upgrade, holds its integer
    owner id's lock as two int4 keys: its in-flight key reads in flight; once it lets go (it
    closes its store, or dies), unknown. New owner ids are drawn far above every old one."""
    from keelgate.stores.postgres import OWNER_BASE, OWNER_SPACE, PostgresStore

    store = PostgresStore(pg_url)
    try:
        assert store.owner >= OWNER_BASE
        with psycopg.connect(pg_url, autocommit=True) as old:
            old.execute("SELECT pg_advisory_lock(%s, 77)", (OWNER_SPACE,))
            old.execute(
                "INSERT INTO keelgate_keys (tenant, key, run, action, tool, state, owner) "
                "VALUES ('shop', 'kg-old', 'r', '1:0', 'ship', 'in_flight', 77)"
            )
            record = store.get("shop", "kg-old")
            assert record is not None and record.state is KeyState.IN_FLIGHT
            old.execute("SELECT pg_advisory_unlock_all()")  # its store closes (or it dies)
        record = store.get("shop", "kg-old")
        assert record is not None and record.state is KeyState.OUTCOME_UNKNOWN
    finally:
        store.close()
