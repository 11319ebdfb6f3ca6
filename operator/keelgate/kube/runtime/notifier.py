"""The operator's notifications, each told once to every sink that wants it, and sent again by
the next leader when the last one could not.

Why it exists: people want to be told where they already look. The notifications are derived
from what the operator writes (``keelgate.kube.notifications``): every object the cache takes in
(a watch event, or the answer to the operator's own write) is looked at when it differs from the
one the cache held, and a notification this process has not told yet is queued for each sink
that wants its type (``keelgate.kube.runtime.sinks``: each sink's queue, thread and tries).

Restarts. How far delivery has come is kept in a ConfigMap (``state``): every notification whose
record's time is before ``through`` has been delivered or dropped. A new leader reads it before
it lists the cluster; each notification the listing holds whose time is after it is sent again,
with the same id (the receiver de-duplicates), and older ones are taken as told. So a
notification is sent at least once, unless it is dropped (a full queue, a refusal, retries
exhausted), whatever process dies when. Without a state ConfigMap, a restart takes everything it
finds as told.

Sharded (``--shards``), each shard is a lane of its own: its notifications are those of its runs,
told by the replica driving it, and how far they are delivered is kept under the shard's key
(``through-NN``, beside the unsharded ``through``). A replica reads a shard's point when it
takes the shard, before listing it, and keeps it once more when it lets the shard go, so the
next replica sends again what it had not delivered.

This module must never block a reconcile on a sink (queueing never waits for a delivery), and
never let ``through`` pass a notification that is still to be delivered (nor keep a shard's
point once it no longer drives the shard).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from keelgate.core.redaction import redacted_line
from keelgate.core.state import planned_arguments
from keelgate.kube.controller.shards import shard_label
from keelgate.kube.notifications import KINDS, SERVER_CLOCK, Notification, notifications_of
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.sinks import Arguments, SinkSender
from keelgate.kube.times import parse_time
from keelgate.manifest.notifications import NotifySettings

log = logging.getLogger("keelgate.operator")

#: How far ``through`` stays behind the operator's clock, and how much earlier than it a record
#: on the API server's clock is still sent again after a restart: records are in whole seconds,
#: and clocks further apart than this (the API server's and the operator's, or two leaders')
#: may lose a notification across a restart. At least 1 s (a record's time is truncated).
CLOCK_MARGIN = 5.0
STATE_KEY = "through"

#: A lane of notifications kept apart: a shard's number, or None (unsharded: all of them).
Lane = int | None


def state_key(lane: Lane) -> str:
    """The key a lane's delivery point is kept under: ``through``, or ``through-NN``."""
    return STATE_KEY if lane is None else f"{STATE_KEY}-{shard_label(lane)}"


class DeliveryState(Protocol):
    """Where each lane's ``through`` is kept between leaders (and replicas)."""

    def load(self, lane: Lane = None) -> float | None: ...

    def save(self, through: float, lane: Lane = None) -> None: ...


class ConfigMaps(Protocol):
    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None: ...


class ConfigMapState:
    """Each lane's ``through`` in the data of a ConfigMap (``NAMESPACE/NAME``), created when
    first saved; a save merges its one key, so replicas keeping other shards' keys never
    overwrite each other's."""

    def __init__(self, api: ConfigMaps, where: str) -> None:
        self._api = api
        self.namespace, self.name = where.split("/", 1)

    def load(self, lane: Lane = None) -> float | None:
        found = self._api.read_config_map(self.namespace, self.name)
        text = str(((found or {}).get("data") or {}).get(state_key(lane)) or "")
        moment = parse_time(text)
        return None if moment is None else moment.timestamp()

    def save(self, through: float, lane: Lane = None) -> None:
        moment = dt.datetime.fromtimestamp(through, dt.UTC)
        self._api.write_config_map(
            self.namespace, self.name, {state_key(lane): moment.isoformat(timespec="milliseconds")}
        )


