"""The monitor reconciler, without a cluster: a monitor's AgentRun schedules ticks (child
AgentRuns) and runs nothing itself (tests/support/operator_rig.py, with a clock the test
moves).

What a user would notice if these broke: a tick created twice for one due time, a new tick
started while the last one waits for a person (it could repeat a WRITE whose outcome is
unknown), finished ticks piling up, or a suspended monitor that keeps ticking.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keelgate.kube.controller.outcomes import REST, Requeue
from keelgate.kube.naming import action_object_name
from support.operator_rig import NAMESPACE, Operator, agentrun_spec

READ_ONLY = [{"actions": [{"tool": "place_order", "args": {"sku": "A1"}}]}, {"done": True}]


class Clock:
    """Seconds since the epoch, moved by the test; starts at the next whole minute + 30 s."""

    def __init__(self) -> None:
        start = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
        self.now = (start + dt.timedelta(minutes=1, seconds=30)).timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def kube(tmp_path: Path, clock: Clock) -> Iterator[Operator]:
    # The server's times stay the wall's, 90 s behind the operator's clock: a monitor applied
    # now was made before the minute the test starts in, so its first tick is due at once.
    operator = Operator(tmp_path, clock=clock, server_clock=time.time)
    yield operator
    operator.close()


def monitor(**extra: Any) -> dict[str, Any]:
    spec = agentrun_spec(script=READ_ONLY, loop="monitor", schedule="* * * * *", **extra)
    spec["tools"][0]["sideEffect"] = "READ"
    return spec


def ticks(kube: Operator) -> list[str]:
    return sorted(
        run["metadata"]["name"]
        for run in kube.api.of_kind("AgentRun")
        if run["metadata"]["name"].startswith("watch.tick-")
    )


def test_a_due_monitor_creates_its_tick_and_comes_back_at_the_next(
    kube: Operator, clock: Clock
) -> None:
    """The schedule is due: tick 1 is created, owned and labelled by the monitor with its spec;
    the monitor shows it and when the next is due, and asks to be back then."""
    kube.apply("watch", monitor())
    result = kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-1"]
    tick = kube.run("watch.tick-1")
    owner = tick["metadata"]["ownerReferences"][0]
    assert (owner["name"], owner["controller"]) == ("watch", True)
    assert tick["metadata"]["labels"]["keelgate.dev/monitor"] == "watch"
    assert tick["spec"] == kube.run("watch")["spec"]
    status = kube.status("watch")
    next_minute = dt.datetime.fromtimestamp(clock.now, dt.UTC).replace(second=0) + dt.timedelta(
        minutes=1
    )
    assert status["lastTick"] == "watch.tick-1"
    assert status["phase"] == "Running"
    assert status["message"] == f"next tick at {next_minute.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    assert result == Requeue(next_minute.timestamp() - clock.now)
    assert kube.api.reasons() == ["TickCreated"]
    assert kube.reconcile("watch") == Requeue(next_minute.timestamp() - clock.now)
    assert ticks(kube) == ["watch.tick-1"]  # not due again yet: no second tick


def test_a_tick_is_driven_like_any_run_and_wakes_its_monitor(kube: Operator) -> None:
    """The tick runs its steps as a run; its status changes ask for its monitor's reconcile."""
    kube.apply("watch", monitor())
    kube.reconcile("watch")
    kube.queued.clear()
    assert kube.drive("watch.tick-1") == [0, 0]
    assert kube.status("watch.tick-1")["phase"] == "Succeeded"
    assert (("AgentRun", NAMESPACE, "watch"), 0.0) in kube.queued


def test_a_tick_still_running_holds_the_next_one_back(kube: Operator, clock: Clock) -> None:
    """When the next tick is due and the last still runs, that schedule is skipped and the
    monitor says so; once the last has finished, the next due time makes tick 2."""
    kube.apply("watch", monitor())
    kube.reconcile("watch")
    kube.reconcile("watch.tick-1")  # its first step pod: running
    clock.now += 60
    kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-1"]
    assert kube.status("watch")["message"] == "next tick held back: watch.tick-1 is still running"
    kube.run_step("watch.tick-1")
    kube.drive("watch.tick-1")
    clock.now += 60
    kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-1", "watch.tick-2"]


