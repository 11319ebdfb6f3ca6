"""A sharded operator's notifications (issue 50, item 2): each replica tells the events of the
shards it drives, and each shard's delivery point is kept apart, so a shard that moves between
replicas is told from where its last replica stopped. The notifier against a real CloudEvents
receiver on loopback (tests/fakes/event_receiver.py).

What a user would notice if these broke: a sharded operator that tells nothing (refused, as it
was), an approval never told because its shard moved while the sink was down, a shard's events
told again from the beginning after every move, or one shard's stuck sink holding every other
shard's delivery point back (each restart then sends them all again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from fakes.event_receiver import EventReceiver, quick
from fakes.lease_api import LeaseApi, LeaseDoor
from fakes.loopback import Answer
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.shards import hash_shard
from keelgate.kube.controller.slots import StepSlots
from keelgate.kube.notifications import Notification
from keelgate.kube.runtime.cache import Cache
from keelgate.kube.runtime.leadership import LeaseSettings
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import ConfigMapState, Lane, Notifier
from keelgate.kube.runtime.shards import Sharding
from keelgate.kube.runtime.workqueue import WorkQueue
from keelgate.manifest.notifications import NotifySettings, Sink
from keelgate.testing.apiserver import MemoryApiServer
from test_notifications_limits import stopped_run, wait_until

#: Which shard each namespace's runs are in, for these tests.
SHARD_OF = {"team-a": 0, "team-b": 1}


def shard_of(notification: Notification) -> int:
    return SHARD_OF[notification.path.split("/")[2]]


class KeptPoints:
    """Where each shard's delivery point is kept between replicas (the state ConfigMap's keys)."""

    def __init__(self) -> None:
        self.points: dict[Lane, float] = {}
        self.saves: list[Lane] = []

    def load(self, lane: Lane = None) -> float | None:
        return self.points.get(lane)

    def save(self, through: float, lane: Lane = None) -> None:
        self.points[lane] = through
        self.saves.append(lane)


def replica(receiver: EventReceiver, kept: KeptPoints, **sink: Any) -> Notifier:
    settings = NotifySettings(
        source="keelgate-system/keelgate",
        sinks=[Sink.model_validate({"name": "chat", "url": receiver.url, **sink})],
    )
    return Notifier(settings, metrics=Metrics(), state=kept, lane_of=shard_of, sleep=quick)


def test_one_shards_stuck_event_holds_back_only_that_shards_delivery_point(
    receiver: EventReceiver,
) -> None:
    """A replica drives shards 0 (team-a) and 1 (team-b). team-b's run stopped 20 s ago is
    delivered; team-a's, 30 s ago, is held by a sink trickling its answer. Kept now: shard 1's
    point has passed its event, shard 0's stays before its own, so a replica taking shard 1
    later sends nothing again, and one taking shard 0 sends team-a's event again."""
    receiver.slow_namespaces = {"team-a"}
    kept = KeptPoints()
    told = replica(receiver, kept, timeoutSeconds=30, retryForSeconds=30)
    for shard in (0, 1):
        told.begin(shard)
        told.live(shard)
    told.start()
    now = time.time()
    try:
        told.observe("AgentRun", stopped_run("team-b", "weekly", at=now - 20), False)
        receiver.wait_for(1)
        wait_until(lambda: told.through(1) > now - 20)  # it heard the sink's yes
        told.observe("AgentRun", stopped_run("team-a", "nightly", at=now - 30), False)
        wait_until(lambda: len(receiver.trickled) == 1)
        told.save_states()
        assert kept.points[1] > now - 20  # past team-b's event: it is told
        assert kept.points[0] < now - 30  # before team-a's: still being delivered
    finally:
        receiver.slow_namespaces = set()
        told.stop()


