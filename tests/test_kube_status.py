"""An AgentRun's desired status (``keelgate.kube.status``), as a table: for every stop reason,
and for each moment of a run the operator knows of, the phase, the stop, and the six conditions
that ``kubectl wait``, kstatus (Helm ``--wait``, Flux), Argo CD and people read.

What a user would notice if a row broke: ``kubectl wait --for=condition=Succeeded`` returning
for a run that failed, Helm waiting for ever on a run that waits for a person, a budget stop
shown as failed, or a condition's lastTransitionTime moving when nothing changed.
"""

from __future__ import annotations

from typing import Any

import pytest

from keelgate.core.types import (
    Outcome,
    PendingApproval,
    RunPhase,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
)
from keelgate.kube.status import CONDITION_TYPES, RunView, desired_status, differs, phase_of

NOW = "2026-12-04T10:00:00Z"
LATER = "2026-12-04T10:05:00Z"
UNKNOWN = UnknownAction("2:0", "place_order", "kg-abc")
PENDING = PendingApproval("3:0", "refund")


def outcome(
    reason: StopReason | None, *, message: str = "why", answer: str | None = None
) -> Outcome:
    """The outcome a checkpoint gives for a stop (None: no stop, the run goes on)."""
    if reason is None:
        phase, stop = RunPhase.RUNNING, Stop(StopReason.FAILED, "", True)
    elif reason is StopReason.GOAL_MET:
        phase, stop = RunPhase.SUCCEEDED, Stop(reason, message)
    else:
        stop = Stop(reason, message)
        phase = RunPhase.STOPPED if stop.is_resumable else RunPhase.FAILED
    return Outcome(
        "shop",
        "restock",
        phase,
        stop,
        2,
        Usage(input_tokens=10, output_tokens=5),
        (UNKNOWN,) if reason is StopReason.OUTCOME_UNKNOWN else (),
        (PENDING,) if reason is StopReason.AWAITING_APPROVAL else (),
        answer,
    )


