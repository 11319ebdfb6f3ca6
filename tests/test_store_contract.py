"""The store contract over every backend: ``keelgate.testing.store_contract``, the suite a
third-party store runs too, and what only Keelgate's own backends can show (URLs, drivers, moving
a run between them).

Checkpoint checks run over every CheckpointStore (memory, SQLite, Postgres, LangGraph over SQLite
and over an in-memory saver); spec, idempotency, audit and declared-promise checks over every
backend with its own idempotency store and audit log (memory, SQLite, Postgres). Each "restart"
opens new store objects over the same file or database, as a new process would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from keelgate.errors import InputError, StaleCheckpoint, StoreError
from keelgate.stores import open_stores
from keelgate.testing import store_contract as contract
from keelgate.testing.store_contract import AWKWARD_STATE, canonical, checkpoints, race
from support.stores import (
    CHECKPOINT_BACKENDS,
    ONE_SESSION,
    TENANT_DATABASES,
    StoreFactory,
    make_factory,
    store_fixture,
)

checkpoint_factory = store_fixture(*CHECKPOINT_BACKENDS, "langgraph-memory")


@pytest.mark.parametrize("check", contract.checks("checkpoints"), ids=str)
def test_every_checkpoint_store_keeps_the_contract(
    checkpoint_factory: StoreFactory, check: contract.Check
) -> None:
    """Each check of the CheckpointStore protocol (see keelgate.testing.store_contract)."""
    contract.run(check, checkpoint_factory)


KEYED_CHECKS = contract.checks(
    "specs",
    "revisions",
    "keys",
    "audit",
    "run_lock",
    "checkpoint_with_events",
    "claim_with_event",
    "checkpoint_with_completion",
    "settle_with_event",
    "claim_after_checkpoint",
    "ownership",
)


@pytest.mark.parametrize("check", KEYED_CHECKS, ids=str)
def test_every_backend_keeps_the_contract(
    key_store_factory: StoreFactory, check: contract.Check
) -> None:
    """Each check of the spec, idempotency and audit protocols and of every promise a backend
    declares (see keelgate.testing.store_contract)."""
    contract.run(check, key_store_factory)


one_session_factory = store_fixture(ONE_SESSION)
tenant_databases_factory = store_fixture(TENANT_DATABASES)


@pytest.mark.parametrize("check", contract.checks(), ids=str)
def test_a_postgres_store_on_one_session_keeps_the_contract(
    one_session_factory: StoreFactory, check: contract.Check
) -> None:
    """Every check, on PostgreSQL opened as a step pod opens it: every statement on the owner
    session, no pool. Its own in-flight keys read alive, other owners' as the server says."""
    contract.run(check, one_session_factory)


@pytest.mark.parametrize("check", contract.checks(), ids=str)
def test_tenants_served_on_databases_of_their_own_keep_the_contract(
    tenant_databases_factory: StoreFactory, check: contract.Check
) -> None:
    """Every check, on PostgreSQL opened with the administrator's URL of a home database whose
    main tenants have databases of their own (``TenantDatabases``: each tenant's calls on its
    own database's store, the others' on the home one), as the operator opens it."""
    contract.run(check, tenant_databases_factory)


def test_the_contract_suite_is_whole() -> None:
    """Every check is run above, and each promise Capabilities can declare has a check."""
    from dataclasses import fields

    from keelgate.core.protocols import Capabilities

    assert {c.name for c in contract.checks()} == {
        c.name for c in (*contract.checks("checkpoints"), *KEYED_CHECKS)
    }
    assert {f.name for f in fields(Capabilities)} <= {c.needs for c in contract.checks()}


