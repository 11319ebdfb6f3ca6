"""Being told on time, and fairly (issue 46, item 6; issue 51): the notifier against a real
CloudEvents receiver on loopback that trickles its answers.

An HTTP client's timeout bounds each read, not the exchange: a sink that sends its answer a byte
at a time held one try open for as long as it liked, the saved delivery point stood still behind
it, and a restart sent everything again. And every namespace shared one queue per sink, so one
namespace's flood pushed another's events out. What a user would notice if these broke: an
approval nobody is told of because another team's runs were failing, a chat channel flooded
again after every restart, a sink's `timeoutSeconds` that means nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fakes.event_receiver import EventReceiver, quick
from fakes.loopback import Answer
from keelgate.kube.notifications import notifications_of
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.notifier import Notifier
from keelgate.manifest import notifications as types
from keelgate.manifest.notifications import NotifySettings, Sink


class KeptState:
    """Where ``through`` is kept between leaders (a ConfigMap in the cluster)."""

    def __init__(self) -> None:
        self.through: float | None = None

    def load(self, lane: int | None = None) -> float | None:
        assert lane is None  # unsharded: one point
        return self.through

    def save(self, through: float, lane: int | None = None) -> None:
        assert lane is None
        self.through = through


def notifier(
    receiver: EventReceiver, *, state: KeptState | None = None, queue_size: int = 100, **sink: Any
) -> Notifier:
    settings = NotifySettings(
        source="keelgate-system/keelgate",
        queue_size=queue_size,
        sinks=[Sink.model_validate({"name": "chat", "url": receiver.url, **sink})],
    )
    return Notifier(settings, metrics=Metrics(), state=state, sleep=quick)


def sample(told: Notifier, metric: str, **labels: str) -> float:
    value = told.senders[0]._metrics.registry.get_sample_value(metric, {"sink": "chat", **labels})
    return 0.0 if value is None else value


def stamp(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def stopped_run(namespace: str, name: str, *, at: float) -> dict[str, Any]:
    """An AgentRun at rest, stopped at ``at``: it holds one ``run.stopped``."""
    return {
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "status": {
            "phase": "Stopped",
            "stopReason": "budget_exhausted",
            "message": "out of iterations",
            "step": {"number": 1, "attempt": 1},
            "conditions": [
                {"type": "Succeeded", "status": "False", "lastTransitionTime": stamp(at)}
            ],
        },
    }


def waiting_approval(namespace: str, name: str, *, at: float) -> dict[str, Any]:
    """An Approval shown Pending: it holds one ``approval.requested``."""
    return {
        "kind": "Approval",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "creationTimestamp": stamp(at),
        },
        "spec": {"runName": "pay-invoices", "action": "1:0", "tool": "pay"},
        "status": {"phase": "Pending"},
    }


def wait_until(check: Callable[[], bool], *, timeout: float = 10.0) -> float:
    """Seconds it took for ``check`` to hold."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError("not within the time")
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_sink_that_trickles_is_cut_at_its_time_limit_and_given_up_within_retry_for(
    receiver: EventReceiver,
) -> None:
    """The receiver takes team-a's event and sends its answer a byte every half second: a try
    ends at ``timeoutSeconds`` (3 s, the connection closed, which the receiver sees), and the
    whole delivery at ``retryForSeconds`` (4.5 s: the second try, begun at 3 s, is cut there,
    not at 6 s, and the event dropped as gave_up); team-b's event, queued behind it, is
    delivered next. The kept delivery point passes both, so the next leader, listing the same
    runs, sends neither again. (The limits leave 1.5 s between the cut and the try's own end,
    so that a loaded machine's late wake-ups cannot blur the two.)"""
    receiver.slow_namespaces = {"team-a"}
    kept = KeptState()
    first = notifier(receiver, state=kept, timeoutSeconds=3, retryForSeconds=4.5)
    first.begin()
    first.live()
    first.start()
    past = time.time() - 30  # the runs stopped half a minute ago
    bodies = [stopped_run("team-a", "nightly", at=past), stopped_run("team-b", "weekly", at=past)]
    try:
        started = time.monotonic()
        for body in bodies:
            first.observe("AgentRun", body, False)
        took = wait_until(
            lambda: sample(first, "keelgate_notifications_dropped_total", reason="gave_up") == 1
        )
        assert 4.4 <= took < 5.9, took  # tries cut at 3 s and 4.5 s; uncut: 40 s of headers
        assert len(receiver.trickled) == 2
        [got] = receiver.wait_for(1)
        assert got.data["namespace"] == "team-b"
        wait_until(lambda: len(receiver.hangups) == 2)  # it saw each try end
        assert all(h.at - started < 6.5 for h in receiver.hangups)
        assert sample(first, "keelgate_notifications_queued") == 0
        first.save_state()
        assert kept.through is not None and kept.through > past
    finally:
        first.stop()

    second = notifier(receiver, state=kept, timeoutSeconds=3, retryForSeconds=4.5)
    second.begin()
    for body in bodies:  # the new leader's listing
        second.observe("AgentRun", body, False)
    second.live()
    second.start()
    try:
        time.sleep(0.5)
        assert second.senders[0].pending() == []
        assert len(receiver.accepted) == 1 and len(receiver.trickled) == 2
    finally:
        second.stop()