def view(**fields: Any) -> RunView:
    fields.setdefault("generation", 3)
    fields.setdefault("outcome", None)
    fields.setdefault("step", {"number": 2, "state": "Ended"})
    fields.setdefault("stepping", False)
    return RunView(**fields)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each condition as (status, reason)."""
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


# Every stop reason, at rest (no step pod intended): the phase, whether it resumes, and the
# status of each condition, in this order.
ORDER = ("Succeeded", "Ready", "Reconciling", "Stalled", "OutcomeUnknown", "AwaitingApproval")
STOPS = {
    StopReason.GOAL_MET: ("Succeeded", False, "True", "True", "False", "False", "False", "False"),
    StopReason.MAX_ITERATIONS: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "False",
        "False",
    ),
    StopReason.TOKEN_BUDGET: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "False",
        "False",
    ),
    StopReason.DOLLAR_BUDGET: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "False",
        "False",
    ),
    StopReason.TIMEOUT: ("Stopped", True, "False", "False", "False", "False", "False", "False"),
    StopReason.COST_UNKNOWN: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "False",
        "False",
    ),
    StopReason.VERIFIER_REJECTIONS: (
        "Failed",
        False,
        "False",
        "False",
        "False",
        "True",
        "False",
        "False",
    ),
    StopReason.OUTCOME_UNKNOWN: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "True",
        "False",
    ),
    StopReason.AWAITING_APPROVAL: (
        "Stopped",
        True,
        "False",
        "False",
        "False",
        "False",
        "False",
        "True",
    ),
    StopReason.FAILED: ("Failed", False, "False", "False", "False", "True", "False", "False"),
}


def test_the_table_covers_every_stop_reason() -> None:
    """A new stop reason cannot be added without its row here."""
    assert set(STOPS) == set(StopReason)


@pytest.mark.parametrize("reason", list(StopReason))
def test_a_run_at_rest_after_each_stop_shows_it(reason: StopReason) -> None:
    """The status of a run stopped for ``reason``, no step pod intended: the phase, the stop
    reason and whether it resumes, and every condition's value."""
    phase, resumable, *values = STOPS[reason]
    status = desired_status(view(outcome=outcome(reason)), old={}, now=NOW)
    assert (status["phase"], status["stopReason"], status["resumable"]) == (
        phase,
        reason.value,
        resumable,
    )
    shown = conditions(status)
    assert sorted(ORDER) == sorted(CONDITION_TYPES)
    assert [shown[t][0] for t in ORDER] == values
    assert status["iteration"] == 2 and status["usage"]["inputTokens"] == 10
    assert status["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
    assert all(c["lastTransitionTime"] == NOW for c in status["conditions"])
    # Succeeded carries the stop: the reason's own name, or goal_met with the answer.
    assert shown["Succeeded"][1] == reason.value
    assert shown["Reconciling"] == ("False", phase)
    if reason is StopReason.GOAL_MET:
        assert shown["Ready"] == ("True", "Succeeded")
    if shown["Stalled"][0] == "True":
        assert shown["Stalled"][1] == reason.value  # failed for good: kstatus reads failed


def test_a_goal_met_shows_the_answer_in_succeeded_and_status() -> None:
    """``kubectl wait --for=condition=Succeeded`` returns with the answer as its message."""
    status = desired_status(
        view(outcome=outcome(StopReason.GOAL_MET, message="done", answer="ordered 20")),
        old={},
        now=NOW,
    )
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert (succeeded["message"], status["answer"]) == ("ordered 20", "ordered 20")


def test_an_unknown_outcome_names_its_reconciliation() -> None:
    """OutcomeUnknown lists each unknown action with the Reconciliation that settles it, and
    status lists the action; nothing of its arguments."""
    status = desired_status(
        view(
            outcome=outcome(StopReason.OUTCOME_UNKNOWN),
            reconciliations={"2:0": "restock-2-place-order"},
        ),
        old={},
        now=NOW,
    )
    unknown = next(c for c in status["conditions"] if c["type"] == "OutcomeUnknown")
    assert (unknown["reason"], unknown["message"]) == (
        "WriteInFlight",
        "place_order (2:0): see reconciliation restock-2-place-order",
    )
    assert status["unknownActions"] == [
        {"action": "2:0", "tool": "place_order", "idempotencyKey": "kg-abc"}
    ]


def test_a_pending_approval_names_its_approval() -> None:
    status = desired_status(
        view(outcome=outcome(StopReason.AWAITING_APPROVAL), approvals={"3:0": "restock-3-refund"}),
        old={},
        now=NOW,
    )
    awaiting = next(c for c in status["conditions"] if c["type"] == "AwaitingApproval")
    assert (awaiting["reason"], awaiting["message"]) == (
        "ApprovalRequired",
        "refund (3:0): see approval restock-3-refund",
    )
    assert status["pendingApprovals"] == [{"action": "3:0", "tool": "refund"}]


# Moments before and between stops: (the view, phase, Succeeded, Reconciling, Stalled, message)
MOMENTS: dict[
    str, tuple[dict[str, Any], str, tuple[str, str], tuple[str, str], tuple[str, str], str]
] = {
    "new, nothing intended": (
        {},
        "Pending",
        ("Unknown", "Pending"),
        ("True", "StepRunning"),
        ("False", "NotStalled"),
        "",
    ),
    "first step pod intended": (
        {"stepping": True},
        "Running",
        ("Unknown", "Running"),
        ("True", "StepRunning"),
        ("False", "NotStalled"),
        "",
    ),
    "waiting for a step slot": (
        {"stepping": True, "waiting": "waiting for a step slot (20 pods running)"},
        "Running",
        ("Unknown", "Running"),
        ("True", "Waiting"),
        ("False", "NotStalled"),
        "waiting for a step slot (20 pods running)",
    ),
    "a step under way": (
        {"stepping": True, "outcome": outcome(None)},
        "Running",
        ("Unknown", "Running"),
        ("True", "StepRunning"),
        ("False", "NotStalled"),
        "",
    ),
    "resuming after a budget stop": (
        {"stepping": True, "outcome": outcome(StopReason.TOKEN_BUDGET)},
        "Running",
        ("Unknown", "Running"),
        ("True", "StepRunning"),
        ("False", "NotStalled"),
        "",
    ),
    "stalled before any checkpoint": (
        {"stalled": "3 step pods in a row ended"},
        "Stopped",
        ("False", "Stalled"),
        ("False", "Stopped"),
        ("True", "StepsFailing"),
        "3 step pods in a row ended",
    ),
    "stalled mid-run": (
        {"stalled": "the step refused its input", "outcome": outcome(None)},
        "Stopped",
        ("False", "Stalled"),
        ("False", "Stopped"),
        ("True", "StepsFailing"),
        "the step refused its input",
    ),
    "suspended": (
        {"suspended": True, "outcome": outcome(StopReason.TOKEN_BUDGET)},
        "Stopped",
        ("False", "token_budget"),
        ("False", "Suspended"),
        ("False", "NotStalled"),
        "suspended (spec.suspend is true)",
    ),
    "suspended with a step still under way": (
        {"suspended": True, "stepping": True},
        "Running",
        ("Unknown", "Running"),
        ("True", "StepRunning"),
        ("False", "NotStalled"),
        "",
    ),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_each_moment_of_a_run_shows_its_phase_and_conditions(moment: str) -> None:
    """The phase, Succeeded, Reconciling (kstatus: in progress), Stalled (kstatus: failed) and
    the message of a run at each moment the operator writes status in."""
    fields, phase, succeeded, reconciling, stalled, message = MOMENTS[moment]
    current = view(**fields)
    status = desired_status(current, old={}, now=NOW)
    shown = conditions(status)
    assert phase_of(current).value == status["phase"] == phase
    assert (shown["Succeeded"], shown["Reconciling"], shown["Stalled"]) == (
        succeeded,
        reconciling,
        stalled,
    )
    assert status["message"] == message
    assert shown["Ready"] == ("False", phase)
    assert shown["OutcomeUnknown"] == ("False", "NoUnknownOutcome")
    assert shown["AwaitingApproval"] == ("False", "NoPendingApproval")
    if status["phase"] == "Running":
        assert status["stopReason"] == "" and status["resumable"] is False


def test_a_transition_time_moves_only_when_its_condition_changes() -> None:
    """metav1.Condition: lastTransitionTime keeps its value while the status stays, and takes
    the new time when it changes; status, step and failpointsSeen are written as given."""
    first = desired_status(view(stepping=True), old={}, now=NOW)
    again = desired_status(view(stepping=True), old=first, now=LATER)
    assert again["conditions"] == first["conditions"]
    assert not differs(again, first)
    done = desired_status(view(outcome=outcome(StopReason.GOAL_MET)), old=first, now=LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times["Succeeded"] == times["Ready"] == times["Reconciling"] == LATER
    assert times["Stalled"] == times["OutcomeUnknown"] == times["AwaitingApproval"] == NOW
    assert differs(done, first)
    pinned = desired_status(
        view(step={"number": 4}, failpoints_seen="after_plan@1"), old={}, now=NOW
    )
    assert (pinned["step"], pinned["failpointsSeen"]) == ({"number": 4}, "after_plan@1")


def test_differs_looks_only_at_what_would_be_patched() -> None:
    """A field the operator does not write (kopf's part) is no reason to patch."""
    assert not differs({"phase": "Running"}, {"phase": "Running", "kopf": {"x": 1}})
    assert differs({"phase": "Running"}, {"phase": "Pending"})
    assert differs({"message": ""}, {})
