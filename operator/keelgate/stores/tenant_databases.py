"""Every tenant's stores on one PostgreSQL server, for a process that serves many tenants at once
(the operator, an administrator's command): a tenant with a database of its own is served by a
store on that database, opened when first needed and closed once idle; every other tenant by
the home database's store.

Why it exists: tenants that share one database can stop each other through what a database
shares (``LOCK TABLE`` on a table a tenant may write, an open transaction that holds off a
migration, advisory locks), and a process serving all of them through one pool lends its
sessions to whichever tenant's statement waits. With a database per tenant
(``keelgate tenant add``), whatever tenant A holds is in A's database: a statement of B's, on
B's database, never meets it, and here each tenant has its own session, so a statement of the
operator's that waits on A's locks holds A's session only, for at most its ``lock_timeout``.

What it costs: one server session per tenant database used in the last ``idle`` seconds, at
most ``most_open`` at once (beyond that the least recently used idle store is closed; only
stores in use at that moment can keep the count above it), and one connection's start (about
5 ms with SCRAM on loopback) the first time a tenant is served after its store was closed.
docs/stores.md weighs it for 1,000 tenants.

Routes: ``keelgate_databases`` in the home database says which tenants have a database of
their own. A tenant found there is served there for good (a route is never taken back); a
tenant not found is read again after ROUTE_TTL seconds, and at once when the home database
refuses a write of it (a restrictive policy refuses rows of routed tenants there, migration 7):
a tenant given its own database a moment ago is never written where nobody reads.

This module must never close a store that owns anything (a claimed key, a run lock: closing
would make them read unknown while this process still drives them), never hold its own lock
while a store opens or runs a statement, and never serve one tenant's call on another's store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from keelgate.core.audit import AuditDraft, AuditEvent
from keelgate.core.protocols import Checkpoint, Completion, Ownership, RecordedSpec, RunRef
from keelgate.core.types import KeyRecord
from keelgate.errors import StoreBusy, StoreError, StoreUnavailable
from keelgate.stores._holds import HoldsOwner, OwnerHolds
from keelgate.stores._sql import EVENT_PAGE, SQLStore
from keelgate.stores.postgres import PostgresStore

T = TypeVar("T")

#: Tenant databases with a store open at once, beyond those in use (see the module's docstring).
MOST_OPEN = 20
#: Seconds a tenant's store stays open unused.
IDLE_SECONDS = 60.0
#: Seconds a tenant read as the home database's is taken as such before it is read again.
ROUTE_TTL = 5.0


@dataclass
class _Opened:
    """One tenant database's store, and who is using it."""

    database: str
    ready: threading.Event = field(default_factory=threading.Event)
    store: PostgresStore | None = None
    users: int = 0
    last: float = 0.0
    # It claimed a key or locked a run: it is this process's owner there until it closes.
    owning: bool = False


