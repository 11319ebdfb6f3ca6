"""Values the loop, its stores and its users exchange: enums and frozen dataclasses.

They exist so that every floor speaks the same exact strings (the stop reasons, the side-effect
classes) and the same JSON: each value's fields are its JSON (``keelgate.core.json_codec``), and
``RunStatus`` is the one shape of where a run stands, which the manifest's AgentRun status
extends. Nothing here performs I/O or holds mutable state.

Why one module past 500 lines: it is the vocabulary every floor shares, and its values refer to
each other (a ``RunStatus`` holds ``PendingApproval`` values, which hold an ``ApprovalRule``; a
``KeyRecord`` its ``KeyState``); kept together they read as one glossary, imported from one
place, with no cycle between modules of it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
)

from keelgate.core.json_codec import OMIT_EMPTY, OMIT_NONE, WIRE, JsonValue
from keelgate.core.values import (
    ActionId,
    Dollars,
    GroupName,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveCount,
    PositiveSeconds,
)
from keelgate.errors import SettleError


class SideEffect(StrEnum):
    """What a tool may do to the world. READ is free to repeat; PROPOSE and WRITE are not."""

    READ = "READ"
    PROPOSE = "PROPOSE"
    WRITE = "WRITE"


class LoopKind(StrEnum):
    TASK = "task"
    VERIFICATION = "verification"
    MONITOR = "monitor"

    @property
    def default_side_effects(self) -> frozenset[SideEffect]:
        """Verification and monitor loops only read unless told otherwise."""
        if self is LoopKind.TASK:
            return frozenset(SideEffect)
        return frozenset({SideEffect.READ})


class StopReason(StrEnum):
    """Why a run stopped. The strings are part of the public contract."""

    GOAL_MET = "goal_met"
    MAX_ITERATIONS = "max_iterations"
    TOKEN_BUDGET = "token_budget"
    DOLLAR_BUDGET = "dollar_budget"
    TIMEOUT = "timeout"
    VERIFIER_REJECTIONS = "verifier_rejections"
    COST_UNKNOWN = "cost_unknown"
    OUTCOME_UNKNOWN = "outcome_unknown"
    AWAITING_APPROVAL = "awaiting_approval"
    FAILED = "failed"

    @property
    def resumable(self) -> bool:
        """Budget stops and waits for a person resume; the verifier limit only once raised."""
        return self not in (
            StopReason.GOAL_MET,
            StopReason.FAILED,
            StopReason.VERIFIER_REJECTIONS,
        )


if TYPE_CHECKING:
    StopReasonName = str
else:
    #: A stop reason's string, or "" before any stop: what ``status.stopReason`` may hold.
    StopReasonName = Literal[("", *(reason.value for reason in StopReason))]


class RunPhase(StrEnum):
    """The Kubernetes-style phase of a run, as ``status.phase`` shows it."""

    PENDING = "Pending"
    RUNNING = "Running"
    STOPPED = "Stopped"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class KeyState(StrEnum):
    """The state of an idempotency key. OUTCOME_UNKNOWN is read, never written: it is an
    in-flight key whose owner is gone."""

    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    OUTCOME_UNKNOWN = "outcome_unknown"


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


# One encoder for every call: ``json.dumps`` with these options builds a new one each time,
# which costs more than encoding a small event (verifying a long audit chain does it per event).
# An encoder keeps no state between calls, so sharing it between threads is safe.
_CANONICAL = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,
    default=_json_default,
)


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for hashing: sorted keys, no spaces, no NaN."""
    return _CANONICAL.encode(value)


def json_safe(value: Any, *, _depth: int = 0) -> Any:
    """A tool's output as strict JSON can hold it, so it can always be saved and replayed.

    Non-finite floats become null, mapping keys strings, tuples lists, and anything else that
    is not JSON (a datetime, a Decimal, an object) its ``str``. A tool is told nothing; the
    model sees the safe form.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if _depth > 64:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, _depth=_depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, _depth=_depth + 1) for v in value]
    return str(value)


def idempotency_key(tenant: str, run: str, tool: str, args: Mapping[str, Any]) -> str:
    """Derive a WRITE's key from what it does: the same call in the same run gets the same key."""
    digest = hashlib.sha256(canonical_json([tenant, run, tool, args]).encode()).hexdigest()
    return f"kg-{digest[:40]}"


