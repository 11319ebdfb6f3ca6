"""Shards in one cluster (``--shards``): a run's shard and its label, each replica's share, and
the shard Leases between replicas (issue 50, item 2).

What a user would notice if these broke: a run driven by two replicas (or by none: its pods,
decisions or ticks in another shard than itself, so that its replica never sees them), shards
piling up on one replica while another idles, a shard held by two replicas at once when one of
them is cut off from the API server, a replica's shards waiting out a whole lease after a clean
stop, and a bad ``--shards`` value found only in a traceback. The Leases are the official
client's election over a Lease API on loopback (tests/fakes/lease_api.py), each replica through
a door of its own; the whole operator with two and three replicas on a real kube-apiserver is in
e2e/tests/test_e2e_shards.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from fakes.lease_api import LeaseApi, LeaseDoor
from keelgate.cli import main
from keelgate.core.types import PendingApproval, UnknownAction
from keelgate.kube import resources
from keelgate.kube.controller.shards import (
    MAX_SHARDS,
    Shards,
    hash_shard,
    label_run,
    labelled_shard,
)
from keelgate.kube.naming import SHARD_LABEL
from keelgate.kube.runtime.cache import Cache
from keelgate.kube.runtime.leadership import LeaseSettings
from keelgate.kube.runtime.shard_leases import ShardLeases, fair_share, shard_lease_name
from keelgate.kube.runtime.shards import ShardedReplica
from keelgate.testing.apiserver import MemoryApiServer

NAMESPACE = "keelgate-system"


def _run(
    name: str, namespace: str = "shop", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {}}
    return {"apiVersion": "keelgate.dev/v1alpha1", "kind": "AgentRun", "metadata": meta}


# A run's shard


def test_a_runs_shard_is_the_same_in_every_process_and_spreads_the_runs_evenly() -> None:
    """The shard is a hash every replica computes alike (Python's own string hash differs from
    one process to the next), and 1,600 runs fall about evenly into 16 shards."""
    names = [f"restock-{n}" for n in range(1600)]
    here = [hash_shard("shop", name, 16) for name in names[:50]]
    script = (
        "from keelgate.kube.controller.shards import hash_shard\n"
        "print([hash_shard('shop', f'restock-{n}', 16) for n in range(50)])"
    )
    there = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert there.strip() == str(here)
    counts = [0] * 16
    for name in names:
        counts[hash_shard("shop", name, 16)] += 1
    assert min(counts) > 60 and max(counts) < 140, counts


def test_a_tick_is_in_its_monitors_shard_and_a_written_label_wins_modulo_the_count() -> None:
    """A monitor's tick has its monitor's shard (the replica driving the monitor sees its
    ticks); a label already written is the shard, read modulo the count, so that a run and its
    objects stay together when the count changes; a malformed label counts as none."""
    shards = Shards(16)
    monitor = _run("watch-stock")
    tick = _run("watch-stock-29000000", labels={"keelgate.dev/monitor": "watch-stock"})
    tick["metadata"]["ownerReferences"] = [
        {"kind": "AgentRun", "name": "watch-stock", "uid": "uid-watch-stock", "controller": True}
    ]
    assert shards.of_run(tick) == shards.of_run(monitor) == hash_shard("shop", "watch-stock", 16)
    assert shards.of_run(_run("a", labels={SHARD_LABEL: "21"})) == 5
    assert Shards(32).of_run(_run("a", labels={SHARD_LABEL: "21"})) == 21
    for junk in ("5", "1x", "021", "", "٣٣"):
        assert labelled_shard(junk) is None
        assert shards.of_run(_run("a", labels={SHARD_LABEL: junk})) == hash_shard("shop", "a", 16)


def test_a_shards_selector_names_every_label_value_it_reads_as_that_shard() -> None:
    """Listing a shard taken over finds the objects labelled under another count too."""
    assert Shards(16).selector(5) == ("keelgate.dev/shard in (05,21,37,53,69,85)")
    assert Shards(100).selector(7) == "keelgate.dev/shard in (07)"
    for value in range(MAX_SHARDS):
        label = f"{value:02d}"
        assert label in Shards(12).selector(value % 12)


@pytest.mark.parametrize("count", [0, -1, 101])
def test_a_shard_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="--shards must be between 1 and 100"):
        Shards(count)


def test_everything_made_for_a_run_carries_its_shard_label() -> None:
    """Step pods, Reconciliations, Approvals and ticks carry their run's (monitor's) label, so
    that a replica taking the shard over lists them with it; an unsharded run's carry none."""
    run = _run("restock", labels={SHARD_LABEL: "07"})
    run["spec"] = {"goal": "restock"}
    unknown = UnknownAction(action="1:0", tool="place_order", idempotency_key="k1")
    pending = PendingApproval(action="1:0", tool="place_order", round=1)
    made = [
        resources.reconciliation(run, unknown),
        resources.approval(run, pending, "k1"),
        resources.tick(run, "restock-1"),
    ]
    for body in made:
        assert body["metadata"]["labels"][SHARD_LABEL] == "07", body["kind"]
    assert resources.shard_labels(_run("plain")) == {}


