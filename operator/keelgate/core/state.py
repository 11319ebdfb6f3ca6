"""RunState: the checkpoint document, the only state a run has.

The loop reads one, does one phase, and writes the next; nothing else holds state. Its JSON is
the same in every store, so a run can move between them. Its size must not grow with the run's
length: the history the model sees is a bounded window, and tool outputs in it are capped.

Its format is versioned (``VERSION``). A checkpoint an older release wrote is read through
explicit upgrade steps, one per version (``UPGRADES``), so an upgrade never strands a run in
flight; only a checkpoint newer than this code is refused, since this code cannot know what it
means. A step must never change once released: a new format is a new step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import PlainSerializer

from keelgate.core.audit import AuditDraft
from keelgate.core.json_codec import OMIT_EMPTY, OMIT_NONE, JsonValue
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.tracing import TraceRef
from keelgate.core.types import (
    LATE_KEPT,
    Action,
    ActionResult,
    LateResult,
    Outcome,
    PendingApproval,
    RunPhase,
    Stop,
    StopReason,
    UnknownAction,
    Usage,
    canonical_json,
)
from keelgate.errors import StoreError

VERSION = 3  # the checkpoint format this code writes
HISTORY_WINDOW = 20
OUTPUT_CAP = 4096


class Step(StrEnum):
    """The phase a run does next."""

    PLAN = "plan"
    ACT = "act"
    OBSERVE = "observe"
    VERIFY = "verify"
    DONE = "done"


@dataclass(frozen=True)
class Plan(JsonValue):
    """A planning call's answer, saved before anything runs."""

    iteration: int
    call: int
    actions: tuple[Action, ...] = ()
    done: bool = False
    answer: str | None = None


@dataclass(frozen=True)
class Decision(JsonValue):
    """One person's yes or no on an action that needs approval. An action keeps each decision
    made on it, in order: any no denies it; the yeses are counted against its rule."""

    approved: bool
    by: str
    # When it was made (UTC ISO 8601): an approval's age is counted from here. Recorded at once
    # (the CLI, Python), it is the moment of recording; from an Approval object, the earlier of
    # the moment its entry states and the moment the operator first saw the entry.
    at: str
    # The groups the API server authenticated the person in (as the decision said, admission
    # checked); and, for a decision recorded from an Approval object, the entry's identity
    # (the object's uid and the version of it the entry was added to, which admission
    # stamps: ``kube.controller.approval_entries``),
    # so each entry is recorded once, whatever happens in between, and never taken for another.
    groups: Annotated[tuple[str, ...], OMIT_EMPTY] = ()
    ref: Annotated[str, OMIT_EMPTY] = ""
    # The fingerprint of the call's definition it was made on (``core.calls``): it counts only
    # while the action is bound to that definition. Empty: recorded before definitions were,
    # and counted as it always was.
    definition: Annotated[str, OMIT_EMPTY] = ""
    # Why, in the person's words (redacted as a goal is): on the chain, the Approval, the events.
    note: Annotated[str, OMIT_EMPTY] = ""


def _spec_json(spec: LoopSpec) -> Mapping[str, Any]:
    return spec.json_form  # the same spec in every checkpoint of a session: written once


def _entries(history: tuple[Mapping[str, Any], ...]) -> list[Mapping[str, Any]]:
    return list(history)  # entries are never changed in place: the document may share them


def capped(value: Any) -> Any:
    """A tool output as the history keeps it: whole if small, else a truncated string."""
    text = canonical_json(value)
    if len(text) <= OUTPUT_CAP:
        return value
    return {"truncated": True, "preview": text[:OUTPUT_CAP]}