def _to_the_millisecond(seconds: float) -> float:
    # Finer is noise, and a checkpoint should not change for it.
    return round(seconds, 3)


@dataclass(frozen=True)
class Usage(JsonValue):
    """What a run has consumed so far. Dollars are exact decimals, never floats."""

    input_tokens: Annotated[NonNegativeInt, Field(description="Input tokens used.")] = 0
    output_tokens: Annotated[NonNegativeInt, Field(description="Output tokens used.")] = 0
    dollars: Annotated[Dollars, Field(description="Dollars spent.")] = Decimal(0)
    active_seconds: Annotated[
        NonNegativeFloat,
        PlainSerializer(_to_the_millisecond),
        Field(description="Active time, in seconds."),
    ] = 0.0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            dollars=self.dollars + other.dollars,
            active_seconds=self.active_seconds + other.active_seconds,
        )


@dataclass(frozen=True)
class Stop(JsonValue):
    reason: StopReason
    message: str = ""
    resumable: bool | None = None

    @property
    def is_resumable(self) -> bool:
        return self.reason.resumable if self.resumable is None else self.resumable

    def __post_init__(self) -> None:
        # Decided once, from the reason's own rule when not given: the stop's JSON then says
        # whether it is resumable, and a reader never needs the rule to know.
        if self.resumable is None:
            object.__setattr__(self, "resumable", self.reason.resumable)


_STRICTNESS = {SideEffect.READ: 0, SideEffect.PROPOSE: 1, SideEffect.WRITE: 2}


def stricter(a: SideEffect, b: SideEffect | None) -> SideEffect:
    """The stricter of two side-effect classes (WRITE > PROPOSE > READ)."""
    if b is None:
        return a
    return a if _STRICTNESS[a] >= _STRICTNESS[b] else b


@dataclass(frozen=True)
class ApprovalRule(JsonValue):
    """Who must say yes before an action runs, and for how long a yes holds.

    ``requiresApproval: true`` is the rule with every field at its default: one approval, by
    anyone who may decide, that never expires. A rule is saved with each planned action, and
    the rule in force when the action would run is combined with it (``stricter``): an edited
    manifest can add a question, never remove one or lower a count.
    """

    required: Annotated[
        PositiveCount, Field(description="Approvals needed, each by a different person.")
    ] = 1
    groups: Annotated[
        tuple[GroupName, ...],
        OMIT_EMPTY,
        Field(
            description="A person counts only if the API server authenticated them in one of "
            "these groups (empty: anyone who may decide)."
        ),
    ] = ()
    not_creator: Annotated[
        bool,
        OMIT_EMPTY,
        Field(description="The person who created the run cannot approve it (they may deny)."),
    ] = False
    expires_after: Annotated[
        PositiveSeconds | None,
        OMIT_NONE,
        Field(
            description="Seconds an approval counts for: one given longer ago when the call "
            "would run is asked for again."
        ),
    ] = None
    also_groups: Annotated[
        tuple[tuple[GroupName, ...], ...],
        OMIT_EMPTY,
        Field(
            description="Further lists of groups, each of which a person must also be in (a "
            "rule combined with a stricter one keeps both lists)."
        ),
    ] = ()
    service_accounts: Annotated[
        bool,
        OMIT_EMPTY,
        Field(
            description="ServiceAccounts may decide too (by default only people do: a "
            "ServiceAccount is anyone who holds its token or may impersonate it)."
        ),
    ] = False
    reason_to_deny: Annotated[
        bool,
        OMIT_EMPTY,
        Field(description="A deny must say why (its note): one with no reason is refused."),
    ] = False

    def stricter(self, other: ApprovalRule | None) -> ApprovalRule:
        """The rule asking what both ask: the higher count, the shorter expiry, not the
        creator if either says so, each rule's groups, ServiceAccounts only if both let them,
        a reason to deny if either asks one."""
        if other is None or other == self:
            return self
        lists: list[tuple[str, ...]] = []
        for found in (*self.group_lists(), *other.group_lists()):
            if found not in lists:
                lists.append(found)
        expiries = [e for e in (self.expires_after, other.expires_after) if e is not None]
        return ApprovalRule(
            required=max(self.required, other.required),
            groups=lists[0] if lists else (),
            not_creator=self.not_creator or other.not_creator,
            expires_after=min(expiries) if expiries else None,
            also_groups=tuple(lists[1:]),
            service_accounts=self.service_accounts and other.service_accounts,
            reason_to_deny=self.reason_to_deny or other.reason_to_deny,
        )

    def group_lists(self) -> tuple[tuple[str, ...], ...]:
        """Every list of groups a person must be in one of (none: anyone)."""
        lists = (self.groups, *self.also_groups)
        return tuple(tuple(sorted(set(g))) for g in lists if g)

    def admits(self, groups: Collection[str]) -> bool:
        """Whether a person the API server authenticated in ``groups`` may decide."""
        return all(any(g in groups for g in each) for each in self.group_lists())

    def describe(self) -> str:
        """The rule in words: "2 approvals from payments-approvers, not the run's creator,
        each counting for 1h"."""
        count = f"{self.required} approval{'s' if self.required != 1 else ''}"
        lists = self.group_lists()
        if lists:
            count += " from " + " and from ".join(" or ".join(each) for each in lists)
        parts = [count]
        if self.not_creator:
            parts.append("not the run's creator")
        if self.expires_after is not None:
            each = "each " if self.required != 1 else ""
            parts.append(f"{each}counting for {format_seconds(self.expires_after)}")
        if self.service_accounts:
            parts.append("ServiceAccounts counting")
        if self.reason_to_deny:
            parts.append("a deny with its reason")
        return ", ".join(parts)