def test_a_tick_waiting_for_a_person_holds_the_next_one_back(kube: Operator, clock: Clock) -> None:
    """A tick stopped on an unknown outcome (or an approval) waits for a person: no new tick
    may start, since it could repeat the WRITE."""
    kube.apply("watch", monitor())
    kube.reconcile("watch")
    kube.api.patch_status(
        "AgentRun", NAMESPACE, "watch.tick-1", {"phase": "Stopped", "stopReason": "outcome_unknown"}
    )
    clock.now += 60
    kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-1"]
    assert kube.status("watch")["message"] == (
        "next tick held back: watch.tick-1 waits for a person (outcome_unknown)"
    )


def test_a_ticks_write_waiting_for_approval_holds_the_next_tick_back(
    kube: Operator, clock: Clock, orders: list[Any]
) -> None:
    """A monitor allowed to WRITE, whose order needs approval: tick 1 plans the order and
    stops awaiting approval. At the next due time no tick 2 is started (it would plan the
    same order while the first waits), and the monitor says why. Approved, tick 1 places its
    order, once; only the following due time brings tick 2."""
    spec = agentrun_spec(
        approval=True, loop="monitor", schedule="* * * * *", allowedSideEffects=["WRITE"]
    )
    kube.apply("watch", spec)
    kube.reconcile("watch")
    kube.drive("watch.tick-1")
    tick = kube.status("watch.tick-1")
    assert (tick["phase"], tick["stopReason"]) == ("Stopped", "awaiting_approval")
    assert orders == []
    for _ in range(2):  # two due times pass while it waits
        clock.now += 60
        kube.reconcile("watch")
        assert ticks(kube) == ["watch.tick-1"]
        assert kube.status("watch")["message"] == (
            "next tick held back: watch.tick-1 waits for a person (awaiting_approval)"
        )
    approval = action_object_name("watch.tick-1", "1:0", "place_order")
    kube.api.patch_spec("Approval", NAMESPACE, approval, {"approved": True, "by": "carol"})
    kube.reconcile(approval, kind="Approval")
    kube.drive("watch.tick-1")
    assert kube.status("watch.tick-1")["phase"] == "Succeeded"
    assert len(orders) == 1
    clock.now += 60
    kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-1", "watch.tick-2"]


def test_finished_ticks_are_kept_as_a_cronjob_keeps_its_jobs(kube: Operator, clock: Clock) -> None:
    """successfulTicksHistoryLimit 1 and failedTicksHistoryLimit 1: the older finished ticks
    are deleted (with a uid precondition), the newest of each kind kept."""
    kube.apply("watch", monitor(successfulTicksHistoryLimit=1, failedTicksHistoryLimit=1))
    for phase in ("Succeeded", "Succeeded", "Failed", "Failed"):
        kube.reconcile("watch")
        newest = ticks(kube)[-1]
        kube.api.patch_status("AgentRun", NAMESPACE, newest, {"phase": phase})
        clock.now += 60
    kube.reconcile("watch")
    assert ticks(kube) == ["watch.tick-2", "watch.tick-4", "watch.tick-5"]
    assert "delete AgentRun watch.tick-1" in kube.api.writes
    assert "delete AgentRun watch.tick-3" in kube.api.writes


def test_a_suspended_monitor_makes_no_tick(kube: Operator) -> None:
    """spec.suspend on a monitor: no tick, phase Pending, and no timer to come back."""
    kube.apply("watch", monitor(suspend=True))
    assert kube.reconcile("watch") == REST
    assert ticks(kube) == []
    status = kube.status("watch")
    assert (status["phase"], status["message"]) == ("Pending", "suspended (spec.suspend is true)")