class Notifier:
    """Every notification the operator's objects hold, told once by this process to every sink that
    wants it; ``through`` kept in ``state`` for the next leader. ``lane_of`` names each
    notification's lane (sharded: its run's shard); unsharded, there is one lane, None."""

    def __init__(
        self,
        settings: NotifySettings,
        *,
        metrics: Metrics,
        state: DeliveryState | None = None,
        arguments: Arguments | None = None,
        lane_of: Callable[[Notification], Lane] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.settings = settings
        self._state = state
        self._clock = clock
        self._lane_of: Callable[[Notification], Lane] = lane_of or (lambda _: None)
        self._lock = threading.Lock()
        # What this process has told (or taken as told), per object (by uid): notification ids.
        self._told: dict[str, set[str]] = {}
        # The lanes being listed: those up to each one's boundary are told already.
        self._boundary: dict[Lane, float | None] = {}
        # id -> (the notification, its lane, how many sinks are still to send it)
        self._outstanding: dict[str, tuple[Notification, Lane, int]] = {}
        self._latest: dict[Lane, float] = {}  # each lane's newest record among those seen
        self._saved: dict[Lane, float | None] = {}  # the lanes this process keeps, and their point
        self.senders = [
            SinkSender(
                sink,
                source=settings.source,
                queue_size=settings.queue_size,
                metrics=metrics,
                arguments=arguments,
                done=self._delivered,
                sleep=sleep,
            )
            for sink in settings.sinks
        ]

    # The start of a leader

    def begin(self, lane: Lane = None) -> None:
        """Before the listing (of a lane: a shard taken): read how far the last leader (or the
        shard's last replica) delivered. Notifications the listing holds up to that point are
        taken as told; later ones are sent (again). Without a kept state (none configured, none
        saved yet, or unreadable) everything listed is taken as told: a first start never floods
        its sinks with the cluster's past."""
        through: float | None = None
        if self._state is not None:
            try:
                through = self._state.load(lane)
            except Exception as error:  # told, then taken as nothing kept
                log.warning(
                    "notify: cannot read the delivery state (%s); what the listing holds is "
                    "taken as told",
                    redacted_line(error),
                )
        with self._lock:
            self._boundary[lane] = through
            self._saved[lane] = through
        if through is not None:
            log.info(
                "notify: sending again what was recorded after %s%s",
                dt.datetime.fromtimestamp(through, dt.UTC).isoformat(timespec="seconds"),
                "" if lane is None else f" in shard {shard_label(lane)}",
            )

    def live(self, lane: Lane = None) -> None:
        """The listing (of a lane) is done: from now on every new notification is sent."""
        with self._lock:
            self._boundary.pop(lane, None)

    def end(self, lane: Lane, *, keep: bool) -> None:
        """This process no longer drives ``lane`` (a shard let go): with ``keep`` (given back,
        before its Lease is), keep its point one last time; then never again (the replica that
        takes the shard keeps it from now on: a shard lost may be held by another already,
        whose point must not be moved past what it still has to deliver). What is still queued
        of it is delivered all the same (a duplicate at worst, under the same id)."""
        if keep:
            self.save_state(lane)
        with self._lock:
            self._saved.pop(lane, None)
            self._latest.pop(lane, None)
            self._boundary.pop(lane, None)

    def start(self) -> None:
        for sender in self.senders:
            sender.start()

    def stop(self) -> None:
        for sender in self.senders:
            sender.stop()
        self.save_states()

    async def keep(self, every: float) -> None:
        """Keep how far delivery has come, every ``every`` seconds while notifications flow
        (a task of the operator's event loop, cancelled when it stops)."""
        while True:
            await asyncio.sleep(every)
            await asyncio.to_thread(self.save_states)

    def save_states(self) -> None:
        """Keep the point of every lane this process keeps (each while notifications flow)."""
        for lane in self.lanes():
            self.save_state(lane)

    def lanes(self) -> list[Lane]:
        """The lanes this process keeps the delivery point of."""
        with self._lock:
            return list(self._saved)

    # Observing (any thread: the cache calls it with every body it takes in)

    def observe(self, kind: str, body: Mapping[str, Any], deleted: bool) -> None:
        """The cache took ``body`` in (or saw it deleted): queue the notifications it holds that
        this process has not told. Called with every body that changed what the cache held (an
        equal one holds no notification not told already): cheap for one that holds none."""
        if kind not in KINDS:
            return
        uid = str((body.get("metadata") or {}).get("uid", ""))
        if deleted:
            with self._lock:
                self._told.pop(uid, None)
            return
        found = notifications_of(kind, body)
        if not found:
            return
        with self._lock:
            told = self._told.setdefault(uid, set())
            fresh = [n for n in found if n.id not in told]
            if self._boundary:
                # Told before this process began (took the lane), unless recorded after the
                # kept state.
                for notification in fresh:
                    lane = self._lane_of(notification)
                    if lane not in self._boundary:
                        continue
                    boundary = self._boundary[lane]
                    if boundary is None or not _after(notification, boundary):
                        told.add(notification.id)
                        self._seen(notification, lane)
                fresh = [n for n in fresh if n.id not in told]
            sending = self._take(told, fresh)
        self._offer(sending)

    def notify(self, notification: Notification) -> None:
        """Tell a notification that no object's body holds (an approval found expired), once."""
        with self._lock:
            told = self._told.setdefault(notification.about[3], set())
            sending = self._take(told, [notification] if notification.id not in told else [])
        self._offer(sending)

    def _take(
        self, told: set[str], fresh: list[Notification]
    ) -> list[tuple[Notification, list[SinkSender]]]:
        """Mark ``fresh`` told and outstanding for the sinks that want each (under the lock,
        so that ``through`` never passes a notification about to be queued)."""
        sending = []
        for notification in fresh:
            told.add(notification.id)
            lane = self._lane_of(notification)
            self._seen(notification, lane)
            wanting = [s for s in self.senders if s.sink.wants(notification.type)]
            if wanting:
                self._outstanding[notification.id] = (notification, lane, len(wanting))
                sending.append((notification, wanting))
        return sending

    def _seen(self, notification: Notification, lane: Lane) -> None:
        """The caller holds the lock."""
        latest = self._latest.get(lane)
        if latest is None or notification.time > latest:
            self._latest[lane] = notification.time

    def _offer(self, sending: list[tuple[Notification, list[SinkSender]]]) -> None:
        for notification, wanting in sending:
            for sender in wanting:
                if not sender.offer(notification):
                    self._delivered(notification)

    def _delivered(self, notification: Notification) -> None:
        """One sink is done with ``notification`` (sent, or dropped)."""
        with self._lock:
            entry = self._outstanding.get(notification.id)
            if entry is None:
                return
            if entry[2] <= 1:
                del self._outstanding[notification.id]
            else:
                self._outstanding[notification.id] = (entry[0], entry[1], entry[2] - 1)

    # How far delivery has come

    def through(self, lane: Lane = None) -> float:
        """Every notification (of ``lane``) recorded before this moment has been delivered or
        dropped (or is not yet seen, and then recorded within CLOCK_MARGIN of it)."""
        with self._lock:
            oldest = min(
                (n.time for n, of, _ in self._outstanding.values() if of == lane), default=None
            )
        bound = self._clock() - CLOCK_MARGIN
        return bound if oldest is None else min(bound, oldest - 0.001)

    def save_state(self, lane: Lane = None) -> None:
        """Keep ``lane``'s ``through`` for the next leader while it has not yet passed the newest
        notification seen (an idle operator writes nothing: after a burst of notifications, a
        few saves, the last about CLOCK_MARGIN later). A failure is told and tried at the next
        save; a lane this process does not keep is not saved."""
        if self._state is None:
            return
        with self._lock:
            if lane not in self._saved:
                return
            latest, saved = self._latest.get(lane), self._saved[lane]
        if latest is None or (saved is not None and saved >= latest):
            return
        through = self.through(lane)
        if saved is not None and through <= saved:
            return  # held back by an undelivered notification: nothing new to keep
        try:
            self._state.save(through, lane)
        except Exception as error:
            log.warning(
                "notify: cannot keep the delivery state (%s)",
                redacted_line(error),
            )
            return
        with self._lock:
            if lane in self._saved:
                self._saved[lane] = through


def _after(notification: Notification, through: float) -> bool:
    """Whether ``notification`` may not have been delivered by a leader that kept ``through``: one
    on the API server's clock is given CLOCK_MARGIN more (the clocks may differ)."""
    margin = CLOCK_MARGIN if notification.clock == SERVER_CLOCK else 0.0
    return notification.time > through - margin


def plan_arguments(checkpoint_state: Mapping[str, Any], action: str) -> Any:
    """The recorded arguments of ``action`` in a checkpoint document (its plan), or None."""
    return planned_arguments(checkpoint_state).get(action)