@dataclass(frozen=True, kw_only=True)
class RunState(JsonValue):
    seq: int = 0
    spec: Annotated[LoopSpec, PlainSerializer(_spec_json)]
    step: Step = Step.PLAN
    iteration: int = 0
    calls: int = 0
    plan: Plan | None = None
    results: tuple[ActionResult, ...] = ()
    history: Annotated[tuple[Mapping[str, Any], ...], PlainSerializer(_entries)] = ()
    dropped: int = 0
    usage: Usage = field(default_factory=Usage)
    rejections: int = 0
    stop: Stop | None = None
    unknown: tuple[UnknownAction, ...] = ()
    pending: tuple[PendingApproval, ...] = ()
    approvals: Mapping[str, tuple[Decision, ...]] = field(default_factory=dict)
    outbox: tuple[AuditDraft, ...] = ()
    answer: str | None = None
    audit_tail: str | None = None  # key of the last event written with a checkpoint
    # Calls that ended after someone else settled their keys (the newest LATE_KEPT).
    late: Annotated[tuple[LateResult, ...], OMIT_EMPTY] = ()
    # The run's trace, when a traced process first drove it (``keelgate.core.tracing``).
    trace: Annotated[TraceRef | None, OMIT_NONE] = None
    # The round each action past its first asking is asked in (``core.approvals.ask_again``):
    # an action asked afresh once no approval on it could count any more. ``approvals`` holds
    # the current round's decisions only (the chain keeps every one).
    rounds: Annotated[Mapping[str, int], OMIT_EMPTY] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    @property
    def run(self) -> str:
        return self.spec.run

    def round_of(self, action: str) -> int:
        """The round ``action`` is asked in: 1 until it is asked afresh."""
        return self.rounds.get(action, 1)

    def planned(self, action: str) -> Action | None:
        """The current plan's action with id ``action`` (None: the plan has none)."""
        if self.plan is not None:
            for planned in self.plan.actions:
                if planned.id == action:
                    return planned
        return None

    def but(self, **changes: Any) -> RunState:
        """A copy with ``changes``. The loop makes several per phase, so this skips
        ``dataclasses.replace``'s full ``__init__``; unknown field names are still refused."""
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"RunState has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(RunState)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    def remember(self, entry: Mapping[str, Any]) -> RunState:
        """Append to the model's history, keeping only the newest HISTORY_WINDOW entries."""
        history = (*self.history, dict(entry))
        dropped = self.dropped
        if len(history) > HISTORY_WINDOW:
            dropped += len(history) - HISTORY_WINDOW
            history = history[-HISTORY_WINDOW:]
        return replace(self, history=history, dropped=dropped)

    def continues_under(self, budget: Budget) -> bool:
        """Whether a resume with ``budget`` goes on: no stop yet, or a resumable one. A verifier
        limit, once raised past the rejections, makes that stop resumable again."""
        stop = self.stop
        if stop is None:
            return True
        if stop.reason is StopReason.VERIFIER_REJECTIONS:
            limit = budget.max_verifier_rejections
            return limit is None or self.rejections < limit
        return stop.is_resumable

    def result_of(self, action_id: str) -> ActionResult | None:
        for result in self.results:
            if result.action == action_id:
                return result
        return None

    def outcome(self) -> Outcome:
        # No stop recorded: running elsewhere now, or its process died; either way a resume
        # continues it.
        stop = self.stop or Stop(StopReason.FAILED, "", True)
        if self.stop is None:
            phase = RunPhase.RUNNING
        elif stop.reason is StopReason.GOAL_MET:
            phase = RunPhase.SUCCEEDED
        elif stop.is_resumable:
            phase = RunPhase.STOPPED
        else:
            phase = RunPhase.FAILED
        return Outcome(
            self.tenant,
            self.run,
            phase,
            stop,
            self.iteration,
            self.usage,
            self.unknown,
            self.pending,
            self.answer,
            self.late,
        )

    def with_late(self, late: Sequence[LateResult]) -> RunState:
        """The state that also remembers ``late`` (keeping the newest ``LATE_KEPT``)."""
        return self.but(late=(*self.late, *late)[-LATE_KEPT:]) if late else self

    def to_json(self) -> dict[str, Any]:
        # The document opens with its format and the run it belongs to (the spec's tenant and
        # run, repeated for readers), then the fields, as every release has written it.
        return {"version": VERSION, "tenant": self.tenant, "run": self.run, **super().to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """A checkpoint document of any format this code reads (see ``upgraded``)."""
        return super().from_json(upgraded(data))


_FIELDS = frozenset(f.name for f in fields(RunState))


def _spec_without_store(data: dict[str, Any]) -> dict[str, Any]:
    """1 -> 2: the spec no longer carries the store URL. Where a run is stored is the runner's
    setting, and the URL may hold a password that has no business in a checkpoint."""
    spec = {k: v for k, v in data["spec"].items() if k != "store"}
    return {**data, "spec": spec}


def _decisions_per_action(data: dict[str, Any]) -> dict[str, Any]:
    """2 -> 3: an action needing approval keeps every decision made on it (several people may
    have to approve), not the one decision it had."""
    approvals = data.get("approvals") or {}
    return {**data, "approvals": {action: [decided] for action, decided in approvals.items()}}


# Format N -> N+1 for every N below VERSION, applied in order to an older checkpoint.
UPGRADES: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _spec_without_store,
    2: _decisions_per_action,
}
assert sorted(UPGRADES) == list(range(1, VERSION))


def upgraded(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A checkpoint document in this code's format: as it is if current, else brought up step
    by step. Refuses, in one line, a document with no format version or a newer one."""
    version = data.get("version")
    run = data.get("run")
    if type(version) is not int or version < 1:
        raise StoreError(f"checkpoint of run {run!r}: no checkpoint format version ({version!r})")
    if version > VERSION:
        raise StoreError(
            f"checkpoint of run {run!r} is format {version}, newer than this Keelgate reads "
            f"({VERSION}): resume it with the newer Keelgate that wrote it"
        )
    while version < VERSION:
        data = {**UPGRADES[version](dict(data)), "version": version + 1}
        version += 1
    return data


def planned_actions(document: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Action id -> the action's JSON, for the actions of the current plan in a checkpoint
    document (a ``RunState``'s JSON), read as they are, without validating the rest: for the
    readers that show or send them (the inbox, the notifier), which redact their arguments
    first."""
    plan = document.get("plan") or {}
    iteration = plan.get("iteration")
    found: dict[str, Mapping[str, Any]] = {}
    for index, action in enumerate(plan.get("actions") or ()):
        if isinstance(action, Mapping):
            ident = str(action.get("id") or action.get("action") or f"{iteration}:{index}")
            found[ident] = action
    return found


def planned_arguments(document: Mapping[str, Any]) -> dict[str, Any]:
    """Action id -> recorded arguments, for the actions of a checkpoint document's current plan
    (as ``planned_actions`` reads them)."""
    return {ident: a.get("args") or {} for ident, a in planned_actions(document).items()}
