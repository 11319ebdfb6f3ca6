"""Values the loop, its stores and its users exchange: enums and frozen dataclasses.

They exist so that every floor speaks the same exact strings (the stop reasons, the side-effect
classes) and the same JSON. Nothing here performs I/O or holds mutable state.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

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


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for hashing: sorted keys, no spaces, no NaN."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


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


@dataclass(frozen=True)
class Usage:
    """What a run has consumed so far. Dollars are exact decimals, never floats."""

    input_tokens: int = 0
    output_tokens: int = 0
    dollars: Decimal = Decimal(0)
    active_seconds: float = 0.0

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

    def to_json(self) -> dict[str, Any]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "dollars": str(self.dollars),
            "activeSeconds": round(self.active_seconds, 3),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        return cls(
            input_tokens=int(data.get("inputTokens", 0)),
            output_tokens=int(data.get("outputTokens", 0)),
            dollars=Decimal(str(data.get("dollars", "0"))),
            active_seconds=float(data.get("activeSeconds", 0.0)),
        )


@dataclass(frozen=True)
class Stop:
    reason: StopReason
    message: str = ""
    resumable: bool | None = None

    @property
    def is_resumable(self) -> bool:
        return self.reason.resumable if self.resumable is None else self.resumable

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "message": self.message,
            "resumable": self.is_resumable,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stop:
        return cls(
            StopReason(data["reason"]), str(data.get("message", "")), bool(data["resumable"])
        )


_STRICTNESS = {SideEffect.READ: 0, SideEffect.PROPOSE: 1, SideEffect.WRITE: 2}


def stricter(a: SideEffect, b: SideEffect | None) -> SideEffect:
    """The stricter of two side-effect classes (WRITE > PROPOSE > READ)."""
    if b is None:
        return a
    return a if _STRICTNESS[a] >= _STRICTNESS[b] else b


@dataclass(frozen=True)
class Action:
    """One planned tool call, saved before it runs (write-ahead).

    ``side_effect`` and ``requires_approval`` are the tool's as it was when planned: a manifest
    edited later can make them stricter, never looser, so a saved WRITE cannot be downgraded to
    an unguarded READ, nor run without the approval it was planned under.
    """

    id: str
    tool: str
    args: Mapping[str, Any]
    key: str
    side_effect: SideEffect | None = None
    requires_approval: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "tool": self.tool,
            "args": dict(self.args),
            "key": self.key,
        }
        if self.side_effect is not None:
            data["sideEffect"] = self.side_effect.value
        if self.requires_approval:
            data["requiresApproval"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Action:
        side_effect = data.get("sideEffect")
        return cls(
            str(data["id"]),
            str(data["tool"]),
            dict(data["args"]),
            str(data["key"]),
            None if side_effect is None else SideEffect(side_effect),
            bool(data.get("requiresApproval", False)),
        )


class ResultStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    REFUSED = "refused"
    DENIED = "denied"
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class ActionResult:
    """What one action came to, as the model will see it."""

    action: str
    status: ResultStatus
    output: Any = None
    error: str = ""
    replayed: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"action": self.action, "status": self.status.value}
        if self.output is not None:
            data["output"] = self.output
        if self.error:
            data["error"] = self.error
        if self.replayed:
            data["replayed"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionResult:
        return cls(
            str(data["action"]),
            ResultStatus(data["status"]),
            data.get("output"),
            str(data.get("error", "")),
            bool(data.get("replayed", False)),
        )


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
class UnknownAction:
    """A WRITE whose outcome nobody knows: a person or a confirmer must settle it."""

    action: str
    tool: str
    idempotency_key: str

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "tool": self.tool, "idempotencyKey": self.idempotency_key}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnknownAction:
        return cls(str(data["action"]), str(data["tool"]), str(data["idempotencyKey"]))


@dataclass(frozen=True)
class PendingApproval:
    action: str
    tool: str

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "tool": self.tool}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PendingApproval:
        return cls(str(data["action"]), str(data["tool"]))


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

    @property
    def resumable(self) -> bool:
        return self.stop.is_resumable

    def to_json(self) -> dict[str, Any]:
        """The contract's ``--output json`` object."""
        return {
            "run": self.run,
            "phase": self.phase.value,
            "stopReason": "" if self.phase is RunPhase.RUNNING else self.stop.reason.value,
            "resumable": self.resumable,
            "iteration": self.iteration,
            "usage": self.usage.to_json(),
            "unknownActions": [u.to_json() for u in self.unknown_actions],
            "pendingApprovals": [p.to_json() for p in self.pending_approvals],
            "answer": self.answer,
            "message": self.stop.message,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, tenant: str) -> Outcome:
        """The inverse of ``to_json`` (which leaves out the tenant): an outcome that crossed a
        process boundary, e.g. back from a Temporal worker."""
        reason = str(data.get("stopReason") or "")
        answer = data.get("answer")
        return cls(
            tenant,
            str(data["run"]),
            RunPhase(data["phase"]),
            # No stop recorded reads as a resumable "failed" placeholder, as RunState.outcome().
            Stop(
                StopReason(reason or StopReason.FAILED.value),
                str(data.get("message") or ""),
                bool(data["resumable"]),
            ),
            int(data.get("iteration", 0)),
            Usage.from_json(data.get("usage") or {}),
            tuple(UnknownAction.from_json(u) for u in data.get("unknownActions") or ()),
            tuple(PendingApproval.from_json(p) for p in data.get("pendingApprovals") or ()),
            None if answer is None else str(answer),
        )
