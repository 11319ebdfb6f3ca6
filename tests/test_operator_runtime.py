"""The running operator's machinery, without a cluster: the work queue's semantics, the workers,
the resync's look for step pods deleted unseen, and the health and metrics endpoints (a real
HTTP server on loopback).

What a user would notice if these broke: two reconciles of one run at once (two step pods for
one step), an edit made during a reconcile never acted on, a back-off that never fires or never
grows, a run waiting for good on a pod deleted while the watch was away, a kubelet probe that
says healthy when the workers are dead.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import pytest

from keelgate.kube.api_failures import ApiFailure
from keelgate.kube.controller.context import ControllerSettings
from keelgate.kube.controller.outcomes import REST, Requeue, Result
from keelgate.kube.runtime.health import HealthServer, refresh_gauges
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.operator import Operator as RunningOperator
from keelgate.kube.runtime.operator import OperatorOptions
from keelgate.kube.runtime.resync import vanished_step_pods
from keelgate.kube.runtime.workers import Workers, backoff
from keelgate.kube.runtime.workqueue import WorkQueue
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

A = ("AgentRun", "shop", "a")
B = ("AgentRun", "shop", "b")


async def next_key(queue: WorkQueue[Any], within: float = 1.0) -> Any:
    return await asyncio.wait_for(queue.get(), within)


async def nothing_within(queue: WorkQueue[Any], seconds: float) -> bool:
    try:
        await asyncio.wait_for(queue.get(), seconds)
    except TimeoutError:
        return True
    return False


def test_a_key_added_many_times_is_reconciled_once() -> None:
    """Many events about one run before a worker takes it make one reconcile."""

    async def scenario() -> None:
        queue: WorkQueue[Any] = WorkQueue()
        for key in (A, B, A, A, B):
            queue.add(key)
        assert len(queue) == 2
        assert [await next_key(queue), await next_key(queue)] == [A, B]
        assert await nothing_within(queue, 0.05)

    asyncio.run(scenario())


def test_a_key_is_never_handed_out_twice_at_once_and_goes_again_if_it_changed() -> None:
    """While A is reconciled, an add of A waits: no second worker gets it; when the first is
    done, A goes round again (the change seen meanwhile is acted on). Without a change, done
    is the end of it."""

    async def scenario() -> None:
        queue: WorkQueue[Any] = WorkQueue()
        queue.add(A)
        assert await next_key(queue) == A
        queue.add(A)
        queue.add(B)
        assert await next_key(queue) == B  # not A: A is being reconciled
        assert await nothing_within(queue, 0.05)
        queue.done(A)
        assert await next_key(queue) == A
        queue.done(A)
        queue.done(B)
        assert await nothing_within(queue, 0.05)

    asyncio.run(scenario())


def test_keys_a_resync_queued_wait_behind_every_key_an_event_queued() -> None:
    """A resync's keys (added low) go after every key a watch event or a reconcile added, even
    ones added later, so a step pod's end is acted on at once behind thousands of resync keys;
    a key waiting low that an event adds again goes ahead; each key is still handed out once."""
    C, D = ("AgentRun", "ns", "c"), ("AgentRun", "ns", "d")

    async def scenario() -> None:
        queue: WorkQueue[Any] = WorkQueue()
        queue.add(A, low=True)
        queue.add(B, low=True)
        queue.add(C, low=True)
        queue.add(D)  # an event, after the resync's three
        queue.add(C)  # an event about one the resync queued: ahead now
        queue.add(D, low=True)  # the resync again: D stays ahead
        assert len(queue) == 4
        assert [await next_key(queue) for _ in range(4)] == [D, C, A, B]
        assert await nothing_within(queue, 0.05)
        for key in (B, C, D):
            queue.done(key)
        queue.add(A, low=True)  # while A is reconciled: back, low, once done
        queue.add(B)
        queue.done(A)
        assert [await next_key(queue), await next_key(queue)] == [B, A]

    asyncio.run(scenario())


def test_tenants_take_turns_and_none_holds_every_worker() -> None:
    """Keys of many tenants (namespaces): tenant A's thousand queued keys put one ahead of B's
    next key, not a thousand; and while A's keys hold workers (waiting on A's own locks), A may
    not take the last free one, so B's key, added last, still finds a worker at once. With one
    worker, A's key takes it as ever."""

    def key(tenant: str, n: int) -> tuple[str, str, str]:
        return ("AgentRun", tenant, f"r{n}")

    async def scenario() -> None:
        queue: WorkQueue[Any] = WorkQueue(tenant_of=lambda k: k[1], workers=4)
        for n in range(1000):
            queue.add(key("a", n))
        queue.add(key("b", 0))
        assert [await next_key(queue), await next_key(queue)] == [key("a", 0), key("b", 0)]
        queue.done(key("a", 0))
        queue.done(key("b", 0))
        held = [await next_key(queue) for _ in range(3)]
        assert held == [key("a", n) for n in (1, 2, 3)]  # three of four workers
        assert await nothing_within(queue, 0.05)  # the fourth is not A's to take
        queue.add(key("b", 1))
        assert await next_key(queue) == key("b", 1)
        queue.done(held[0])
        queue.done(key("b", 1))
        assert await next_key(queue) == key("a", 4)  # a worker free again: A goes on

        alone: WorkQueue[Any] = WorkQueue(tenant_of=lambda k: k[1], workers=1)
        alone.add(key("a", 0))
        assert await next_key(alone) == key("a", 0)

    asyncio.run(scenario())


