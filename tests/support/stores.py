"""Store factories over every backend, so a test can be made to hold for all of them.

A ``StoreFactory`` opens a NEW set of stores over the same underlying data on each call, as a
restarted process would (memory: the same ``MemoryBackend``; SQLite: the same file; Postgres: the
same database), and closes every set it opened at teardown. ``url`` is the store URL a subprocess
can open (None for memory, which no other process can see).

In a test module::

    from support.stores import store_fixture
    durable_factory = store_fixture("sqlite", "postgres")   # a fixture named durable_factory

The conftest offers ``store_factory`` (every CheckpointStore backend) and ``key_store_factory``
(every backend with its own idempotency store and audit log). Postgres parameters are marked
``postgres`` and get a fresh database each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keelgate.core.protocols import Capabilities, Stores
from keelgate.stores import open_stores
from keelgate.stores.memory import MemoryBackend, MemoryStore

CHECKPOINT_BACKENDS = ("memory", "sqlite", "postgres", "langgraph")
KEYED_BACKENDS = ("memory", "sqlite", "postgres")
# PostgreSQL as a step pod opens it (``open_stores(url, pooled=False)``): one server session.
ONE_SESSION = "postgres-one-session"
# PostgreSQL as the operator and an administrator open it: a home database whose tenants
# ROUTED_TENANTS (those the contract's checks use most) have databases of their own
# (``keelgate tenant add``), each served there, every other tenant in the home database.
TENANT_DATABASES = "postgres-tenant-databases"
ROUTED_TENANTS = ("acme", "beta")


class StoreFactory:
    """Opens new Stores over one backend's data on each call; ``close_all`` closes them."""

    def __init__(self, backend: str, opener: Callable[[], Stores], url: str | None) -> None:
        self.backend = backend
        self.url = url
        self._opener = opener
        self._opened: list[Stores] = []

    def __call__(self) -> Stores:
        stores = self._opener()
        self._opened.append(stores)
        return stores

    def close_all(self) -> None:
        while self._opened:
            self._opened.pop().close()


def make_factory(backend: str, directory: Path, pg_url: Callable[[], str]) -> StoreFactory:
    """A factory for ``backend`` keeping its files in ``directory``; ``pg_url`` gives a database.

    ``langgraph-memory`` is a LangGraph store over an in-memory saver (any saver works), with
    in-memory companions for keys and audit.
    """
    if backend == "memory":
        data = MemoryBackend()

        def memory() -> Stores:
            store = MemoryStore(data)
            return Stores.of(store)

        return StoreFactory(backend, memory, None)
    if backend == "langgraph-memory":
        from langgraph.checkpoint.memory import InMemorySaver

        from keelgate.stores.langgraph import LangGraphCheckpointStore

        saver = InMemorySaver()
        keys = MemoryBackend()

        def langgraph_memory() -> Stores:
            companion = MemoryStore(keys)
            together = Capabilities(claim_with_event=True)  # as open_stores declares it
            return Stores(LangGraphCheckpointStore(saver), companion, companion, None, together)

        return StoreFactory(backend, langgraph_memory, None)
    if backend == ONE_SESSION:  # as a step pod opens it: no pool
        one = pg_url()
        return StoreFactory(backend, lambda: open_stores(one, pooled=False), one)
    if backend == TENANT_DATABASES:
        from keelgate.stores.tenancy import TenantStore

        home = pg_url()
        with TenantStore(home) as admin:
            for tenant in ROUTED_TENANTS:
                admin.add(tenant)
        return StoreFactory(backend, lambda: open_stores(home), home)
    if backend == "sqlite":
        url = f"sqlite:///{directory / 'keelgate.db'}"
    elif backend == "langgraph":
        url = f"langgraph+sqlite:///{directory / 'keelgate.db'}"
    elif backend == "postgres":
        url = pg_url()
    else:
        raise ValueError(f"unknown store backend {backend!r}")
    return StoreFactory(backend, lambda: open_stores(url), url)


def backend_params(names: tuple[str, ...]) -> list[Any]:
    """pytest params for backends, Postgres ones marked ``postgres``."""
    return [
        pytest.param(
            name, id=name, marks=[pytest.mark.postgres] if name.startswith("postgres") else []
        )
        for name in names
    ]


def store_fixture(*names: str) -> Any:
    """A fixture parametrized over ``names`` yielding a StoreFactory per test."""

    @pytest.fixture(params=backend_params(names))
    def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
        backend: str = request.param
        made = make_factory(backend, tmp_path, lambda: str(request.getfixturevalue("pg_url")))
        try:
            yield made
        finally:
            made.close_all()

    return factory