def test_the_controller_labels_a_run_once_and_leaves_a_valid_label_alone() -> None:
    """An unlabelled run gets its shard's label in one patch of that label alone (its spec and
    other labels untouched); a run with a valid label (even one written under another count)
    and a run gone meanwhile get no write."""
    server, cache = MemoryApiServer(), Cache()
    server.watchers.append(cache)
    shards = Shards(16)
    fresh = server.create_object("AgentRun", "shop", {**_run("fresh"), "spec": {"goal": "g"}})
    server.create_object("AgentRun", "shop", _run("kept", labels={SHARD_LABEL: "21"}))
    for name in ("fresh", "kept", "gone"):
        label_run(server, cache, shards, ("AgentRun", "shop", name))
    labelled = server.get("AgentRun", "shop", "fresh")
    assert labelled is not None
    assert labelled["metadata"]["labels"][SHARD_LABEL] == f"{hash_shard('shop', 'fresh', 16):02d}"
    assert labelled["spec"] == fresh["spec"]
    assert server.writes.count("patch AgentRun/labels fresh") == 1
    assert not [w for w in server.writes if "labels kept" in w or "labels gone" in w]
    label_run(server, cache, shards, ("AgentRun", "shop", "fresh"))  # labelled already
    assert server.writes.count("patch AgentRun/labels fresh") == 1


def test_a_replica_forgets_a_shard_it_let_go_and_a_late_answer_does_not_bring_it_back() -> None:
    """Objects forgotten as another replica's leave no tombstone and tell no deletion; an API
    answer to a write sent before (a reconcile under way) is not kept; a watch event for them
    once the shard is this replica's again is."""
    told: list[tuple[str, bool]] = []
    cache = Cache(observer=lambda kind, body, deleted: told.append((kind, deleted)))
    run = {**_run("a"), "metadata": {**_run("a")["metadata"], "resourceVersion": "5"}}
    cache.admit("AgentRun", run)
    assert cache.forget("AgentRun", lambda body: True) == [("AgentRun", "shop", "a")]
    assert told == [("AgentRun", False)]
    late = {**run, "metadata": {**run["metadata"], "resourceVersion": "6"}}
    cache.put("AgentRun", late)
    assert not cache.holds("AgentRun", "shop", "a")
    cache.admit("AgentRun", late)
    assert cache.holds("AgentRun", "shop", "a")


# What one replica drives


def _named_into(count: int, shard: int, many: int, prefix: str) -> list[str]:
    names = (f"{prefix}-{n}" for n in range(1000))
    return [n for n in names if hash_shard("shop", n, count) == shard][:many]


class Driven:
    """A replica over an API server in memory: the keys it queued, its cap, what it released."""

    def __init__(self) -> None:
        self.server, self.cache = MemoryApiServer(), Cache()
        self.queued: list[tuple[str, str, str]] = []
        self.caps: list[int] = []
        self.released: list[int] = []
        self.replica = ShardedReplica(
            Shards(4),
            cache=self.cache,
            api=self.server,
            namespaces=(),
            add=self.queued.append,
            add_low=self.queued.append,
            busy=lambda key: False,
            cap=self.caps.append,
            step_pod_cap=20,
            released=self.released.append,
        )

    def run(self, name: str, *, label: str | None = None) -> dict[str, Any]:
        labels = {} if label is None else {SHARD_LABEL: label}
        body = _run(name, labels=labels)
        return self.server.create_object("AgentRun", "shop", {**body, "spec": {"goal": "g"}})

    def pod(self, run: dict[str, Any], name: str) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {
                    "keelgate.dev/run": run["metadata"]["name"],
                    **resources.shard_labels(run),
                },
                "ownerReferences": [resources.owner_reference(run)],
            },
        }
        return self.server.create_pod("shop", body)


