"""What the Temporal runner's client, workflow and workers agree on: the names of the workflow,
its activities and updates, and the plain data that crosses the wire.

Temporal's history keeps every input and result, so only plain data travels (a spec's JSON,
prices as strings, decisions); never a store URL, which is the worker's own setting. A worker
of another version must keep these names. Pure: nothing here talks to Temporal or a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Plain data, shared with the sandbox as it is (see worker.sandbox).
    from keelgate.core.spec import Price
    from keelgate.core.types import Outcome

#: The names workers and clients agree on (a worker of another version must keep them).
WORKFLOW = "keelgate.run"
DRIVE = "keelgate.drive"
RECONCILE = "keelgate.reconcile"
APPROVE = "keelgate.approve"
RAISE_BUDGET = "keelgate.raise_budget"
NEXT_STOP = "next_stop"
STATUS = "status"

#: The ApplicationError type of a ``failed`` stop; its details hold the outcome.
RUN_FAILED = "RunFailed"
#: The ApplicationError type of an exception Keelgate did not raise on purpose.
INTERNAL = "InternalError"

#: What a missing SDK says, wherever the Temporal commands are used without the extra.
NEEDS_EXTRA = "needs the temporal extra: pip install 'keelgate[temporal]'"


def workflow_id(tenant: str, run: str) -> str:
    """One workflow per run: the id is the run's name, so starting it twice finds the first."""
    return f"keelgate/{tenant}/{run}"


@dataclass
class Settings:
    """How the workflow schedules its activities; chosen by whoever starts the run."""

    #: A worker that sends no heartbeat for this long is taken as dead and its attempt retried.
    heartbeat_timeout: float = 5.0
    #: Attempts of one drive (a dead worker's included) before the workflow stops trying and
    #: waits for ``resume``; decisions get the same number.
    max_attempts: int = 10
    #: The longest one attempt may take, however healthy (Temporal needs a bound).
    activity_timeout: float = 24 * 3600.0
    #: First wait before a retry; doubled each time up to ``max_retry_interval``.
    retry_interval: float = 1.0
    max_retry_interval: float = 30.0


@dataclass
class RunRequest:
    """The workflow's input: the run's spec (``LoopSpec.to_json()``), prices by model name
    (``Price.to_json()``, for manifests without ``spec.pricing``) and the settings."""

    spec: dict[str, Any]
    pricing: dict[str, dict[str, str]] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)


@dataclass
class DriveRequest:
    spec: dict[str, Any]
    pricing: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class ReconcileRequest:
    """Settle an unknown outcome: ``executed`` records it done, else it is abandoned."""

    action: str
    executed: bool
    by: str
    tenant: str = ""  # filled in by the workflow
    run: str = ""


@dataclass
class ApproveRequest:
    action: str
    approved: bool
    by: str
    tenant: str = ""
    run: str = ""
    # The groups the person deciding is in (an approval rule may count only some groups).
    groups: list[str] = field(default_factory=list)


@dataclass
class ResumeRequest:
    """New budget totals (unset: kept) and prices; none of them: just try again."""

    tokens: int | None = None
    dollars: str | None = None
    max_iterations: int | None = None
    timeout_seconds: float | None = None
    max_verifier_rejections: int | None = None
    pricing: dict[str, dict[str, str]] = field(default_factory=dict)
    tenant: str = ""
    run: str = ""

    def raises(self) -> bool:
        return any(
            value is not None
            for value in (
                self.tokens,
                self.dollars,
                self.max_iterations,
                self.timeout_seconds,
                self.max_verifier_rejections,
            )
        )


@dataclass
class WaitRequest:
    """Wait for a stop counted after ``after`` (-1: the current one, or the one under way),
    at most ``seconds``: a client asks again rather than hold one call open for a long run."""

    after: int = -1
    seconds: float = 15.0


def outcome_to_wire(outcome: Outcome) -> dict[str, Any]:
    """The contract's JSON outcome plus the tenant it leaves out."""
    return {"tenant": outcome.tenant, **outcome.to_json()}


def outcome_from_wire(data: Mapping[str, Any]) -> Outcome:
    return Outcome.from_json(data, tenant=str(data["tenant"]))


def pricing_from_wire(data: Mapping[str, Mapping[str, str]]) -> dict[str, Price]:
    return {name: Price.from_json(price) for name, price in data.items()}


def pricing_to_wire(pricing: Mapping[str, Price] | None) -> dict[str, dict[str, str]]:
    return {name: price.to_json() for name, price in (pricing or {}).items()}
