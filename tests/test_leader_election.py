"""Leader election between two replicas, over a Lease API on loopback (tests/fakes/lease_api.py).

What a user would notice if this broke: two operator replicas both driving runs (the step-pod
cap doubled, every Event twice), because the leader went on leading after it could no longer
renew its Lease while the standby, seeing the Lease run out, took over. Each replica runs the
real election (``keelgate.kube.runtime.leadership`` over the official client's Lease lock) and
reaches the Leases through a door of its own, so the leader alone can be cut off: its renewals
refused by the API server, its connections dropped, or its requests never answered. Timings
are short (a 6 s lease, renewed within 3 s, tried every second) and keep client-go's order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from fakes.lease_api import LeaseApi, LeaseDoor
from keelgate.kube.runtime.leadership import Leadership, LeaseSettings

NAME, NAMESPACE = "kg-operator", "keelgate-system"


@pytest.fixture
def api() -> Iterator[LeaseApi]:
    leases = LeaseApi()
    yield leases
    leases.close()


class Replica:
    """One operator replica's part in the election, and when it was told it lost."""

    def __init__(self, door: LeaseDoor, identity: str) -> None:
        self.identity = identity
        self.lost_at: float | None = None
        settings = LeaseSettings(
            NAME, NAMESPACE, identity, lease_seconds=6, renew_seconds=3, retry_seconds=1
        )
        api_client = client.ApiClient(client.Configuration(host=door.url))
        self.leadership = Leadership(settings, api_client=api_client, lost=self._lost)
        self._acquiring: threading.Thread | None = None

    def _lost(self) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()

    def stand(self) -> None:
        """Join the election (in the background, as the operator's event loop would wait)."""

        def acquire() -> None:
            asyncio.run(self.leadership.acquire())

        self._acquiring = threading.Thread(target=acquire, daemon=True)
        self._acquiring.start()

    def wait_leading(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while not self.leadership.leading:
            assert time.monotonic() < end, f"{self.identity} never led"
            time.sleep(0.02)


class Watcher:
    """Looks at both replicas every 10 ms: when each led, and whether both ever did at once."""

    def __init__(self, a: Replica, b: Replica) -> None:
        self.a, self.b = a, b
        self.both_at_once = False
        self.b_led_at: float | None = None
        self.a_stopped_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            a, b = self.a.leadership.leading, self.b.leadership.leading
            now = time.monotonic()
            if a and b:
                self.both_at_once = True
            if b and self.b_led_at is None:
                self.b_led_at = now
            if not a and self.a_stopped_at is None:
                self.a_stopped_at = now
            time.sleep(0.01)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


@pytest.mark.parametrize("trouble", ["refuse", "drop", "hang"])
def test_a_leader_that_cannot_renew_its_lease_stops_leading_before_the_standby_takes_over(
    api: LeaseApi, trouble: str
) -> None:
    """A leads and renews; B stands by. Then A's renewals fail: the API server answers 500
    (refuse), closes the connection without an answer (drop), or never answers (hang). A is
    told it lost the lease within its renew deadline and stops leading; only after that does
    B take the Lease over, and no renewal of A's lands after B's: never two leaders."""
    door_a, door_b = api.door(), api.door()
    a, b = Replica(door_a, "replica-a"), Replica(door_b, "replica-b")
    a.stand()
    a.wait_leading(timeout=10)
    b.stand()
    try:
        time.sleep(2.5)  # A renews twice or so; B sees it held
        lease = api.get(NAMESPACE, NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
        assert not b.leadership.leading and a.lost_at is None
        with Watcher(a, b) as watcher:
            door_a.trouble = trouble
            cut = time.monotonic()
            b.wait_leading(timeout=20)
            time.sleep(0.1)
        assert a.lost_at is not None, "A was never told it lost the lease"
        assert not a.leadership.leading
        assert not watcher.both_at_once
        assert watcher.a_stopped_at is not None and watcher.b_led_at is not None
        assert watcher.a_stopped_at < watcher.b_led_at
        # Within the renew deadline (3 s) of its last renewal, which was at most a retry
        # period (1 s) before the cut, and before the lease (6 s) could have run out.
        assert a.lost_at - cut < 4.0, a.lost_at - cut
        holders = [holder for holder, _ in api.writes]
        first_b = holders.index("replica-b")
        assert set(holders[first_b:]) == {"replica-b"}
        lease = api.get(NAMESPACE, NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
    finally:
        door_a.mend()  # so that a replica still leading (a failure above) can let go at once
        for replica in (a, b):
            replica.leadership.release()


def test_a_standby_leads_within_a_retry_when_the_leader_gives_the_lease_up(
    api: LeaseApi,
) -> None:
    """A clean stop (a rollout) gives the lease up: the standby leads at its next try instead
    of waiting a whole lease, and the replica that let go is not told it lost anything."""
    a, b = Replica(api.door(), "replica-a"), Replica(api.door(), "replica-b")
    a.stand()
    a.wait_leading(timeout=10)
    b.stand()
    try:
        time.sleep(1.5)
        assert not b.leadership.leading
        released = time.monotonic()
        a.leadership.release()
        b.wait_leading(timeout=10)
        assert time.monotonic() - released < 2.5  # a retry period (1 s), not a lease (6 s)
        assert a.lost_at is None and not a.leadership.leading
    finally:
        b.leadership.release()