@pytest.mark.postgres
def test_a_run_moved_between_stores_is_identical(
    checkpoint_factory: StoreFactory, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A run saved in one store and carried to any other loads identically there, and the new
    store keeps guarding it (the next seq saves, the same seq is refused)."""
    source = checkpoints(checkpoint_factory)
    source.save("acme", "moving", 5, AWKWARD_STATE)
    carried = source.load("acme", "moving")
    assert carried is not None
    for backend in CHECKPOINT_BACKENDS:
        if backend == checkpoint_factory.backend:
            continue
        (tmp_path / backend).mkdir()
        target = make_factory(
            backend, tmp_path / backend, lambda: str(request.getfixturevalue("pg_url"))
        )
        try:
            dest = checkpoints(target)
            dest.save(carried.tenant, carried.run, carried.seq, carried.state)
            arrived = checkpoints(target).load("acme", "moving")
            assert arrived is not None, backend
            assert arrived.seq == 5, backend
            assert canonical(arrived.state) == canonical(AWKWARD_STATE), backend
            with pytest.raises(StaleCheckpoint):
                dest.save("acme", "moving", 5, {})
            dest.save("acme", "moving", 6, {"moved": backend})
        finally:
            target.close_all()


# Store URLs and errors


def test_store_urls_open_the_backend_they_name(tmp_path: Path) -> None:
    """Each documented URL form opens its backend; an unknown scheme is one InputError line
    naming --store."""
    from keelgate.stores.langgraph import LangGraphCheckpointStore
    from keelgate.stores.memory import MemoryStore
    from keelgate.stores.sqlite import SQLiteStore

    expected = {
        "memory://": (MemoryStore, MemoryStore),
        f"sqlite:///{tmp_path}/a.db": (SQLiteStore, SQLiteStore),
        f"langgraph+sqlite:///{tmp_path}/b.db": (LangGraphCheckpointStore, SQLiteStore),
    }
    for url, (checkpoint_type, key_type) in expected.items():
        stores = open_stores(url)
        try:
            assert isinstance(stores.checkpoints, checkpoint_type), url
            assert isinstance(stores.idempotency, key_type), url
            assert isinstance(stores.audit, key_type), url
        finally:
            stores.close()
    with pytest.raises(InputError) as bad:
        open_stores("mysql://db/x")
    assert bad.value.field == "--store"
    assert "\n" not in str(bad.value)


@pytest.mark.postgres
def test_a_postgres_url_opens_the_postgres_store(pg_url: str) -> None:
    """postgresql:// (and postgres://) URLs open one PostgresStore serving all three roles."""
    from keelgate.stores.postgres import PostgresStore

    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1)):
        stores = open_stores(url)
        try:
            assert isinstance(stores.checkpoints, PostgresStore)
            roles: list[object] = [stores.checkpoints, stores.idempotency, stores.audit]
            assert all(role is roles[0] for role in roles)
        finally:
            stores.close()


@pytest.mark.parametrize(
    ("url", "driver", "module", "extra"),
    [
        ("postgresql://db.example/keelgate", "psycopg", "keelgate.stores.postgres", "postgres"),
        ("langgraph+sqlite:///x.db", "langgraph", "keelgate.stores.langgraph", "langgraph"),
    ],
    ids=["postgres", "langgraph"],
)
def test_a_store_whose_extra_is_not_installed_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, driver: str, module: str, extra: str
) -> None:
    """Without its driver installed, a store URL is one InputError line naming --store and the
    pip extra to install, not an ImportError traceback."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in sys.modules if n == driver or n.startswith(f"{driver}.")]:
        monkeypatch.setitem(sys.modules, name, None)  # what an absent package looks like
    monkeypatch.setitem(sys.modules, driver, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(InputError) as missing:
        open_stores(url)
    assert missing.value.field == "--store"
    assert f"keelgate[{extra}]" in str(missing.value)
    assert "\n" not in str(missing.value)


def test_an_unreachable_postgres_is_one_line_without_the_password() -> None:
    """A server that cannot be reached is a StoreError of one line that names where it tried
    and never shows the password from the URL."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(StoreError) as failed:
            open_stores(f"postgresql://keel:s3cr3t-pw@127.0.0.1:{port}/keelgate")
    message = str(failed.value)
    assert "\n" not in message
    assert "s3cr3t-pw" not in message
    assert f"127.0.0.1:{port}/keelgate" in message