def test_a_sink_that_trickles_the_body_of_its_yes_has_the_event_at_its_status(
    receiver: EventReceiver,
) -> None:
    """A 202 whose body then comes a byte a second: the status is the sink's word, so the event
    counts as delivered at once, is not tried again, and holds nothing up."""
    receiver.failures = [Answer(202, "x" * 60, trickle="body", pace=1.0)]
    told = notifier(receiver, timeoutSeconds=5)
    told.begin()
    told.live()
    told.start()
    try:
        told.observe("AgentRun", stopped_run("team-a", "nightly", at=time.time()), False)
        took = wait_until(
            lambda: sample(told, "keelgate_notifications_sent_total", type=types.RUN_STOPPED) == 1
        )
        assert took < 5.0, took  # reading the body: 60 s
        told.observe("AgentRun", stopped_run("team-a", "weekly", at=time.time()), False)
        receiver.wait_for(1, timeout=2.0)
        assert sample(told, "keelgate_notifications_failed_total") == 0
        assert len(receiver.received) == 2
    finally:
        told.stop()


def test_one_namespaces_flood_never_pushes_out_anothers_approval(receiver: EventReceiver) -> None:
    """300 runs of namespace ``flood`` stop at once, and the sink chokes on them (each answer
    trickles; each try is cut at half a second, never tried again). Then an approval waits in
    ``payments``. The queue (100) holds no more than it may, the flood's own newest events are
    dropped to make room for the approval, and the approval is delivered within a try or two,
    while most of the flood still waits: not after 100 of them, and not dropped."""
    receiver.slow_namespaces = {"flood"}
    told = notifier(receiver, queue_size=100, timeoutSeconds=0.5, retryForSeconds=0)
    told.begin()
    told.live()
    told.start()
    try:
        now = time.time()
        for number in range(300):
            told.observe("AgentRun", stopped_run("flood", f"batch-{number}", at=now), False)
        assert len(told.senders[0].pending()) <= 101  # the queue, and the one being tried
        approval = waiting_approval("payments", "pay-invoices-1-0-pay", at=now)
        [asked] = notifications_of("Approval", approval)
        told.observe("Approval", approval, False)
        [got] = receiver.wait_for(1, timeout=3.0)
        assert (got.type, got.id) == (types.APPROVAL_REQUESTED, asked.id)
        assert len(receiver.trickled) <= 3
        assert len(told.senders[0].pending()) >= 90  # the flood still waits behind it
        dropped = sample(told, "keelgate_notifications_dropped_total", reason="queue_full")
        assert dropped == 300 + 1 - 101
    finally:
        told.stop()


def test_two_namespaces_flooding_at_once_share_the_queue_and_take_turns(
    receiver: EventReceiver,
) -> None:
    """Namespace a floods a queue of 10, then namespace b floods it too: each keeps its share
    (5, its oldest), and they go out in turn, one of each, in order within each."""
    receiver.slow_namespaces = {"a", "b"}
    told = notifier(receiver, queue_size=10, timeoutSeconds=0.3, retryForSeconds=0)
    told.begin()
    told.live()
    now = time.time()
    for namespace in ("a", "b"):
        for number in range(20):
            told.observe("AgentRun", stopped_run(namespace, f"r{number:02}", at=now), False)
    waiting = told.senders[0].pending()
    assert [n.run for n in waiting if n.namespace == "a"] == [f"r{n:02}" for n in range(5)]
    assert [n.run for n in waiting if n.namespace == "b"] == [f"r{n:02}" for n in range(5)]
    told.start()
    try:
        wait_until(lambda: len(receiver.trickled) >= 4)
        order = [(g.data["namespace"], g.data["run"]) for g in receiver.trickled[:4]]
        assert order == [("a", "r00"), ("b", "r00"), ("a", "r01"), ("b", "r01")]
    finally:
        told.stop()


def test_a_sink_down_for_more_than_a_thousand_tries_still_delivers_when_it_is_back(
    receiver: EventReceiver,
) -> None:
    """retryForSeconds of a day: a sink down for 1,100 tries (17 hours at the 60 s cap) is
    still tried, and takes the event when it is back. The back-off's doubling once overflowed
    past try 1,025 and ended the sink's thread: every later event to it was queued for good.
    (The waits between tries are cut to nothing here; the tries are real requests.)"""
    receiver.failures = [Answer(status=503)] * 1100
    settings = NotifySettings(
        source="keelgate-system/keelgate",
        sinks=[
            Sink.model_validate({"name": "chat", "url": receiver.url, "retryForSeconds": 86400})
        ],
    )
    told = Notifier(settings, metrics=Metrics(), sleep=lambda _: False)
    told.begin()
    told.live()
    told.start()
    try:
        told.observe("AgentRun", stopped_run("team-a", "nightly", at=time.time()), False)
        [got] = receiver.wait_for(1, timeout=60)
        assert got.data["run"] == "nightly"
        assert len(receiver.received) == 1101
        assert sample(told, "keelgate_notifications_failed_total") == 1100
    finally:
        told.stop()