def format_seconds(seconds: float) -> str:
    """A duration as people write it: 90 -> 1m30s, 3600 -> 1h, 0.5 -> 0.5s."""
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


@dataclass(frozen=True)
class Action(JsonValue):
    """One planned tool call, saved before it runs (write-ahead).

    ``side_effect`` and ``requires_approval`` are the tool's as it was when planned: a manifest
    edited later can make them stricter, never looser, so a saved WRITE cannot be downgraded to
    an unguarded READ, nor run without the approval it was planned under.
    """

    id: str
    tool: str
    args: Mapping[str, Any]
    key: str
    side_effect: Annotated[SideEffect | None, OMIT_NONE] = None
    requires_approval: Annotated[bool, OMIT_EMPTY] = False
    # The tool's approval rule when planned, when it said more than "one approval" (a count,
    # groups, not the creator, an expiry); ``requires_approval`` is then true too, so a reader
    # that predates rules still asks for one.
    approval: Annotated[ApprovalRule | None, OMIT_NONE] = None
    # What decides the call's effect, as digests of the tool's definition (``core.calls``): the
    # definition the call is bound to. Set when planned; bound again to the tool's definition
    # now only while no call of it is on record (a manifest edit, which voids its approvals).
    # Empty for an action saved before definitions were (it is bound at its first look).
    definition: Annotated[Mapping[str, str], OMIT_EMPTY] = field(default_factory=dict)

    def approval_rule(self) -> ApprovalRule | None:
        """The approval rule the action was planned under (None: it needed none)."""
        if self.approval is not None:
            return self.approval
        return ApprovalRule() if self.requires_approval else None


class ResultStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    REFUSED = "refused"
    DENIED = "denied"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class ActionResult(JsonValue):
    """What one action came to, as the model will see it."""

    action: str
    status: ResultStatus
    output: Annotated[Any, OMIT_NONE] = None
    error: Annotated[str, OMIT_EMPTY] = ""
    replayed: Annotated[bool, OMIT_EMPTY] = False


@dataclass(frozen=True)
class KeyRecord:
    """An idempotency key as a store holds it (state already resolved for owner liveness)."""

    tenant: str
    key: str
    run: str
    action: str
    tool: str
    state: KeyState
    result: Any = None
    settled_by: str = ""
    source: str = ""
    # The claim's write deadline, in seconds since the epoch on the store's own clock (None for
    # a key claimed before deadlines were recorded), and how many seconds of it were left when
    # the record was read (negative once passed). Until it has passed the call may still be
    # sent by a process that was held up, so the key cannot be settled as not executed.
    deadline: float | None = None
    deadline_in: float | None = None
    # In flight, claimed by the very store that read it: its call runs in this process (a
    # timed-out call still running, another thread's), not in another one.
    here: bool = False

    @property
    def sendable(self) -> bool:
        """Whether the claim's call may still be sent (its deadline has not passed)."""
        return self.deadline_in is not None and self.deadline_in > 0

    @property
    def not_executed_after(self) -> str:
        """When a settlement "not executed" becomes possible, as UTC ISO 8601 ("" if now)."""
        if not self.sendable or self.deadline is None:
            return ""
        return utc_iso(self.deadline)


