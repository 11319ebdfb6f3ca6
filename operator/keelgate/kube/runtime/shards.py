"""What one replica of a sharded operator drives: the objects of the shards whose Leases it holds
(``--shards``; design: docs/operator.md, "Shards").

Why it exists: a replica must neither make pods nor write status for another replica's runs,
and must not keep them in its cache (its memory and CPU are to hold only its share). So every
watch event is looked at here first (``accepts``): an AgentRun is this replica's when its shard
is; a step pod, a Reconciliation or an Approval when its run is in this replica's cache (or it is
already: it is followed until it goes). Taking a shard (``take``) is the start barrier of one
shard: its objects are listed with the shard's label selector (and the unlabelled ones, judged
by their run) into the cache before any of its keys is reconciled, then its runs are queued.
Letting a shard go (``let_go``) closes it to the workers at once, forgets its objects (not as
deleted: nothing is told, no tombstone is left) and queues each of its runs, whose reconcile then
finds it gone and lets it go in the store, after any reconcile of it still under way; a shard
given back (not lost) is released once those are done, so that the next holder finds its runs
free in the store. The step-pod cap is shared out with the shards: a replica's cap is the cap
times its shards over the count.

It must never let a worker reconcile an object of a shard this replica does not drive (or is
still listing), never bring a forgotten object back from a listing made for a shard it gave up
meanwhile, and never decide anything about a run (the controller does).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.ports import JSON, Key
from keelgate.kube.controller.shards import Shards, run_of, shard_label
from keelgate.kube.controller.slots import StepSlots
from keelgate.kube.notifications import Notification
from keelgate.kube.runtime.cache import Cache, key_of
from keelgate.kube.runtime.leadership import LeaseSettings
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import Notifier
from keelgate.kube.runtime.shard_leases import ShardLeases
from keelgate.kube.runtime.workqueue import WorkQueue

log = logging.getLogger("keelgate.operator")

#: The kinds listed when a shard is taken, runs first (the others belong to runs).
LISTED = ("AgentRun", "Pod", "Reconciliation", "Approval")
#: The longest a shard given back waits for its runs' reconciles to let them go.
LET_GO_WITHIN = 10.0
LISTING, DRIVING = "listing", "driving"


class Listing(Protocol):
    """The listing a shard's start barrier makes (``ClusterApi.list_all``)."""

    def list_all(
        self, kind: str, namespace: str | None = None, *, selector: str = ""
    ) -> list[JSON]: ...