def test_a_shard_given_back_is_told_by_the_next_replica_from_where_the_last_one_stopped(
    receiver: EventReceiver,
) -> None:
    """Replica A drives shard 0 and tells team-a's first run's stop (half a minute ago); the
    sink then goes down, so the next run's stop (now) is still being tried when A gives the
    shard back: A keeps the shard's point, between the two, before it lets go. Replica B takes
    the shard and lists both runs: the first is taken as told (never sent twice), the second
    is sent again, and arrives. A's other shard, lost (cut off), is not kept by A at all, for
    whichever replica holds it now; stopping, A keeps no shard it no longer drives."""
    kept = KeptPoints()
    a = replica(receiver, kept, retryForSeconds=60)
    for shard in (0, 1):
        a.begin(shard)
        a.live(shard)
    a.start()
    now = time.time()
    first = stopped_run("team-a", "nightly", at=now - 30)
    try:
        a.observe("AgentRun", first, False)
        receiver.wait_for(1)
        wait_until(lambda: a.through(0) > now - 30)  # A heard the sink's yes
        receiver.down = Answer(status=503)
        second = stopped_run("team-a", "hourly", at=time.time())
        a.observe("AgentRun", second, False)
        a.observe("AgentRun", stopped_run("team-b", "weekly", at=time.time()), False)
        wait_until(lambda: len(receiver.received) >= 3)
        a.end(0, keep=True)
        assert now - 30 < kept.points[0] < now - 1
        a.end(1, keep=False)
        assert 1 not in kept.points and a.lanes() == []
    finally:
        a.stop()
    assert kept.saves == [0]

    receiver.down = None
    b = replica(receiver, kept)
    b.begin(0)
    for body in (first, second):  # B's listing of the shard it took
        b.observe("AgentRun", body, False)
    b.live(0)
    b.start()
    try:
        got = receiver.wait_for(2)
        assert [g.data["run"] for g in got] == ["nightly", "hourly"]  # nightly: A's, once
        time.sleep(0.3)
        assert len(receiver.accepted) == 2
        assert b.lanes() == [0]
    finally:
        b.stop()


class ConfigMapData:
    """A ConfigMap's data as the API server merges a patch into it (``ClusterApi``'s calls)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"data": dict(self.data)} if self.data else None

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.data.update(data)


def test_each_shards_point_is_its_own_key_of_the_one_state_config_map() -> None:
    """Shard 3's point is kept under ``through-03``, beside the unsharded ``through`` and other
    shards' keys, which a save leaves as they were; each is read back as kept."""
    config_map = ConfigMapData()
    state = ConfigMapState(config_map, "keelgate-system/kg-notify-state")
    state.save(1_900_000_000.25)
    state.save(1_900_000_100.5, 3)
    state.save(1_900_000_200.0, 12)
    assert sorted(config_map.data) == ["through", "through-03", "through-12"]
    assert config_map.data["through-03"] == "2030-03-17T17:48:20.500+00:00"
    assert state.load() == 1_900_000_000.25
    assert state.load(3) == 1_900_000_100.5
    assert state.load(7) is None


# Through the shard Leases: what a replica reads when it takes a shard, and keeps when it
# gives one back


@dataclass(frozen=True)
class ShardedOptions:
    """The options a sharded replica reads (``runtime.operator.OperatorOptions``)."""

    lease: LeaseSettings
    controller: ControllerSettings
    shards: int = 2
    namespaces: tuple[str, ...] = ()


class ClusterOverLeases:
    """The API server as a replica uses it: listings from an API server in memory, the shard
    Leases through the official client over a Lease API on loopback (each replica's door)."""

    def __init__(self, server: MemoryApiServer, door: LeaseDoor) -> None:
        self.server = server
        self.client = client.ApiClient(client.Configuration(host=door.url))

    def list_all(
        self, kind: str, namespace: str | None = None, *, selector: str = ""
    ) -> list[dict[str, Any]]:
        return self.server.list_all(kind, namespace, selector=selector)


def _stopped_in(server: MemoryApiServer, shard: int, prefix: str, at: float) -> dict[str, Any]:
    """A run of ``shard`` (of 2, by its name's hash) that stopped at ``at``, as the API server
    holds it."""
    name = next(
        f"{prefix}-{n}" for n in range(1000) if hash_shard("shop", f"{prefix}-{n}", 2) == shard
    )
    body = stopped_run("shop", name, at=at)
    server.create_object("AgentRun", "shop", {**body, "spec": {"goal": "g"}})
    return server.patch_status("AgentRun", "shop", name, body["status"])  # the operator's write