class TenantDatabases(HoldsOwner):
    """The stores of the tenants of one home database (``home``, open), each served on its own
    database where it has one. One object serves every role (``Stores.of``), with the home
    store's promises: each call goes to one tenant's store, which keeps them all."""

    capabilities = SQLStore.capabilities

    def __init__(
        self,
        home: PostgresStore,
        *,
        most_open: int = MOST_OPEN,
        idle: float = IDLE_SECONDS,
        opener: Callable[[str], PostgresStore] | None = None,
    ) -> None:
        self.home = home
        self.most_open = most_open
        self.idle = idle
        self._opener = opener or (lambda database: home.on_database(database, pooled=False))
        self._holds = OwnerHolds()
        self._lock = threading.Lock()
        self._routes: dict[str, str] = {}
        self._home_until: dict[str, float] = {}  # tenant -> when its "home" reading expires
        self._opened: dict[str, _Opened] = {}
        self._stopped = threading.Event()
        self._reaper = threading.Thread(
            target=self._reap_while_open, name="keelgate-tenant-stores", daemon=True
        )
        self._reaper.start()

    # Routes and stores

    def _route(self, tenant: str, *, fresh: bool = False) -> str:
        """The database of ``tenant``'s own, or "" for the home database."""
        now = time.monotonic()
        with self._lock:
            routed = self._routes.get(tenant)
            if routed is not None:
                return routed
            if not fresh and self._home_until.get(tenant, 0.0) > now:
                return ""
        database = self.home.tenant_database(tenant)
        with self._lock:
            if database:
                self._routes[tenant] = database
                self._home_until.pop(tenant, None)
            else:
                self._home_until[tenant] = now + ROUTE_TTL
        return database

    def open_stores(self) -> int:
        """How many tenant databases have a store open now."""
        with self._lock:
            return sum(1 for opened in self._opened.values() if opened.store is not None)

    def _take(self, database: str) -> _Opened:
        while True:
            with self._lock:
                opened = self._opened.get(database)
                if opened is not None and opened.store is not None:
                    opened.users += 1
                    opened.last = time.monotonic()
                    return opened
                if opened is None:
                    opened = self._opened[database] = _Opened(database)
                    mine = True
                else:
                    mine = False
            if not mine:
                # Another thread opens it; a thread serving another tenant is not held up.
                opened.ready.wait()
                continue
            try:
                store = self._opener(database)
            except BaseException:
                with self._lock:
                    self._opened.pop(database, None)
                opened.ready.set()
                raise
            with self._lock:
                opened.store, opened.users, opened.last = store, 1, time.monotonic()
                surplus = self._surplus()
            opened.ready.set()
            self._close(surplus)
            return opened

    def _give_back(self, opened: _Opened) -> None:
        with self._lock:
            opened.users -= 1
            opened.last = time.monotonic()
            surplus = self._surplus()
        self._close(surplus)

    def _surplus(self) -> list[_Opened]:
        """Stores to close now, taken out of the table (the caller holds the lock): the least
        recently used idle ones beyond ``most_open``, and any idle longer than ``idle``."""
        now = time.monotonic()
        idle = sorted(
            (o for o in self._opened.values() if o.store is not None and not o.users),
            key=lambda o: o.last,
        )
        idle = [o for o in idle if not o.owning]
        over = max(0, len(self._opened) - self.most_open)
        chosen = idle[:over] + [o for o in idle[over:] if now - o.last >= self.idle]
        for opened in chosen:
            del self._opened[opened.database]
        return chosen

    @staticmethod
    def _close(stores: list[_Opened]) -> None:
        for opened in stores:
            assert opened.store is not None
            opened.store.close()

    def _reap_while_open(self) -> None:
        while not self._stopped.wait(min(self.idle / 2, 15.0)):
            with self._lock:
                surplus = self._surplus()
            self._close(surplus)

    @contextmanager
    def _serving(
        self, tenant: str, *, fresh: bool = False, owning: bool = False
    ) -> Iterator[PostgresStore]:
        database = self._route(tenant, fresh=fresh)
        if not database:
            yield self.home
            return
        opened = self._take(database)
        try:
            if owning:
                opened.owning = True
            assert opened.store is not None
            yield opened.store
        finally:
            self._give_back(opened)

    def _call(self, tenant: str, work: Callable[[PostgresStore], T], *, owning: bool = False) -> T:
        """``work`` on ``tenant``'s store. A write the home database refused because the tenant
        has a database of its own now (a route read a moment before it was given one) is made
        there instead."""
        try:
            with self._serving(tenant, owning=owning) as store:
                return work(store)
        except (StoreBusy, StoreUnavailable):
            raise
        except StoreError:
            with self._lock:
                routed = tenant in self._routes
            if routed or not self._route(tenant, fresh=True):
                raise
        with self._serving(tenant, owning=owning) as store:
            return work(store)

    # CheckpointStore, CheckpointLog, CompletingLog, RunRevisions

    def save(self, tenant: str, run: str, seq: int, state: Mapping[str, Any]) -> None:
        self._call(tenant, lambda s: s.save(tenant, run, seq, state))

    def save_with_events(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
    ) -> None:
        self._call(tenant, lambda s: s.save_with_events(tenant, run, seq, state, drafts))

    def save_completing(
        self,
        tenant: str,
        run: str,
        seq: int,
        state: Mapping[str, Any],
        drafts: Sequence[AuditDraft],
        completions: Sequence[Completion],
    ) -> tuple[str, ...]:
        return self._call(
            tenant,
            lambda s: s.save_completing(tenant, run, seq, state, drafts, completions),
        )

    def load(self, tenant: str, run: str) -> Checkpoint | None:
        return self._call(tenant, lambda s: s.load(tenant, run))

    def runs(self, tenant: str | None = None) -> list[RunRef]:
        if tenant is not None:
            return self._call(tenant, lambda s: s.runs(tenant))
        found = list(self.home.runs())
        for routed in sorted(self.home.tenant_databases()):

            def listed(store: PostgresStore, tenant: str = routed) -> list[RunRef]:
                return store.runs(tenant)

            found.extend(self._call(routed, listed))
        return sorted(found, key=lambda ref: (ref.tenant, ref.run))

    def revisions(self, runs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int]]:
        by_tenant: dict[str, list[tuple[str, str]]] = {}
        for tenant, run in runs:
            by_tenant.setdefault(str(tenant), []).append((str(tenant), str(run)))
        found: dict[tuple[str, str], tuple[int, int]] = {}
        for tenant, wanted in by_tenant.items():

            def read(
                store: PostgresStore, wanted: list[tuple[str, str]] = wanted
            ) -> dict[tuple[str, str], tuple[int, int]]:
                return store.revisions(wanted)

            found.update(self._call(tenant, read))
        return found

    # SpecStore

    def record_spec(
        self, tenant: str, run: str, spec: Mapping[str, Any], *, source: str, generation: int
    ) -> bool:
        return self._call(
            tenant,
            lambda s: s.record_spec(tenant, run, spec, source=source, generation=generation),
        )

    def recorded_spec(self, tenant: str, run: str) -> RecordedSpec | None:
        return self._call(tenant, lambda s: s.recorded_spec(tenant, run))

    # IdempotencyStore, SettlingLog, RunLock

    def claim(
        self,
        tenant: str,
        key: str,
        *,
        run: str,
        action: str,
        tool: str,
        event: AuditDraft | None = None,
        deadline_in: float | None = None,
        after: int | None = None,
    ) -> KeyRecord | None:
        return self._call(
            tenant,
            lambda s: s.claim(
                tenant,
                key,
                run=run,
                action=action,
                tool=tool,
                event=event,
                deadline_in=deadline_in,
                after=after,
            ),
            owning=True,
        )

    def complete(self, tenant: str, key: str, result: Any) -> bool:
        return self._call(tenant, lambda s: s.complete(tenant, key, result))

    def release(self, tenant: str, key: str) -> None:
        self._call(tenant, lambda s: s.release(tenant, key))

    def forget(self, tenant: str, key: str) -> bool:
        return self._call(tenant, lambda s: s.forget(tenant, key))

    def settle(
        self,
        tenant: str,
        key: str,
        *,
        executed: bool,
        by: str,
        source: str,
        event: AuditDraft | None = None,
    ) -> KeyRecord:
        return self._call(
            tenant,
            lambda s: s.settle(tenant, key, executed=executed, by=by, source=source, event=event),
        )

    def get(self, tenant: str, key: str) -> KeyRecord | None:
        return self._call(tenant, lambda s: s.get(tenant, key))

    def lock_run(self, tenant: str, run: str) -> Callable[[], None] | None:
        return self._call(tenant, lambda s: s.lock_run(tenant, run), owning=True)

    # RunOwners: each run's ownership is in its tenant's database, and the store that took a
    # run writes it under its epoch, so that store stays open (owning) while this process
    # lives: closed and opened again, it would write the run under no epoch (refused).

    def take(self, tenant: str, run: str, *, holder: str, lease: float) -> Ownership:
        return self._call(
            tenant, lambda s: s.take(tenant, run, holder=holder, lease=lease), owning=True
        )

    def renew(self, ownership: Ownership, *, lease: float) -> Ownership:
        return self._call(ownership.tenant, lambda s: s.renew(ownership, lease=lease))

    def renew_held(self, holder: str, *, lease: float) -> list[Ownership]:
        """One statement on the home database and one on each tenant database where this
        process took a run (its store is open, owning): what ``holder`` holds in all of them."""
        held = list(self.home.renew_held(holder, lease=lease))
        with self._lock:
            databases = sorted(
                o.database for o in self._opened.values() if o.owning and o.store is not None
            )
        for database in databases:
            opened = self._take(database)
            try:
                assert opened.store is not None
                held.extend(opened.store.renew_held(holder, lease=lease))
            finally:
                self._give_back(opened)
        return held

    def carry(self, tenant: str, run: str, epoch: int | None) -> None:
        self._call(tenant, lambda s: s.carry(tenant, run, epoch), owning=True)

    def let_go(self, ownership: Ownership) -> None:
        self._call(ownership.tenant, lambda s: s.let_go(ownership))

    def holder_of(self, tenant: str, run: str) -> Ownership | None:
        return self._call(tenant, lambda s: s.holder_of(tenant, run))

    # AuditLog

    def append(self, tenant: str, run: str, drafts: Sequence[AuditDraft]) -> None:
        self._call(tenant, lambda s: s.append(tenant, run, drafts))

    def events(self, tenant: str, run: str) -> list[AuditEvent]:
        return self._call(tenant, lambda s: s.events(tenant, run))

    def iter_events(
        self, tenant: str, run: str, *, after: int = 0, page: int = EVENT_PAGE
    ) -> Iterator[AuditEvent]:
        with self._serving(tenant) as store:
            yield from store.iter_events(tenant, run, after=after, page=page)

    # Closing

    def _close_now(self) -> None:
        self._stopped.set()
        with self._lock:
            opened = [o for o in self._opened.values() if o.store is not None]
            self._opened.clear()
        self._close(opened)
        self.home.close()
