"""The small parts beside the reconcilers: how a step pod's end is read, the step slots, the
run memory, the Event recorder, and the seams the fakes and the real classes share.

What a user would notice if these broke: a pod killed by the OOM killer read as a refusal (the
run stalled for good) or a refusal retried for ever, more step pods than the cap when reconciles
race, an Event lost or posted between one pod's end and the next pod's start, a test fake that
no longer behaves like the API client it stands for.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fakes.kube_api import FakeApiServer
from keelgate.kube.api import ClusterApi
from keelgate.kube.controller.events import EventRecorder
from keelgate.kube.controller.memory import RunMemory
from keelgate.kube.controller.outcomes import LOST_RACE, REST, Requeue, Stall
from keelgate.kube.controller.pod_ends import EndKind, PodEnd, classify
from keelgate.kube.controller.ports import ApiServer, ClusterView, StepMeter
from keelgate.kube.controller.slots import StepSlots
from keelgate.kube.runtime.cache import Cache
from keelgate.kube.runtime.metrics import Metrics

KEY = ("AgentRun", "shop", "restock")


def ended(code: int, **terminated: Any) -> dict[str, Any]:
    state = {"terminated": {"exitCode": code, **terminated}}
    return {"status": {"phase": "Failed", "containerStatuses": [{"state": state}]}}


# How a step pod's end is read: (pod, kind, words)
ENDS: dict[str, tuple[dict[str, Any], EndKind, str]] = {
    "went on": (ended(0, reason="Completed"), EndKind.CLEAN, "exit code 0 (Completed)"),
    "failed stop": (ended(1), EndKind.CLEAN, "exit code 1"),
    "resumable stop": (ended(3), EndKind.CLEAN, "exit code 3"),
    "bad input": (
        ended(2, reason="Error", message="keelgate: error: spec.tools[0]: no such tool\n{...}"),
        EndKind.BAD_INPUT,
        "exit code 2 (Error): keelgate: error: spec.tools[0]: no such tool",
    ),
    "busy": (ended(4), EndKind.BUSY, "exit code 4: another process was driving the run"),
    "store away": (ended(5), EndKind.STORE, "exit code 5: the store could not be reached"),
    "fenced": (
        ended(6),
        EndKind.FENCED,
        "exit code 6: another holder took the run over; nothing more was written",
    ),
    "killed": (ended(137, reason="OOMKilled"), EndKind.CRASH, "exit code 137 (OOMKilled)"),
    "evicted": (
        {"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}},
        EndKind.CRASH,
        "Evicted: low on memory",
    ),
    "unknown phase": ({"status": {"phase": "Unknown"}}, EndKind.CRASH, "ended as Unknown"),
    "past its deadline": (
        {
            **ended(137, reason="Error"),
            "status": {**ended(137, reason="Error")["status"], "reason": "DeadlineExceeded"},
        },
        EndKind.CRASH,
        "exit code 137 (Error): ran past its deadline (activeDeadlineSeconds)",
    ),
}


@pytest.mark.parametrize("case", list(ENDS))
def test_a_step_pods_end_is_read_from_its_exit_code(case: str) -> None:
    """Exit 0, 1 and 3 recorded where the run stands; 2 the step refused its input (its error
    line, not its JSON outcome, in the words); 4 busy; 5 the store; 6 another holder took the
    run over (busy, not a crash); anything else a crash."""
    pod, kind, words = ENDS[case]
    end = classify(pod)
    assert (end.kind, end.words) == (kind, words)
    assert end.clean is (kind is EndKind.CLEAN)


def test_a_pod_end_keeps_its_run_time_and_a_deleted_pod_is_a_crash() -> None:
    end = classify(ended(0, startedAt="2026-12-04T10:00:00Z", finishedAt="2026-12-04T10:00:07Z"))
    assert end == PodEnd(EndKind.CLEAN, "exit code 0", 7.0)
    gone = classify({"status": {"phase": "Running"}}, deleted=True)
    assert gone == PodEnd(EndKind.CRASH, "deleted before it ended")


def test_a_failed_steps_last_lines_are_kept_short_and_a_clean_end_has_none() -> None:
    """What a failing step wrote last (its termination message: the log's tail) is kept for
    the run's status.step.lastLines: the last five non-empty lines, at most 1,000 characters."""
    lines = "\n".join(f"line {n}" for n in range(1, 9)) + "\n\n"
    end = classify(ended(137, reason="Error", message=lines))
    assert end.last_lines == "line 4\nline 5\nline 6\nline 7\nline 8"
    long = classify(ended(137, message="x" * 5000))
    assert long.last_lines == "x" * 1000
    assert classify(ended(0, reason="Completed")).last_lines == ""


def test_the_end_kinds_are_the_metrics_labels() -> None:
    """``keelgate_steps_ended_total{result}`` keeps its label values (preempted, then fenced
    added)."""
    assert [kind.value for kind in EndKind] == [
        "clean",
        "crash",
        "busy",
        "bad_input",
        "store",
        "preempted",
        "fenced",
    ]


def test_outcomes_are_values() -> None:
    """Decisions compare by value and cannot be changed once made."""
    assert Stall("why") == Stall("why") != Stall("other")
    assert Requeue(0.0) == LOST_RACE and Requeue(0.0) != REST
    with pytest.raises(AttributeError):
        Stall("why").reason = "else"  # type: ignore[misc]


class Pods:
    """A cache holding ``count`` active step pods."""

    def __init__(self, count: int) -> None:
        self.count = count

    def active_step_pods(self) -> int:
        return self.count


def test_step_slots_keep_the_cap_when_reconciles_race() -> None:
    """Twenty threads ask at once for slots under a cap of five with two pods running: three
    get one; the others wait, the longest waiting first, until a pod ends."""
    clock = iter(range(1000))
    slots = StepSlots(Pods(2), limit=5, clock=lambda: float(next(clock)))  # type: ignore[arg-type]
    taken: list[tuple[str, str, str]] = []
    barrier = threading.Barrier(20)

    def ask(index: int) -> None:
        barrier.wait()
        key = ("AgentRun", "shop", f"run-{index}")
        if slots.take(key):
            taken.append(key)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == 3
    waiting = slots.longest_waiting(100)
    assert len(waiting) == 17 and not set(waiting) & set(taken)
    assert all(slots.is_waiting(key) for key in waiting)
    assert slots.longest_waiting(2) == waiting[:2]
    slots.release()
    assert slots.take(waiting[0])  # one freed: the longest waiting takes it
    assert not slots.is_waiting(waiting[0])
    slots.stop_waiting(waiting[1])
    assert waiting[1] not in slots.longest_waiting(100)


def test_run_memory_keeps_each_fact_until_taken() -> None:
    """A clean end is kept untold until told once; a crash asks for the spec to be recorded
    again; a deleted run is forgotten."""
    memory = RunMemory()
    memory.remember_spec(KEY, ("uid", 1, {"goal": "x"}))
    memory.step_ended(KEY, at=10.0, untold="step 1 ended")
    assert memory.spec_recorded(KEY, ("uid", 1, {"goal": "x"}))
    assert not memory.spec_recorded(KEY, ("uid", 2, {"goal": "x"}))
    assert memory.take_untold(KEY) == "step 1 ended"
    assert memory.take_untold(KEY) is None
    assert memory.take_ended_at(KEY) == 10.0
    memory.step_ended(KEY, at=11.0, untold=None)
    assert not memory.spec_recorded(KEY, ("uid", 1, {"goal": "x"}))
    memory.step_ended(KEY, at=12.0, untold="step 2 ended")
    memory.forget(KEY)
    assert memory.take_untold(KEY) is None and memory.take_ended_at(KEY) is None


def test_events_of_a_reconcile_are_posted_after_it_in_order(tmp_path: Path) -> None:
    """Within ``deferred`` nothing is posted until the block ends (even by an error), then all
    in the order recorded; outside it an Event is posted at once. Each thread keeps its own."""
    api = FakeApiServer()
    recorder = EventRecorder(api)
    run = {"kind": "AgentRun", "metadata": {"name": "restock", "namespace": "shop"}}
    recorder.normal(run, "Now", "at once")
    assert api.reasons() == ["Now"]
    with pytest.raises(RuntimeError), recorder.deferred():
        recorder.warning(run, "First", "one")
        other = threading.Thread(target=recorder.normal, args=(run, "Elsewhere", "other thread"))
        other.start()
        other.join()
        recorder.normal(run, "Second", "two")
        assert api.reasons() == ["Now", "Elsewhere"]
        raise RuntimeError("the reconcile failed")
    assert api.reasons() == ["Now", "Elsewhere", "First", "Second"]
    assert api.events[2].type == "Warning" and api.events[3].type == "Normal"


def _public(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("seam", "real", "fake"),
    [
        (ApiServer, ClusterApi, FakeApiServer),
        (ClusterView, Cache, Cache),
        (StepMeter, Metrics, Metrics),
    ],
)
def test_the_fakes_and_the_real_classes_have_the_seams_signatures(
    seam: type, real: type, fake: type
) -> None:
    """Every method a reconciler calls exists on the real class and on the test's stand-in
    with the same parameters (mypy checks the real classes against the seams in the wiring;
    this keeps the fake API server honest too)."""
    for name, method in _public(seam).items():
        wanted = inspect.signature(method)
        for cls in (real, fake):
            have = inspect.signature(getattr(cls, name))
            assert list(have.parameters) == list(wanted.parameters), (cls.__name__, name)
            assert [p.kind for p in have.parameters.values()] == [
                p.kind for p in wanted.parameters.values()
            ], (cls.__name__, name)