async def _replica(
    name: str, server: MemoryApiServer, leases: LeaseApi, kept: KeptPoints, url: str
) -> tuple[Sharding, Notifier, Cache]:
    settings = NotifySettings(
        source="keelgate-system/keelgate", sinks=[Sink.model_validate({"name": "chat", "url": url})]
    )
    notifier = Notifier(settings, metrics=Metrics(), state=kept, lane_of=run_shard, sleep=quick)
    cache = Cache(observer=notifier.observe)
    lease = LeaseSettings(
        "kg-operator", "keelgate-system", name, lease_seconds=3, renew_seconds=2, retry_seconds=1
    )
    sharding = Sharding(
        ShardedOptions(lease, ControllerSettings(max_step_pods=20)),
        cache=cache,
        api=ClusterOverLeases(server, leases.door()),
        queue=WorkQueue(),
        slots=StepSlots(cache, limit=20, clock=time.time),
        metrics=Metrics(),
        notifier=notifier,
    )
    notifier.start()
    sharding.start()
    return sharding, notifier, cache


def run_shard(notification: Notification) -> int:
    return hash_shard("shop", notification.path.split("/")[4], 2)


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def test_a_replica_takes_a_shards_point_before_listing_it_and_keeps_it_before_giving_it_back(
    receiver: EventReceiver,
) -> None:
    """Two shards; a replica kept shard 0's point 10 s ago (a run stopped before it was told
    then) and none of shard 1 (notifications first turned on). Replica A starts alone and takes
    both: of what it lists it tells shard 0's run that stopped after the point, and nothing
    else. The sink goes down and a run of each shard stops. Replica B joins: A gives one shard
    back, keeping that shard's point (before its run still being tried) before its Lease goes;
    B takes the shard, reads that point before listing it, and tells that run again. Once the
    sink is back, every stop is told, and none that was told before the move again."""
    leases, server, kept = LeaseApi(), MemoryApiServer(), KeptPoints()
    now = time.time()
    told_before = _stopped_in(server, 0, "told", now - 30)
    after_point = _stopped_in(server, 0, "fresh", now - 2)
    first_start = _stopped_in(server, 1, "past", now - 30)
    kept.points[0] = now - 10

    async def scenario() -> tuple[int, list[str]]:
        a, a_notifier, a_cache = await _replica("a/1", server, leases, kept, receiver.url)
        b: Sharding | None = None
        try:
            await _until(lambda: a.replica.driving() == [0, 1], 15, "A drives both shards")
            await asyncio.to_thread(receiver.wait_for, 1)
            receiver.down = Answer(status=503)
            stopped_at = time.time()
            stops = [_stopped_in(server, s, "later", stopped_at) for s in (0, 1)]
            for body in stops:
                a_cache.admit("AgentRun", body)  # the watch's events
            await _until(lambda: len(receiver.received) >= 3, 10, "the stops tried")
            b, b_notifier, _ = await _replica("b/1", server, leases, kept, receiver.url)
            await _until(
                lambda: len(a.replica.driving()) == 1 and len(b.replica.driving()) == 1,
                30,
                "one shard each",
            )
            (moved,) = b.replica.driving()
            assert kept.saves == [moved]  # kept by A before it let the Lease go
            assert kept.points[moved] < int(stopped_at)  # its stop: still to be told
            receiver.down = None
            await asyncio.to_thread(receiver.wait_for, 3)
            await asyncio.sleep(0.5)
            a_notifier.stop()
            b_notifier.stop()
            return moved, [g.data["run"] for g in receiver.accepted]
        finally:
            for sharding in (a, b):
                if sharding is not None:
                    await sharding.cancel()
                    await asyncio.to_thread(sharding.leases.stop)

    try:
        moved, runs = asyncio.run(scenario())
    finally:
        leases.close()
    name = lambda body: body["metadata"]["name"]  # noqa: E731
    assert runs.count(name(after_point)) == 1
    assert name(told_before) not in runs and name(first_start) not in runs
    later = [r for r in runs if r.startswith("later-")]
    assert len(set(later)) == 2, runs  # both stops told, the moved shard's by B if not by A
    assert moved in (0, 1)