def test_a_shard_taken_is_listed_before_it_is_driven_and_a_shard_let_go_is_forgotten() -> None:
    """Taking shard 1 of 4 lists its runs (labelled, and unlabelled ones whose hash is 1) and
    their step pods, and no other shard's, then queues its runs and gives the replica a quarter
    of the cap; another shard's run is neither kept nor reconciled. Giving it back forgets
    them (no deletion told), queues each run to be let go in the store (its reconcile finds it
    gone), tells it released, and a late answer does not bring the run back."""
    driven = Driven()
    (mine,) = _named_into(4, 1, 1, "mine")
    (other,) = _named_into(4, 2, 1, "other")
    labelled = driven.run("labelled", label="05")  # 5 modulo 4: shard 1
    unlabelled = driven.run(mine)
    foreign = driven.run(other)
    driven.pod(labelled, "labelled-s1-a1")
    driven.pod(unlabelled, f"{mine}-s1-a1")
    driven.pod(foreign, f"{other}-s1-a1")
    replica = driven.replica
    asyncio.run(replica.take(1))
    assert replica.driving() == [1]
    assert sorted(k[2] for k in driven.cache.keys("AgentRun")) == sorted(["labelled", mine])
    assert sorted(k[2] for k in driven.cache.keys("Pod")) == sorted(
        ["labelled-s1-a1", f"{mine}-s1-a1"]
    )
    assert sorted(driven.queued) == sorted(
        [("AgentRun", "shop", "labelled"), ("AgentRun", "shop", mine)]
    )
    assert driven.caps[-1] == 5
    assert replica.drives(("AgentRun", "shop", mine))
    assert not replica.accepts("AgentRun", foreign)
    assert replica.accepts("Pod", driven.server.get("Pod", "shop", "labelled-s1-a1") or {})
    driven.queued.clear()
    asyncio.run(replica.let_go(1, given_back=True))
    assert driven.released == [1] and replica.driving() == [] and driven.caps[-1] == 0
    assert driven.cache.keys("AgentRun") == [] and driven.cache.keys("Pod") == []
    assert sorted(driven.queued) == sorted(
        [("AgentRun", "shop", "labelled"), ("AgentRun", "shop", mine)]
    )
    assert replica.drives(("AgentRun", "shop", mine))  # reconciled as gone: let go in the store
    driven.cache.put("AgentRun", unlabelled)  # the answer to a write sent before
    assert not driven.cache.holds("AgentRun", "shop", mine)


def test_a_run_relabelled_into_another_shard_is_let_go_by_the_replica_that_drove_it() -> None:
    """A person changes a run's shard label: the replica driving its old shard forgets it and
    its pods, and queues it to be let go; the replica of the new shard accepts it."""
    driven = Driven()
    run = driven.run("moving", label="01")
    driven.pod(run, "moving-s1-a1")
    asyncio.run(driven.replica.take(1))
    driven.queued.clear()
    moved = driven.server.patch_metadata(
        "AgentRun", "shop", "moving", {"labels": {SHARD_LABEL: "02"}}
    )
    assert not driven.replica.accepts("AgentRun", moved)
    driven.replica.moved_out("AgentRun", moved)
    assert not driven.cache.holds("AgentRun", "shop", "moving")
    assert not driven.cache.holds("Pod", "shop", "moving-s1-a1")
    assert driven.queued == [("AgentRun", "shop", "moving")]
    other = Driven()  # the replica driving shard 2
    asyncio.run(other.replica.take(2))
    assert other.replica.accepts("AgentRun", moved)


# Each replica's share


@given(st.integers(1, MAX_SHARDS), st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=1))
def test_the_shares_add_up_to_the_shards_and_differ_by_one_at_most(
    count: int, members: set[str]
) -> None:
    shares = [fair_share(count, members, me) for me in members]
    assert sum(shares) == count
    assert max(shares) - min(shares) <= 1