def utc_iso(seconds: float) -> str:
    """Seconds since the epoch as UTC ISO 8601 to the second, rounded up (a moment not to act
    before must not be shown earlier than it is)."""
    import datetime as dt

    moment = dt.datetime.fromtimestamp(math.ceil(seconds), tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def settled_state(record: KeyRecord, *, executed: bool) -> KeyState:
    """The state an unknown outcome settles to; any other key is refused in plain words, so a
    decision can never be changed and a live call never pre-empted."""
    if record.state is KeyState.OUTCOME_UNKNOWN:
        return KeyState.COMPLETED if executed else KeyState.ABANDONED
    who = f" by {record.settled_by}" if record.settled_by else ""
    reason = {
        KeyState.COMPLETED: f"already settled as executed{who}"
        if record.source
        else "it completed: there is nothing to settle",
        KeyState.ABANDONED: f"already settled as not executed{who}",
        KeyState.IN_FLIGHT: "still in flight in a live process: wait for it to end",
    }[record.state]
    raise SettleError(record.run, record.action, reason)


@dataclass(frozen=True)
class UnknownAction(JsonValue):
    """A WRITE whose outcome nobody knows: a person or a confirmer must settle it."""

    action: Annotated[ActionId, Field(description="The action's id within the run.")]
    tool: Annotated[str, Field(description="The tool.")]
    idempotency_key: Annotated[str, Field(description="The key the call carried downstream.")]
    not_executed_after: Annotated[
        str,
        OMIT_EMPTY,
        Field(
            description="Until this moment (UTC, on the store's clock) a held-up process may "
            "still send the call, so it can be settled as executed but not yet as not executed."
        ),
    ] = ""


@dataclass(frozen=True)
class LateResult(JsonValue):
    """A call that ended after its key had been settled by someone else: their record stands,
    and this says what really came, so a person can look again."""

    action: Annotated[ActionId, Field(description="The action's id within the run.")]
    tool: Annotated[str, Field(description="The tool.")]
    idempotency_key: Annotated[str, Field(description="The key the call carried downstream.")]
    status: Annotated[
        str,
        Field(description="How the call ended: ok (it took effect), refused, or unknown."),
    ]
    recorded: Annotated[
        str, Field(description="What the key records, by the settlement: completed, abandoned.")
    ]
    settled_by: Annotated[str, OMIT_EMPTY, Field(description="Who settled the key.")] = ""


#: How many late results a run keeps (the newest); the audit chain keeps every one.
LATE_KEPT = 10


@dataclass(frozen=True)
class PendingApproval(JsonValue):
    """An action that waits for a person's yes or no before it runs."""

    action: Annotated[ActionId, Field(description="The action's id within the run.")]
    tool: Annotated[str, Field(description="The tool.")]
    rule: Annotated[
        ApprovalRule | None,
        OMIT_NONE,
        Field(description="Who must approve, when it asks more than one approval by anyone."),
    ] = None
    approvals: Annotated[
        NonNegativeInt,
        OMIT_EMPTY,
        Field(description="Approvals that count now (each by a different person)."),
    ] = 0
    approved_by: Annotated[
        tuple[str, ...], OMIT_EMPTY, Field(description="Who gave the approvals that count.")
    ] = ()
    expires_at: Annotated[
        str,
        OMIT_EMPTY,
        Field(
            description="When the first approval that counts stops counting (UTC), unless the "
            "call has run by then."
        ),
    ] = ""
    definition: Annotated[
        str,
        OMIT_EMPTY,
        Field(
            description="The fingerprint of the tool's definition the call is bound to (its "
            "method, URL, headers' names, server, callable, confirmer): approvals count for "
            "this definition only, and an edit that changes it asks again."
        ),
    ] = ""
    round: Annotated[
        NonNegativeInt,
        Field(
            ge=1,
            exclude_if=lambda r: r == 1,
            description="The round it is asked in: 1, then one more each time it is asked "
            "afresh (every approval stopped counting before the call ran): each round has its "
            "own Approval (named with -r<round> past the first), and no decision of an earlier "
            "round counts.",
        ),
    ] = 1

    @property
    def required(self) -> int:
        """How many approvals the action needs (each by a different person)."""
        return 1 if self.rule is None else self.rule.required

    def tally(self) -> str:
        """ "1 of 2": the approvals that count, of those needed."""
        return f"{self.approvals} of {self.required}"


def _nothing(value: Any) -> bool:
    return not value


class RunStatus(BaseModel):
    """Where a run stands, as users and tools read it: ``keelgate ... --output json`` (with the
    run's name), a step pod's last line, and an AgentRun's ``status``, which extends this shape
    with what only the operator knows (``keelgate.manifest.AgentRunStatus``).

    A pydantic model rather than a dataclass so that the manifest can extend it, and its CRD
    schema be generated from it: each field says what it means. It is made only at the edges
    (an outcome shown, a status written), never on the loop's path.
    """

    # Built on first use, not at import: every process that imports this module (a step pod
    # before it reads its checkpoint) would otherwise pay for this model's validator.
    model_config = ConfigDict(**WIRE, frozen=True, extra="ignore", defer_build=True)

    phase: RunPhase = Field(
        default=RunPhase.PENDING, description="Pending | Running | Stopped | Succeeded | Failed."
    )
    stop_reason: StopReasonName = Field(default="", description="Why the run stopped.")
    message: str = Field(default="", description="The stop, in words.")
    resumable: StrictBool = Field(default=False, description="Whether the stop can be resumed.")
    iteration: NonNegativeInt = Field(default=0, description="Planning iterations so far.")
    usage: Usage = Field(default_factory=Usage, description="What the run consumed.")
    unknown_actions: tuple[UnknownAction, ...] = Field(
        default_factory=tuple, description="WRITEs whose outcome a person must reconcile."
    )
    pending_approvals: tuple[PendingApproval, ...] = Field(
        default_factory=tuple, description="Actions waiting for an Approval."
    )
    answer: str | None = Field(default=None, description="The final answer, once the goal is met.")
    late_results: tuple[LateResult, ...] = Field(
        default_factory=tuple,
        exclude_if=_nothing,
        description="Calls that ended after someone else had settled their keys: the "
        "settlement stands; look again at what really happened (the newest 10).",
    )

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class Outcome:
    """Where a run stands after ``run_or_resume`` returned: always a stop, never an exception."""

    tenant: str
    run: str
    phase: RunPhase
    stop: Stop
    iteration: int
    usage: Usage
    unknown_actions: tuple[UnknownAction, ...] = ()
    pending_approvals: tuple[PendingApproval, ...] = ()
    answer: str | None = None
    late_results: tuple[LateResult, ...] = ()

    @property
    def resumable(self) -> bool:
        return self.stop.is_resumable

    def status(self) -> RunStatus:
        """The outcome in the shape users and tools read (no stop reason while it runs)."""
        return RunStatus(
            phase=self.phase,
            stop_reason="" if self.phase is RunPhase.RUNNING else self.stop.reason.value,
            message=self.stop.message,
            resumable=self.resumable,
            iteration=self.iteration,
            usage=self.usage,
            unknown_actions=self.unknown_actions,
            pending_approvals=self.pending_approvals,
            answer=self.answer,
            late_results=self.late_results,
        )

    def to_json(self) -> dict[str, Any]:
        """The contract's ``--output json`` object: the run's name and its status."""
        return {"run": self.run, **self.status().to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, tenant: str) -> Outcome:
        """The inverse of ``to_json`` (which leaves out the tenant): an outcome that crossed a
        process boundary, e.g. back from a Temporal worker."""
        status = RunStatus.model_validate(data)
        return cls(
            tenant,
            str(data["run"]),
            status.phase,
            # No stop recorded reads as a resumable "failed" placeholder, as RunState.outcome().
            Stop(
                StopReason(status.stop_reason or StopReason.FAILED.value),
                status.message,
                status.resumable,
            ),
            status.iteration,
            status.usage,
            status.unknown_actions,
            status.pending_approvals,
            status.answer,
            status.late_results,
        )