@pytest.mark.postgres
def test_many_processes_may_open_a_fresh_postgres_database_at_once(pg_url: str) -> None:
    """Stores opened at the same instant on an empty database all open (the schema is created
    once, safely) and each gets its own owner id."""
    from keelgate.stores.postgres import PostgresStore

    opened = race([lambda: PostgresStore(pg_url) for _ in range(6)])
    try:
        assert len({store.owner for store in opened}) == 6
        opened[0].save("acme", "r", 1, {"ok": True})
        loaded = opened[5].load("acme", "r")
        assert loaded is not None and loaded.state == {"ok": True}
    finally:
        for store in opened:
            store.close()


# What stores can do together is declared


def test_what_stores_promise_together_is_declared_by_who_opens_them(tmp_path: Path) -> None:
    """open_stores declares each backend's promises: one SQL or memory backend commits a
    checkpoint with its events, a claim with its start event and a settlement with its event,
    and claims only after the checkpoint a call was planned from; a LangGraph saver commits
    alone, so only its companion's claims and settlements carry an event. One object in every
    role promises nothing unless it is declared, and a promise the checkpoint store cannot
    keep is refused."""
    from keelgate.core.protocols import Capabilities, Stores
    from keelgate.stores.sqlite import SQLiteStore

    both = Capabilities(
        checkpoint_with_events=True,
        claim_with_event=True,
        checkpoint_with_completion=True,
        settle_with_event=True,
        claim_after_checkpoint=True,
    )
    expected = {
        "memory://": both,
        f"sqlite:///{tmp_path}/a.db": both,
        f"langgraph+sqlite:///{tmp_path}/b.db": Capabilities(
            claim_with_event=True, settle_with_event=True
        ),
    }
    for url, capabilities in expected.items():
        stores = open_stores(url)
        try:
            assert stores.capabilities == capabilities, url
            assert (stores.joint is not None) == capabilities.checkpoint_with_events, url
        finally:
            stores.close()
    store = SQLiteStore(tmp_path / "c.db")
    try:
        undeclared = Stores(store, store, store)
        assert undeclared.capabilities == Capabilities() and undeclared.joint is None
        assert Stores.of(store).capabilities == both
        langgraph = open_stores(f"langgraph+sqlite:///{tmp_path}/d.db")
        try:
            with pytest.raises(TypeError):
                Stores(langgraph.checkpoints, store, store, None, both)
            with pytest.raises(TypeError):
                Stores(
                    langgraph.checkpoints,
                    store,
                    store,
                    None,
                    Capabilities(claim_after_checkpoint=True),
                )
        finally:
            langgraph.close()
    finally:
        store.close()


def test_a_loop_over_stores_that_promise_nothing_keeps_a_whole_chain(tmp_path: Path) -> None:
    """Without declared promises the events ride in each checkpoint's outbox and are appended
    after it: the run finishes, its WRITE ran once, and its chain verifies."""
    from keelgate.adapters.models.scripted import ScriptedModel
    from keelgate.adapters.tools.python import PythonTool
    from keelgate.core.loop import Loop
    from keelgate.core.protocols import Stores
    from keelgate.core.spec import LoopSpec
    from keelgate.core.types import SideEffect, StopReason
    from keelgate.stores.sqlite import SQLiteStore

    sent: list[str | None] = []

    def place(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        sent.append(idempotency_key)
        return {"placed": True}

    store = SQLiteStore(tmp_path / "k.db")
    try:
        loop = Loop(
            stores=Stores(store, store, store),
            model=ScriptedModel(
                [{"actions": [{"tool": "place_order", "args": {"sku": "A1"}}]}, {"done": True}]
            ),
            tools=[PythonTool("place_order", place, SideEffect.WRITE)],
        )
        outcome = loop.run_or_resume(LoopSpec("shop", "plain", "order"))
        assert outcome.stop.reason is StopReason.GOAL_MET
        assert len(sent) == 1
        types = [e.type for e in loop.audit("shop", "plain")]
        assert "loop.action_started" in types and types[-1] == "loop.stopped"
        assert loop.verify_audit("shop", "plain").ok
    finally:
        store.close()