def test_a_replica_not_yet_seen_by_itself_counts_itself() -> None:
    assert fair_share(16, {"a"}, "b") == 8
    assert fair_share(16, set(), "a") == 16
    assert [fair_share(16, {"a", "b", "c"}, me) for me in "abc"] == [6, 5, 5]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--shards=101"], "must be between 1 and 100"),
        (["--shards=-2"], "give a number of shards"),
        (["--shards=4", "--run-lease=0"], "needs run ownership"),
    ],
)
def test_bad_shard_settings_are_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    """`keelgate operator --shards` out of range, or without run ownership (nothing would fence
    a moved shard's writes): exit 2, one line naming --shards, before anything connects."""
    store = ["--store", "postgresql://kg@127.0.0.1:1/kg", "--lease-namespace=kg"]
    code = main(["operator", *store, *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "--shards" in err and words in err and "Traceback" not in err, err


# The shard Leases, between replicas


@pytest.fixture
def api() -> Iterator[LeaseApi]:
    leases = LeaseApi()
    yield leases
    leases.close()


class Replica:
    """One replica's shard Leases, what it was told, and the shards it drives (as told)."""

    def __init__(self, api: LeaseApi, identity: str, count: int = 4) -> None:
        self.door: LeaseDoor = api.door()
        self.identity = identity
        self.driving: set[int] = set()
        self.lock = threading.Lock()
        settings = LeaseSettings(
            "kg-operator", NAMESPACE, identity, lease_seconds=3, renew_seconds=2, retry_seconds=1
        )
        api_client = client.ApiClient(client.Configuration(host=self.door.url))
        self.leases = ShardLeases(
            settings,
            count,
            api_client=api_client,
            taken=self._taken,
            release=self._release,
            lost=self._lost,
        )

    def _taken(self, shard: int) -> None:
        with self.lock:
            self.driving.add(shard)

    def _release(self, shard: int) -> None:
        with self.lock:
            self.driving.discard(shard)
        self.leases.released(shard)

    def _lost(self, shard: int) -> None:
        with self.lock:
            self.driving.discard(shard)

    def shards(self) -> set[int]:
        with self.lock:
            return set(self.driving)


class Overlaps:
    """Looks at every replica every 10 ms: whether a shard was ever driven by two at once."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.seen: list[tuple[int, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            owners: dict[int, str] = {}
            for replica in self.replicas:
                for shard in replica.shards():
                    if shard in owners:
                        self.seen.append((shard, owners[shard], replica.identity))
                    owners[shard] = replica.identity

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _wait(check: object, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _split(replicas: list[Replica]) -> list[int]:
    return sorted(len(r.shards()) for r in replicas)


def test_replicas_share_the_shards_and_a_third_takes_its_share_from_the_others(
    api: LeaseApi,
) -> None:
    """Two replicas hold two of four shards each, every shard driven by one; a third joining
    takes its share from the replicas over theirs (2, 1, 1), and no shard is ever driven by two
    at once, though the shards move while the replicas keep renewing."""
    a, b = Replica(api, "a/1"), Replica(api, "b/1")
    overlaps = Overlaps([a, b])
    try:
        a.leases.start()
        b.leases.start()
        _wait(lambda: _split([a, b]) == [2, 2], 15, "two shards each")
        assert a.shards().isdisjoint(b.shards())
        c = Replica(api, "c/1")
        overlaps.replicas.append(c)
        c.leases.start()
        _wait(lambda: _split([a, b, c]) == [1, 1, 2], 20, "the third replica's share")
        assert len(a.shards() | b.shards() | c.shards()) == 4
        for shard in range(4):
            lease = api.get(NAMESPACE, shard_lease_name("kg-operator", shard))
            assert lease is not None
            owner = next(r for r in (a, b, c) if shard in r.shards())
            assert lease["spec"]["holderIdentity"] == owner.identity
    finally:
        overlaps.stop()
        for replica in (a, b, *overlaps.replicas[2:]):
            replica.leases.stop()
    assert overlaps.seen == []


def test_a_replica_that_stops_cleanly_gives_its_shards_up_at_once(api: LeaseApi) -> None:
    """A clean stop gives every shard Lease and the member Lease up: the other replica holds
    all four within a few tries, not after a lease's length of silence."""
    a, b = Replica(api, "a/1"), Replica(api, "b/1")
    a.leases.start()
    b.leases.start()
    try:
        _wait(lambda: _split([a, b]) == [2, 2], 15, "two shards each")
        stopped = time.monotonic()
        a.leases.stop()
        _wait(lambda: len(b.shards()) == 4, 10, "the other replica's taking all four")
        assert time.monotonic() - stopped < 3.0  # the member and shard Leases' one-second end
    finally:
        b.leases.stop()


def test_a_replica_cut_off_stops_driving_before_another_takes_its_shards(api: LeaseApi) -> None:
    """A replica whose requests the API server refuses cannot renew: it is told each shard lost
    within the renew deadline, before the lease runs out for the other replica, which then
    holds all four; no shard is driven by both at any moment."""
    a, b = Replica(api, "a/1"), Replica(api, "b/1")
    overlaps = Overlaps([a, b])
    a.leases.start()
    b.leases.start()
    try:
        _wait(lambda: _split([a, b]) == [2, 2], 15, "two shards each")
        a.door.trouble = "refuse"
        cut = time.monotonic()
        _wait(lambda: not a.shards(), 5, "the cut-off replica's dropping its shards")
        assert time.monotonic() - cut <= 3.0
        _wait(lambda: len(b.shards()) == 4, 15, "the other replica's taking them")
    finally:
        overlaps.stop()
        a.door.mend()
        a.leases.stop()
        b.leases.stop()
    assert overlaps.seen == []
