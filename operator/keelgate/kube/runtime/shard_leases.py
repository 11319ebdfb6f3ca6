"""Shard Leases: which of the operator's replicas drives which shards of the runs (``--shards``;
design: docs/operator.md, "Shards").

Why it exists: with the runs in shards (``kube.controller.shards``), each shard is driven by the
replica holding its coordination.k8s.io Lease (``<prefix>-shard-NN``). Each replica says it is
there with a Lease of its own (``<prefix>-member-<digest>``), counts the replicas whose member
Leases are live, takes shard Leases up to its share (``fair_share``) and gives back those over
it, so that the shards spread as replicas come and go; a shard whose holder stopped renewing is
taken by another after its lease. The election of each Lease is the official client's
(``LeaderElection.try_acquire_or_renew``, with its own judgement of a lease run out, over the
lock of ``leadership.lease_lock``); what this module adds is which Leases a replica tries, one
listing of the namespace's Leases per try (no Lease is read one at a time) and the share. It
runs in a thread of its own, as the leader's election does, and tells the operator's event
loop what it took, lost or gives back.

It must never let this replica drive a shard after it failed to renew it within the renew
deadline, or once another holder took it (``lost`` is told, from a watch of its own, whatever the
tries are doing), never give a shard's Lease up before the replica has stopped driving it
(``release`` asks, ``released`` answers), and never take more shards than its share.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from keelgate.kube.controller.shards import shard_label
from keelgate.kube.runtime.leadership import LeaseSettings, give_up, lease_api, lease_lock

log = logging.getLogger("keelgate.operator")

#: A member Lease nobody renewed for this many lease lengths (a replica gone without a clean
#: stop) is deleted by the replica that notices, so that the namespace does not fill with them.
MEMBER_GONE_AFTER = 10


def fair_share(count: int, members: Collection[str], me: str) -> int:
    """How many of ``count`` shards ``me`` holds among ``members`` (``me`` counted whether
    named or not): an equal part each, and one more for each of the first replicas in name
    order while the remainder lasts, so that the shares add up to ``count`` exactly."""
    everyone = sorted({*members, me})
    base, extra = divmod(count, len(everyone))
    return base + (1 if everyone.index(me) < extra else 0)


def shard_lease_name(prefix: str, shard: int) -> str:
    return f"{prefix}-shard-{shard_label(shard)}"


def member_lease_name(prefix: str, identity: str) -> str:
    """A replica's member Lease: a digest of its identity (a pod's name and a mark of its
    process, which need not be a valid object name)."""
    return f"{prefix}-member-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


@dataclass
class _Seen:
    """A Lease as last seen changed: its record, and when (this process's clock)."""

    record: tuple[Any, ...]
    since: float


class ShardLeases:
    """This replica's shard Leases. ``taken(shard)``: it holds the shard now (drive its runs);
    ``release(shard)``: give it back (stop driving it, then call ``released``); ``lost(shard)``:
    it was not renewed in time, or another replica holds it: stop driving it at once. All three
    are called from the Leases' threads."""

    def __init__(
        self,
        settings: LeaseSettings,
        count: int,
        *,
        api_client: Any = None,
        taken: Callable[[int], None],
        release: Callable[[int], None],
        lost: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.count = count
        self._taken, self._release, self._lost = taken, release, lost
        self._clock = clock
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._renewed: dict[int, float] = {}  # when each held shard's last renewal was sent
        self._since: dict[int, float] = {}  # when each held shard was taken
        self._over_since: float | None = None  # since when this replica holds over its share
        self._releasing: set[int] = set()
        self._released: set[int] = set()
        self._may_write: set[int] = set()  # the shard Leases this try may create or renew
        self._stopping = threading.Event()
        self._seen: dict[str, Any] = {}  # the Leases of the last listing, by name
        self._members: dict[str, _Seen] = {}
        self._api = lease_api(api_client, timeout=float(settings.retry_seconds))
        self._elections = [
            self._election(shard_lease_name(settings.name, s), s) for s in range(count)
        ]
        self._member = self._election(member_lease_name(settings.name, settings.identity), None)
        digest = hashlib.sha256(settings.identity.encode()).digest()
        self._first = int.from_bytes(digest[:4], "big") % count  # where this replica's tries begin
        self._threads: list[threading.Thread] = []

    def _election(self, name: str, shard: int | None) -> Any:
        from kubernetes.leaderelection import electionconfig, leaderelection

        config_module: Any = electionconfig  # the election's modules carry no type hints
        election_module: Any = leaderelection
        settings = self.settings
        lock = lease_lock(
            name,
            settings.namespace,
            settings.identity,
            self._api,
            lambda send: self._write(shard, send),
            seen=self._seen.get,
        )
        config = config_module.Config(
            lock,
            lease_duration=settings.lease_seconds,
            renew_deadline=settings.renew_seconds,
            retry_period=settings.retry_seconds,
            onstarted_leading=_nothing,
            onstopped_leading=_nothing,
        )
        return election_module.LeaderElection(config)

    # What the operator asks

    def start(self) -> None:
        for target, name in (
            (self._run, "keelgate-shards"),
            (self._watch, "keelgate-shards-watch"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "sharded: %d shards, taking up to this replica's share (Leases %s/%s-shard-NN, as %s)",
            self.count,
            self.settings.namespace,
            self.settings.name,
            self.settings.identity,
        )

    def alive(self) -> bool:
        return bool(self._threads) and all(thread.is_alive() for thread in self._threads)

    def held(self) -> list[int]:
        with self._lock:
            return sorted(self._held)

    def released(self, shard: int) -> None:
        """The replica no longer drives ``shard``: its Lease is given up at the next try."""
        with self._lock:
            if shard in self._releasing:
                self._released.add(shard)

    def stop(self) -> None:
        """Stop taking and renewing; give up every shard Lease held and this replica's member
        Lease, so that the others take its shards at their next try (call once the replica
        drives nothing)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=2 * self.settings.retry_seconds)
        with self._lock:
            held = sorted(self._held)
            self._held.clear()
        settings = self.settings
        for shard in held:
            give_up(
                self._api,
                shard_lease_name(settings.name, shard),
                settings.namespace,
                settings.identity,
            )
        name = member_lease_name(settings.name, settings.identity)
        give_up(self._api, name, settings.namespace, settings.identity)
        self._delete(name, None)
        if held:
            log.info("gave up the Leases of shards %s", ", ".join(map(shard_label, held)))

    # The tries (one thread)

    def _run(self) -> None:
        retry = float(self.settings.retry_seconds)
        while not self._stopping.is_set():
            began = self._clock()
            try:
                self._try()
            except Exception as failure:  # told, then tried again: the watch tells a lapse
                log.warning("shards: a try failed (%s: %s)", type(failure).__name__, failure)
            self._stopping.wait(max(0.0, retry - (self._clock() - began)))

    def _try(self) -> None:
        """One try: list the Leases, count the replicas, give back what is over this replica's
        share, renew what it keeps, and take free shards up to its share."""
        listed = self._list()
        if listed is None:
            return
        self._seen.clear()
        self._seen.update(listed)
        share = fair_share(self.count, self._live_members(), self.settings.identity)
        self._write_member()
        with self._lock:
            # Given back by the replica: held no more, and the Lease goes too (below).
            returned = sorted(self._released)
            for shard in returned:
                self._held.discard(shard)
                self._releasing.discard(shard)
                self._renewed.pop(shard, None)
            self._released.clear()
            # Those taken last go back first: a replica keeps the shards it has driven longest,
            # and one taken over from a dead replica moves on to a replica that joins.
            keeping = sorted(self._held - self._releasing, key=lambda s: (self._since[s], s))
            over = keeping[share:] if self._over_for_long(len(keeping) > share) else []
            self._releasing.update(over)
            wanted = max(0, share - len(keeping))
        for shard in returned:
            self._give_back(shard)
        for shard in over:
            log.info(
                "shard %s: over this replica's share (%d): giving it back",
                shard_label(shard),
                share,
            )
            self._release(shard)
        for step in range(self.count):
            shard = (self._first + step) % self.count
            with self._lock:
                holding = shard in self._held
                if holding or wanted > 0:
                    self._may_write.add(shard)
                else:
                    self._may_write.discard(shard)
            sent = self._clock()
            done = bool(self._elections[shard].try_acquire_or_renew())
            holder = getattr(self._elections[shard].observed_record, "holder_identity", None)
            with self._lock:
                self._may_write.discard(shard)
                if shard not in self._held:
                    if done and not holding:
                        self._held.add(shard)
                        self._renewed[shard] = self._since[shard] = sent
                        wanted -= 1
                        taken = True
                    else:
                        taken = False
                elif done:
                    self._renewed[shard] = sent
                    taken = False
                else:
                    taken = False
                    if holder not in (None, self.settings.identity):
                        self._drop(shard)  # another replica took it: lost, at once
                        continue
            if taken:
                log.info("shard %s: taken", shard_label(shard))
                self._taken(shard)

    def _over_for_long(self, over: bool) -> bool:
        """Whether this replica has held more than its share for longer than a lease and two
        tries (the caller holds the lock). A share is counted on the member Leases, and a dead
        replica's is live for a lease after its death: were shards given back at once, a
        replica started in its place would take a survivor's own shards, which would then take
        the dead one's (its runs moved twice for nothing)."""
        if not over:
            self._over_since = None
            return False
        now = self._clock()
        if self._over_since is None:
            self._over_since = now
        settings = self.settings
        return now - self._over_since > settings.lease_seconds + 2 * settings.retry_seconds

    def _give_back(self, shard: int) -> None:
        """Give the Lease of a shard the replica no longer drives up."""
        settings = self.settings
        name = shard_lease_name(settings.name, shard)
        if give_up(self._api, name, settings.namespace, settings.identity):
            log.info("shard %s: given back", shard_label(shard))

    def _drop(self, shard: int) -> None:
        """Stop holding ``shard`` (the caller holds the lock) and tell it lost."""
        self._held.discard(shard)
        self._releasing.discard(shard)
        self._released.discard(shard)
        self._renewed.pop(shard, None)
        log.error(
            "shard %s: lost (not renewed in time, or taken by another replica)", shard_label(shard)
        )
        self._lost(shard)

    def _list(self) -> dict[str, Any] | None:
        """The namespace's Leases of this operator, by name; None when they cannot be listed."""
        prefix = f"{self.settings.name}-"
        try:
            listed = self._api.list_namespaced_lease(
                self.settings.namespace, _request_timeout=float(self.settings.retry_seconds)
            )
        except Exception as failure:  # a failed try: nothing is renewed this time
            log.warning("shards: cannot list the Leases (%s)", type(failure).__name__)
            return None
        return {
            lease.metadata.name: lease
            for lease in listed.items or []
            if str(lease.metadata.name).startswith(prefix)
        }

    def _write(self, shard: int | None, send: Callable[[], Any]) -> bool:
        """A create or renewal of a Lease, if this try may write it (its member Lease always,
        until stopped); False on any failure."""
        if self._stopping.is_set():
            return False
        if shard is not None:
            with self._lock:
                if shard not in self._may_write:
                    return False
        try:
            return bool(send())
        except Exception:  # no answer: a failed try
            return False

    def _write_member(self) -> None:
        self._member.try_acquire_or_renew()

    def _live_members(self) -> set[str]:
        """The identities whose member Leases changed within their lease, as this replica has
        seen them change (as the client judges a leader's lease: on its own clock, never on
        the writer's); a member Lease long dead is deleted."""
        now = self._clock()
        prefix = f"{self.settings.name}-member-"
        live: set[str] = set()
        for name, lease in self._seen.items():
            if not name.startswith(prefix):
                continue
            spec = lease.spec
            record = (spec.holder_identity, spec.renew_time, spec.lease_duration_seconds)
            seen = self._members.get(name)
            if seen is None or seen.record != record:
                seen = self._members[name] = _Seen(record, now)
            duration = float(spec.lease_duration_seconds or self.settings.lease_seconds)
            if spec.holder_identity and now - seen.since < duration:
                live.add(str(spec.holder_identity))
            elif now - seen.since > MEMBER_GONE_AFTER * duration:
                self._delete(name, lease.metadata.resource_version)
        for name in set(self._members) - set(self._seen):
            del self._members[name]
        return live

    def _delete(self, name: str, version: str | None) -> None:
        """Delete a member Lease (only as it was seen: one renewed meanwhile stays)."""
        from kubernetes import client

        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=version) if version else None
        )
        try:
            self._api.delete_namespaced_lease(
                name,
                self.settings.namespace,
                body=options,
                _request_timeout=float(self.settings.retry_seconds),
            )
        except Exception:  # best effort: tried again at a later look
            return

    # The watch (a thread of its own)

    def _watch(self) -> None:
        """Tell ``lost`` for each held shard not renewed within the renew deadline, whatever the
        tries are doing (a request that never ends holds them)."""
        deadline = float(self.settings.renew_seconds)
        step = min(0.25, self.settings.retry_seconds / 4)
        while not self._stopping.wait(step):
            now = self._clock()
            with self._lock:
                for shard in sorted(self._held):
                    if now - self._renewed.get(shard, now) > deadline:
                        self._drop(shard)


def _nothing() -> None:
    """The election's callbacks: unused, since this module runs the tries itself."""