def test_a_delayed_add_fires_after_its_delay_and_the_earliest_wins() -> None:
    """add_after brings the key back after the delay; a later delay does not postpone an
    earlier one, an earlier one replaces a later one; a delay of 0 or less adds at once."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue: WorkQueue[Any] = WorkQueue()
        start = loop.time()
        queue.add_after(A, 0.2)
        queue.add_after(A, 5.0)  # later: ignored
        queue.add_after(B, 5.0)
        queue.add_after(B, 0.1)  # earlier: wins
        assert await next_key(queue) == B
        assert await next_key(queue) == A
        assert 0.15 <= loop.time() - start < 2.0
        queue.done(A)
        queue.done(B)
        queue.add_after(A, -1.0)
        assert await next_key(queue, 0.05) == A

    asyncio.run(scenario())


def test_a_worker_thread_can_add_and_close_cancels_the_timers() -> None:
    """add_threadsafe from a reconcile's thread reaches the queue; closing it cancels what
    was to come back later."""

    async def scenario() -> None:
        queue: WorkQueue[Any] = WorkQueue()
        thread = threading.Thread(target=queue.add_threadsafe, args=(A, 0.0))
        thread.start()
        thread.join()
        assert await next_key(queue) == A
        queue.add_after(B, 0.1)
        queue.close()
        assert await nothing_within(queue, 0.3)

    asyncio.run(scenario())


def test_the_back_off_of_a_failing_reconcile_doubles_up_to_a_minute() -> None:
    assert [backoff(n) for n in (1, 2, 3, 6, 7, 50)] == [1.0, 2.0, 4.0, 32.0, 60.0, 60.0]


def test_workers_requeue_as_the_result_asks_and_back_off_on_errors() -> None:
    """A Requeue brings the key back after its delay, Rest does not; a reconcile that raises
    is counted, and its key comes back after the back-off; a success forgets its failures."""
    seen: list[tuple[str, str, str]] = []
    answers: dict[str, list[Result | Exception]] = {
        "a": [Requeue(0.05), REST],
        "b": [RuntimeError("the store is away"), REST],
    }

    def reconcile(key: tuple[str, str, str]) -> Result:
        seen.append(key)
        answer = answers[key[2]].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def scenario() -> Metrics:
        metrics = Metrics()
        queue: WorkQueue[Any] = WorkQueue()
        worker = asyncio.create_task(Workers(queue, reconcile, metrics).work())
        queue.add(A)
        queue.add(B)
        for _ in range(300):
            if len(seen) == 4:
                break
            await asyncio.sleep(0.01)
        worker.cancel()
        return metrics

    metrics = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert sorted(seen) == [A, A, B, B]
    assert seen.index(A, 1) < seen.index(B, 2)  # A's 0.05 s came before B's 1 s back-off
    errors = metrics.registry.get_sample_value(
        "keelgate_reconcile_errors_total", {"kind": "AgentRun"}
    )
    assert errors == 1


def test_the_resync_finds_the_step_pods_deleted_unseen(kube: Operator) -> None:
    """The cache holds three running step pods; the server still runs one, one has ended
    (the cache catches up), one is gone: only that one is reported, by name and uid."""
    for name in ("gone", "ended", "running"):
        kube.apply(name, agentrun_spec())
        kube.reconcile(name)
    kube.api.watch = None  # the watch is away
    kube.api.finish_pod(NAMESPACE, "ended-s1-a1", 0)
    gone = kube.api.remove("Pod", NAMESPACE, "gone-s1-a1")
    assert kube.cache.active_step_pods() == 3
    found = vanished_step_pods(kube.api, kube.cache, clusterwide=True)  # type: ignore[arg-type]
    assert found == [(NAMESPACE, "gone-s1-a1", gone["metadata"]["uid"])]
    assert kube.cache.active_step_pods() == 2  # the ended pod's body is in the cache now
    body = kube.cache.forget_vanished("Pod", NAMESPACE, "gone-s1-a1", gone["metadata"]["uid"])
    assert body is not None and kube.cache.active_step_pods() == 1
    # Its run takes its next attempt, as for any pod deleted mid-step.
    kube.reconcile("gone")
    assert kube.status("gone")["step"]["pod"] == "gone-s1-a2"
    assert vanished_step_pods(kube.api, kube.cache, clusterwide=False) == []  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_health_and_metrics_answer_over_http(kube: Operator) -> None:
    """/healthz and /readyz answer 200 while the workers run and 503 once they do not;
    /metrics shows the gauges as the cache has them at the scrape."""
    kube.apply("restock", agentrun_spec())
    kube.reconcile("restock")
    alive = [True]
    metrics = Metrics()
    server = HealthServer(
        alive=lambda: alive[0], metrics=metrics, refresh=lambda: refresh_gauges(metrics, kube.cache)
    )
    port = _free_port()

    async def scenario() -> list[tuple[int, str]]:
        await server.start("127.0.0.1", port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                answers = []
                for path in ("/healthz", "/readyz", "/metrics"):
                    answer = await client.get(path)
                    answers.append((answer.status_code, answer.text))
                alive[0] = False
                answer = await client.get("/healthz")
                answers.append((answer.status_code, answer.text))
                return answers
        finally:
            await server.stop()

    answers = asyncio.run(scenario())
    assert answers[0] == (200, "ok\n") and answers[1] == (200, "leading\n")
    assert answers[3] == (503, "stalled\n")
    page = answers[2][1]
    assert 'keelgate_runs{phase="Running"} 1.0' in page
    assert "keelgate_step_pods_active 1.0" in page
    assert "restock" not in page  # no run names in labels


def test_no_worker_runs_before_every_kind_is_listed_and_readyz_says_so(kube: Operator) -> None:
    """A restarted operator first lists runs, step pods, Reconciliations and Approvals into
    its cache (trying again when the API server refuses a list), and only then starts its
    workers: until then /readyz answers 503 "listing"; after, the step-pod cap counts the pods
    already running and /readyz answers "leading"."""
    for name in ("first", "second"):
        kube.apply(name, agentrun_spec())
    kube.reconcile("first")  # a step pod runs: the cap of 1 is full
    assert kube.api.running_step_pods(NAMESPACE)
    kube.api.refuse_next["list_all"] = ApiFailure("list Pod: 503 Service Unavailable", status=503)
    options = OperatorOptions(
        controller=ControllerSettings(max_step_pods=1), workers=1, resync_seconds=3600
    )
    restarted = RunningOperator(options, stores=kube.stores, api=kube.api)  # type: ignore[arg-type]
    assert restarted._ready() == (False, "listing")

    async def scenario() -> tuple[bool, str]:
        await restarted._start()
        try:
            return restarted._ready()
        finally:
            await restarted._stop()

    assert asyncio.run(scenario()) == (True, "leading")
    assert restarted.cache.active_step_pods() == 1
    assert sorted(k[2] for k in restarted.cache.keys("AgentRun")) == ["first", "second"]
    # The second run waits for the slot the first run's pod holds: no pod beyond the cap.
    assert restarted.controller is not None
    restarted.controller.reconcile(("AgentRun", NAMESPACE, "second"))
    assert len(kube.api.running_step_pods(NAMESPACE)) == 1


def test_a_running_operator_renews_its_runs_together_and_lets_idle_ones_go_on_a_clean_stop(
    kube: Operator,
) -> None:
    """With a holder, the running operator renews every run it holds once per period (the
    leases outlive several lease lengths), and on a clean stop lets go at once of each held run
    no step pod of its cluster drives (the next leader need not wait), while a run whose pod
    still runs keeps its lease (its pod's writes land until it lapses)."""
    for name in ("busy", "idle"):
        kube.apply(name, agentrun_spec())
    options = OperatorOptions(
        controller=ControllerSettings(holder="op-a", run_lease=2.0),
        workers=1,
        resync_seconds=3600,
        run_lease_renew=0.25,
    )
    running = RunningOperator(options, stores=kube.stores, api=kube.api)  # type: ignore[arg-type]
    kube.api.watch = running.cache
    owners: Any = kube.stores.checkpoints

    async def scenario() -> list[float]:
        await running._start()
        try:
            assert running.controller is not None
            for name in ("busy", "idle"):
                running.controller.reconcile(("AgentRun", NAMESPACE, name))
            assert running.controller.holding.held() == [(NAMESPACE, "busy"), (NAMESPACE, "idle")]
            kube.api.finish_pod(NAMESPACE, "idle-s1-a1", 137)  # its pod ended: nothing drives it
            await asyncio.sleep(5.0)  # two and a half leases: renewed all along
            return [owners.holder_of(NAMESPACE, name).lease_left for name in ("busy", "idle")]
        finally:
            await running._stop()

    assert all(left > 0.5 for left in asyncio.run(scenario()))
    busy, idle = (owners.holder_of(NAMESPACE, name) for name in ("busy", "idle"))
    assert (busy.holder, busy.epoch) == ("op-a", 1) and busy.lease_left > 0
    assert (idle.holder, idle.epoch) == ("op-a", 1) and idle.lease_left <= 0


def test_the_client_rate_limit_lets_a_burst_through_then_paces_requests_at_qps() -> None:
    """--kube-burst requests go at once; beyond them each waits its turn at --kube-qps, in the
    order they came (a debt is never skipped); an idle spell refills the bucket up to the burst,
    never beyond; a qps of 0 never waits. The waits are what keelgate_api_throttled_seconds
    counts."""
    from keelgate.kube.api import RateLimit

    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)

    limit = RateLimit(2.0, 3, clock=lambda: now[0], sleep=sleep)
    waits = [limit.wait() for _ in range(5)]
    assert waits == [0.0, 0.0, 0.0, 0.5, 1.0] and slept == [0.5, 1.0]
    now[0] += 60.0  # idle for a minute: the bucket holds the burst again, not 120
    assert [limit.wait() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]
    unlimited = RateLimit(0, 0, clock=lambda: now[0], sleep=sleep)
    assert {unlimited.wait() for _ in range(1000)} == {0.0}
    with pytest.raises(ValueError):
        RateLimit(-1, 3)


def test_a_new_run_waits_behind_the_runs_under_way_but_any_other_change_does_not() -> None:
    """A run created and never looked at (no status) is queued behind the runs under way, so a
    flood of new runs delays no hand-off; a run with a status, an edit, a deletion, or a new run
    already being deleted are queued as before."""
    from keelgate.kube.runtime.watch_events import is_new_run

    new = {"metadata": {"name": "r", "namespace": "ns"}, "spec": {}}
    assert is_new_run({"type": "ADDED", "object": new})
    assert not is_new_run({"type": "MODIFIED", "object": new})
    assert not is_new_run({"type": "ADDED", "object": {**new, "status": {"phase": "Running"}}})
    leaving = {**new, "metadata": {**new["metadata"], "deletionTimestamp": "2026-12-05T10:00:00Z"}}
    assert not is_new_run({"type": "ADDED", "object": leaving})
    assert not is_new_run({"type": "DELETED", "object": new})