class ShardedReplica:
    """The shards this replica drives (``state``: listing, then driving) and their objects.

    ``add`` and ``add_low`` queue a key (ahead of, or behind, the resync's); ``busy`` says
    whether a key is queued or being reconciled; ``cap`` is told this replica's share of the
    step-pod cap whenever it changes; ``released`` is told a shard given back is let go."""

    def __init__(
        self,
        shards: Shards,
        *,
        cache: Cache,
        api: Listing,
        namespaces: tuple[str, ...],
        add: Callable[[Key], None],
        add_low: Callable[[Key], None],
        busy: Callable[[Key], bool],
        cap: Callable[[int], None],
        step_pod_cap: int,
        released: Callable[[int], None],
    ) -> None:
        self.shards = shards
        self._cache = cache
        self._api = api
        self._scopes: tuple[str | None, ...] = namespaces or (None,)
        self._add, self._add_low, self._busy = add, add_low, busy
        self._cap, self._step_pod_cap = cap, step_pod_cap
        self._released = released
        self._lock = threading.Lock()  # the state is read by worker threads
        self._state: dict[int, str] = {}
        self._generation = [0] * shards.count  # one more at each take and each let-go

    def driving(self) -> list[int]:
        with self._lock:
            return sorted(s for s, state in self._state.items() if state == DRIVING)

    def listing(self) -> list[int]:
        with self._lock:
            return sorted(s for s, state in self._state.items() if state == LISTING)

    # Which objects are this replica's

    def accepts(self, kind: str, body: Mapping[str, Any]) -> bool:
        """Whether a watch event's object is this replica's to keep (and its changes to act on)."""
        if kind == "AgentRun":
            with self._lock:
                return self.shards.of_run(body) in self._state
        meta = body.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        return self._cache.holds("AgentRun", namespace, run_of(kind, body)) or self._cache.holds(
            kind, namespace, str(meta.get("name", ""))
        )

    def drives(self, key: Key) -> bool:
        """Whether a worker may reconcile ``key`` now: its object's shard is driven here (a key
        whose object the cache does not hold is reconciled as gone: a deleted run is let go,
        and so is one this replica forgot)."""
        kind, namespace, name = key
        meta = self._cache.metadata(kind, namespace, name)
        if meta is None:
            return True
        if kind != "AgentRun":
            meta = self._cache.metadata("AgentRun", namespace, run_of(kind, {"metadata": meta}))
            if meta is None:
                return False  # not a run of this replica's: the one driving it looks at it
        shard = self.shards.of_run({"metadata": meta})
        with self._lock:
            return self._state.get(shard) == DRIVING

    def moved_out(self, kind: str, body: Mapping[str, Any]) -> None:
        """A run this replica kept now belongs to a shard it does not drive (its label was
        changed): forget it and its objects, and let it go (as for a shard let go)."""
        if kind != "AgentRun":
            return
        _, namespace, name = key_of(kind, body)
        if not self._cache.holds(kind, namespace, name):
            return
        forgotten = self._forget(lambda run: key_of("AgentRun", run)[1:] == (namespace, name))
        for key in forgotten:
            self._add(key)

    # Taking and letting go

    async def take(self, shard: int) -> None:
        """The start barrier of one shard: list its objects into the cache, then drive it (its
        runs and decisions queued behind the events). A let-go meanwhile ends it."""
        with self._lock:
            self._generation[shard] += 1
            generation = self._generation[shard]
            self._state[shard] = LISTING
        began = time.monotonic()
        for kind in LISTED:
            for selector in (self.shards.selector(shard), self.shards.unlabelled()):
                for scope in self._scopes:
                    items = await self._list(kind, scope, selector, shard, generation)
                    if items is None or not self._current(shard, generation):
                        return
                    for item in items:
                        if self._belongs(kind, item, shard):
                            self._cache.admit(kind, item)
        with self._lock:
            if self._generation[shard] != generation:
                return
            self._state[shard] = DRIVING
        self._share_cap()
        runs = self._cache.keys("AgentRun", where=lambda run: self.shards.of_run(run) == shard)
        names = {key[1:] for key in runs}
        for key in runs:
            self._add_low(key)
        for kind in ("Reconciliation", "Approval"):
            for key in self._cache.keys(kind, where=_of_runs(kind, names)):
                self._add_low(key)
        log.info(
            "shard %s: driving (%d runs listed in %.1f s)",
            shard_label(shard),
            len(runs),
            time.monotonic() - began,
        )

    def stop_driving(self, shard: int) -> None:
        """Close ``shard`` to the workers and to the watches at once (any thread): what follows
        is ``let_go``'s, on the event loop."""
        with self._lock:
            self._generation[shard] += 1
            self._state.pop(shard, None)

    async def let_go(self, shard: int, *, given_back: bool) -> None:
        """Stop driving ``shard``: forget its objects and let its runs go in the store (their
        reconciles find them gone). Given back: tell ``released`` once those reconciles are done
        (or after ``LET_GO_WITHIN``; the store fences a late one all the same)."""
        self.stop_driving(shard)
        self._share_cap()
        runs = self._forget(lambda run: self.shards.of_run(run) == shard)
        for key in runs:
            self._add(key)
        if given_back:
            end = time.monotonic() + LET_GO_WITHIN
            while any(self._busy(key) for key in runs) and time.monotonic() < end:
                await asyncio.sleep(0.05)
            self._released(shard)
        log.info(
            "shard %s: %s (%d runs let go)",
            shard_label(shard),
            "given back" if given_back else "lost",
            len(runs),
        )

    # Helpers

    def _forget(self, which: Callable[[dict[str, Any]], bool]) -> list[Key]:
        """Forget the runs ``which`` accepts and their objects; their keys."""
        runs = self._cache.forget("AgentRun", which)
        names = {key[1:] for key in runs}
        if names:
            for kind in ("Pod", "Reconciliation", "Approval"):
                self._cache.forget(kind, _of_runs(kind, names))
        return runs

    def _belongs(self, kind: str, body: Mapping[str, Any], shard: int) -> bool:
        """Whether a listed object is ``shard``'s (a run by its shard, any other by its run)."""
        if kind == "AgentRun":
            return self.shards.of_run(body) == shard
        namespace = str((body.get("metadata") or {}).get("namespace", ""))
        return self._cache.holds("AgentRun", namespace, run_of(kind, body))

    def _current(self, shard: int, generation: int) -> bool:
        with self._lock:
            return self._generation[shard] == generation

    async def _list(
        self, kind: str, scope: str | None, selector: str, shard: int, generation: int
    ) -> list[dict[str, Any]] | None:
        """One listing, tried again until it succeeds (an API server away), or None once the
        shard is let go meanwhile."""
        delay = 0.5
        while self._current(shard, generation):
            try:
                return await asyncio.to_thread(self._api.list_all, kind, scope, selector=selector)
            except Exception as failure:  # told, then tried again
                log.warning(
                    "shard %s: cannot list %s (%s: %s); trying again in %.0fs",
                    shard_label(shard),
                    kind,
                    type(failure).__name__,
                    str(failure).splitlines()[0] if str(failure) else "",
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        return None

    def _share_cap(self) -> None:
        """This replica's part of the step-pod cap: the cap times its shards over the count
        (at least one while it drives any)."""
        driving = len(self.driving())
        share = self._step_pod_cap * driving // self.shards.count
        self._cap(max(1, share) if driving else 0)


def _of_runs(kind: str, names: set[tuple[str, str]]) -> Callable[[dict[str, Any]], bool]:
    """Whether an object of ``kind`` belongs to one of the runs ``names`` (namespace, name)."""

    def belongs(body: dict[str, Any]) -> bool:
        namespace = str((body.get("metadata") or {}).get("namespace", ""))
        return (namespace, run_of(kind, body)) in names

    return belongs


class ClusterListing(Listing, Protocol):
    """The API server as a sharded replica uses it: its listings, and the official client's
    configuration (``client``) the shard Leases go through."""

    client: Any


def notification_shard(notification: Notification, count: int, cache: Cache) -> int:
    """The shard of the run a notification is about (its label as this replica holds it): the
    notifier's lane for it."""
    _, _, namespace, _, run = notification.path.split("/", 4)
    meta = cache.metadata("AgentRun", namespace, run)
    return Shards(count).of_run({"metadata": meta or {"namespace": namespace, "name": run}})


def refuse_sharding(options: Sharded) -> None:
    """Refuse, naming ``--shards``, options a sharded operator cannot run with."""
    Shards(options.shards)  # its range
    if options.lease is None:
        raise ValueError("--shards needs the Lease settings (--lease-namespace, --identity)")
    if not options.controller.holder:
        raise ValueError(
            "--shards needs run ownership (--run-lease above 0): the store is what fences "
            "a shard's runs while they move between replicas"
        )


class Sharded(Protocol):
    """The operator's options a sharded replica reads (``runtime.operator.OperatorOptions``)."""

    @property
    def shards(self) -> int: ...

    @property
    def namespaces(self) -> tuple[str, ...]: ...

    @property
    def controller(self) -> ControllerSettings: ...

    @property
    def lease(self) -> LeaseSettings | None: ...


class Sharding:
    """A sharded replica's part, wired: its shard Leases (``ShardLeases``, in their threads)
    and what it drives (``replica``), each shard taken or let go as a task on the event loop,
    and what it shows: its part of the step-pod cap (``slots``), and how many shards it drives
    (``keelgate_shards_driven``; ``keelgate_leader`` 1 while it drives any). With notifications,
    each shard's delivery point is read before the shard is listed and kept before its Lease is
    given back (``notifier``). Made and started on the operator's event loop."""

    def __init__(
        self,
        options: Sharded,
        *,
        cache: Cache,
        api: ClusterListing,
        queue: WorkQueue[Key],
        slots: StepSlots,
        metrics: Metrics,
        notifier: Notifier | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._notifier = notifier
        self._slots, self._metrics = slots, metrics
        self._tasks: set[asyncio.Task[None]] = set()
        self.replica = ShardedReplica(
            Shards(options.shards),
            cache=cache,
            api=api,
            namespaces=options.namespaces,
            add=queue.add,
            add_low=lambda key: queue.add(key, low=True),
            busy=queue.busy,
            cap=self._cap,
            step_pod_cap=options.controller.max_step_pods,
            released=self._released,
        )
        assert options.lease is not None  # refuse_sharding saw to it
        self.leases = ShardLeases(
            options.lease,
            options.shards,
            api_client=api.client,
            taken=lambda shard: self._on_loop(self._take(shard)),
            release=lambda shard: self._on_loop(self.replica.let_go(shard, given_back=True)),
            lost=self._lost,
        )
        self._cap(0)

    def start(self) -> None:
        self.leases.start()

    def alive(self) -> bool:
        return self.leases.alive()

    def readiness(self) -> str:
        """What ``/readyz`` says: the shards driven, and any being listed."""
        driving, listing = self.replica.driving(), self.replica.listing()
        words = f"shards {','.join(map(shard_label, driving)) or 'none'}"
        if listing:
            words += f", listing {','.join(map(shard_label, listing))}"
        return f"{words} (of {self.replica.shards.count})"

    async def cancel(self) -> None:
        """Stop the takes and let-gos under way (the operator stopping)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _take(self, shard: int) -> None:
        """Take ``shard``: its notifications' delivery point read before its listing (what the
        listing holds after it is sent again), and every new one sent once it is listed."""
        notifier = self._notifier
        if notifier is not None:
            await asyncio.to_thread(notifier.begin, shard)
        try:
            await self.replica.take(shard)
        finally:
            if notifier is not None:
                notifier.live(shard)

    def _released(self, shard: int) -> None:
        """A shard given back is let go: its notifications' point kept, then its Lease given
        up (the next replica reads that point when it takes the shard)."""
        notifier = self._notifier
        if notifier is None:
            self.leases.released(shard)
            return

        async def keep_then_release() -> None:
            try:
                await asyncio.to_thread(notifier.end, shard, keep=True)
            finally:
                self.leases.released(shard)

        self._task(keep_then_release())

    def _cap(self, cap: int) -> None:
        self._slots.set_limit(cap)
        self._metrics.step_pod_cap.set(cap)

    def _lost(self, shard: int) -> None:
        self.replica.stop_driving(shard)  # at once, from the Leases' thread
        if self._notifier is not None:
            # Another replica may hold it already: its point is that one's to keep.
            self._notifier.end(shard, keep=False)
        self._on_loop(self.replica.let_go(shard, given_back=False))

    def _on_loop(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a take or let-go on the event loop (from the Leases' threads)."""
        try:
            self._loop.call_soon_threadsafe(self._task, work)
        except RuntimeError:  # the loop has ended (the operator stopping): nothing to do
            work.close()

    def _task(self, work: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await work
            finally:
                driving = len(self.replica.driving())
                self._metrics.shards_driven.set(driving)
                self._metrics.leader.set(1 if driving else 0)

        task = asyncio.create_task(run(), name="keelgate-shard")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
