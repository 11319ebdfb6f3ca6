"""The scale bench counts right: what ``bench/scale.py`` prints as hand-off, time to the first
pod, API requests per verb, CPU of a process tree and "every WRITE once" is what the inputs say.

Why it exists: the figures of docs/performance.md ("Ten thousand runs on kwok") choose a
platform's settings; each is a count over watch times, audit events, ``/proc`` lines or the
shop's book, decided in ``bench/scalebench/counting.py``. Here each count meets inputs whose
answer is known, including the ones that must not count (an end outside the window, a run's
last pod, another user's request, a request received before the window, a watch's intermediate
stage, a second order under one key). No cluster, no clock: plain values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from scalebench import counting  # noqa: E402

OPERATOR = "system:serviceaccount:keelgate-system:keelgate-operator"


def test_a_hand_off_is_a_pods_end_to_its_runs_next_pod_and_only_ends_in_the_window() -> None:
    """r1's step 1 ended at 10.0 and its step 2 was seen at 10.25: one hand-off of 0.25 s. A
    retry (attempt 2) is the next pod of its step; a run's last pod gives none; an end before
    the window gives none; a next pod seen before its predecessor's end (clock order on two
    watches) counts 0, never negative."""
    created = {
        "r1-s1-a1": 1.0,
        "r1-s2-a1": 10.25,
        "r1-s3-a1": 30.5,
        "r2-s1-a1": 2.0,
        "r2-s1-a2": 12.0,  # r2's first pod died: its retry follows it
        "r3-s1-a1": 3.0,
        "r3-s2-a1": 4.9,
        "my-run-s10-s1-a1": 5.0,  # a run whose name looks like a pod's
        "my-run-s10-s2-a1": 25.0,
    }
    ended = {
        "r1-s1-a1": 10.0,
        "r1-s2-a1": 30.0,
        "r1-s3-a1": 40.0,  # the last: no next pod
        "r2-s1-a1": 11.0,
        "r3-s1-a1": 5.0,  # before the window
        "my-run-s10-s1-a1": 24.0,
    }
    got = sorted(counting.handoffs(created, ended, start=9.0, end=35.0))
    assert got == [0.25, 0.5, 1.0, 1.0]
    assert counting.handoffs(created, ended, start=4.0, end=5.5) == [0.0]  # r3: never negative


def test_time_to_first_pod_counts_runs_created_in_the_window_whose_first_pod_was_seen() -> None:
    runs = {"a": 1.0, "b": 5.0, "c": 6.0, "d": 50.0}
    created = {"a-s1-a1": 1.5, "b-s1-a1": 5.25, "b-s2-a1": 7.0, "d-s1-a1": 51.0}
    assert counting.first_pods(runs, created, start=2.0, end=40.0) == [0.25]  # c: none yet


def test_quantiles_and_windows_and_per_step() -> None:
    values = [float(n) for n in range(1, 101)]
    assert counting.quantile(values, 0.5) == 51.0  # nearest rank over 100 values
    assert counting.quantile(values, 0.99) == 99.0
    assert counting.quantile([], 0.99) == 0.0
    assert counting.in_window([1.0, 2.0, 3.0, 4.0], 2.0, 4.0) == 2
    assert counting.per_step(7.0, 2) == 3.5 and counting.per_step(7.0, 0) == 0.0


def _audit(verb: str, resource: str, at: str, *, user: str = OPERATOR, **extra: object) -> str:
    event: dict[str, object] = {
        "kind": "Event",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": user},
        "objectRef": {"resource": resource, **extra},
        "requestReceivedTimestamp": at,
    }
    return json.dumps(event)


def test_api_requests_are_the_operators_completed_ones_received_in_the_window() -> None:
    """Counted by (verb, resource[/subresource]): the operator's requests received in the
    window, each once at ResponseComplete; another user's, an earlier one, a watch's
    ResponseStarted and a line that is not JSON are not counted. Writes are the changing
    verbs."""
    start = counting._unix("2026-12-05T10:00:00Z")
    end = counting._unix("2026-12-05T10:10:00Z")
    assert start is not None and end is not None
    lines = [
        _audit("create", "pods", "2026-12-05T10:00:01.5Z"),
        _audit("create", "pods", "2026-12-05T10:05:00.123456Z"),
        _audit("patch", "agentruns", "2026-12-05T10:05:01Z", subresource="status"),
        _audit("create", "events", "2026-12-05T10:09:59.999Z"),
        _audit("list", "pods", "2026-12-05T10:03:00Z"),
        _audit("watch", "pods", "2026-12-05T10:04:00Z"),
        _audit("create", "pods", "2026-12-05T09:59:59Z"),  # before the window
        _audit("create", "pods", "2026-12-05T10:10:00Z"),  # at its end: the next window's
        _audit("create", "agentruns", "2026-12-05T10:01:00Z", user="admin"),  # the bench's
        json.dumps({"stage": "ResponseStarted", "verb": "watch", "user": {"username": OPERATOR}}),
        "not json",
    ]
    counts = counting.audit_requests(lines, OPERATOR, start, end)
    assert counts == {
        ("create", "pods"): 2,
        ("patch", "agentruns/status"): 1,
        ("create", "events"): 1,
        ("list", "pods"): 1,
        ("watch", "pods"): 1,
    }
    assert counting.by_verb(counts) == {"create": 3, "patch": 1, "list": 1, "watch": 1}
    assert counting.writes(counts) == 4


def test_every_write_once_holds_only_when_no_key_repeats_and_each_finished_run_ordered_once() -> (
    None
):
    orders = [
        {"key": "k1", "body": {"sku": "r1", "qty": 1}},
        {"key": "k2", "body": {"sku": "r2", "qty": 1}},
        {"key": "k3", "body": {"sku": "r3", "qty": 1}},  # r3 still under way
    ]
    good = counting.writes_once(orders, ["r1", "r2"])
    assert good["ok"] and good["orders"] == 3 and good["succeeded_runs"] == 2
    twice = counting.writes_once([*orders, {"key": "k2", "body": {"sku": "r2"}}], ["r1", "r2"])
    assert not twice["ok"] and twice["keys_twice_or_missing"] == ["k2"]
    assert twice["succeeded_runs_without_exactly_one_order"] == ["r2"]
    missing = counting.writes_once(orders, ["r1", "r4"])  # r4 succeeded with no order
    assert not missing["ok"] and missing["succeeded_runs_without_exactly_one_order"] == ["r4"]
    keyless = counting.writes_once([{"key": "", "body": {"sku": "r1"}}], ["r1"])
    assert not keyless["ok"]


def test_a_process_trees_cpu_counts_its_own_and_its_reaped_childrens_time() -> None:
    """``/proc/PID/stat``: fields 14-17 are utime, stime, cutime, cstime in clock ticks; a
    command name with spaces and parentheses does not shift them."""
    line = "4242 (keelgate (op) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 9"
    assert counting.cpu_seconds_of(line, 100) == 3.5
    assert counting.parent_of(line) == 1


def test_a_profile_is_summed_by_innermost_frame_by_every_frame_and_by_keelgate_frame() -> None:
    lines = [
        "main (a.py:1);work (keelgate/x.py:2);loads (json/decoder.py:3) 6",
        "main (a.py:1);work (keelgate/x.py:2) 2",
        "main (a.py:1);poll (kopf/y.py:4) 2",
        "garbage",
    ]
    top = counting.collapsed_top(lines)
    assert top["self"][0] == ("loads (json/decoder.py:3)", 0.6)
    assert ("main (a.py:1)", 1.0) in top["total"]
    assert top["keelgate"][0] == ("work (keelgate/x.py:2)", 0.8)
    assert top["keelgate"][1][1] == 0.2


def test_hand_offs_still_to_make_are_runs_whose_newest_pod_ended_before_their_last_step() -> None:
    created = {
        "a-s1-a1": 1.0,  # ended, no next pod yet: waiting
        "b-s1-a1": 1.0,
        "b-s2-a1": 2.0,  # b's newest runs: not waiting
        "c-s3-a1": 3.0,  # c's last step ended: the run is done, nothing to make
        "d-s2-a1": 1.0,
        "d-s2-a2": 4.0,  # a retry ended: waiting
    }
    ended = {"a-s1-a1": 2.0, "b-s1-a1": 1.5, "c-s3-a1": 4.0, "d-s2-a1": 3.0, "d-s2-a2": 5.0}
    assert counting.waiting_handoffs(created, ended) == 2


def test_replicas_are_printed_against_the_one_operator_measured_at_the_same_runs() -> None:
    """With ``--replicas 1,2`` each number of runs is measured twice; the side-by-side lines are
    the two replicas' figures with their ratio to the one operator's at the same runs (hand-off
    p99 0.8 s against 0.5 s is x1.60; CPU 12 ms a step summed against 15 ms is x0.80); a number
    of runs measured only with replicas has no line, and the one operator gets none."""
    from scalebench import report

    def phase(runs: int, replicas: int, p99: float, cpu: float, pods: float) -> dict[str, object]:
        return {
            "runs": runs,
            "replicas": replicas,
            "shards": 2 if replicas > 1 else 0,
            "handoff_p99_s": p99,
            "operator_cpu_ms_per_step": cpu,
            "step_pods_per_second": pods,
        }

    lines = report.side_by_side(
        [
            phase(100, 1, 0.5, 15.0, 4.0),
            phase(100, 2, 0.8, 12.0, 5.0),
            phase(300, 2, 0.9, 11.0, 5.0),  # no one-operator phase at 300 runs
        ]
    ).splitlines()
    assert len(lines) == 2
    assert lines[1].split(" | ") == [
        "  100",
        "2 (2)",
        "0.800 (x1.60)",
        "12.0 (x0.80)",
        "5.00 (x1.25)",
    ]
