"""The Temporal runner: a run as a workflow, each stretch of it as an activity (ADR-0004).

Users who already run Temporal get their agent loop inside a workflow, with Temporal's retries
and its history, without giving up Keelgate's promise. Temporal alone runs an activity at least
once: a worker that dies mid-activity gets the activity again on another worker, side effects
included. What makes that safe here is the loop, not Temporal: every attempt calls
``Loop.run_or_resume``, which loads the checkpoint, replays completed WRITEs from their durable
keys, and stops with ``outcome_unknown`` at a WRITE whose process died mid-call. So a retry
continues exactly where the dead attempt stopped and never repeats a WRITE.

The pieces:

- ``RunWorkflow`` (``keelgate.run``): deterministic; holds the spec as plain data, drives the
  run with the ``keelgate.drive`` activity, and between stops waits for updates: ``reconcile``,
  ``approve``, ``resume`` (raise budgets) and ``next_stop`` (wait for the run's next stop). It
  never touches a store; each decision is an activity calling the same ``Loop`` methods as the
  CLI, run one at a time with the drives, so one workflow is its run's only driver.
- ``Activities``: what a worker runs against its store. A resumable stop (budget, unknown
  outcome, approval) is a normal result, never an error, so Temporal does not retry it; a
  ``failed`` stop is a non-retryable ``ApplicationError``; Keelgate's own errors keep their
  ``retryable`` flag. A drive heartbeats while the loop runs in a thread, so a dead worker is
  noticed within the heartbeat timeout and its attempt retried elsewhere.
- ``TemporalRunner``: the client side, the ``LoopRunner`` seam over the same ``LoopSpec``.
- ``serve``: a worker process (``keelgate temporal-worker``).

This module must never be imported by the core, the stores, the adapters, the operator or a step
pod (the import-linter contracts say so), never put a store URL into a workflow's input (it is
the worker's setting, and Temporal's history keeps every input), never retry a decision that was
refused, and never interrupt a loop mid-call: a drive whose attempt was cancelled still runs to
its next checkpointed stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

from temporalio import activity, workflow
from temporalio.common import RetryPolicy, WorkflowIDConflictPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    # Plain data and pure functions, shared with the worker's activities as they are: the
    # workflow sandbox need not re-import them (nor the drivers the runners pull in).
    from keelgate.core.loop import Loop, check_actor
    from keelgate.core.protocols import Confirmer, Stores
    from keelgate.core.spec import INT64_MAX, LoopSpec, Price
    from keelgate.core.types import KeyRecord, KeyState, LoopKind, Outcome, RunPhase, StopReason
    from keelgate.errors import (
        InputError,
        KeelgateError,
        RemoteError,
        SettleError,
        TemporalUnavailable,
    )
    from keelgate.manifest import spec_from_manifest
    from keelgate.runners.local import LocalRunner, resumed_spec
    from keelgate.stores import open_stores, scrubbed

T = TypeVar("T")

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


# What crosses the wire: plain data only (Temporal's history keeps all of it).


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


def _pricing_from_wire(data: Mapping[str, Mapping[str, str]]) -> dict[str, Price]:
    return {name: Price.from_json(price) for name, price in data.items()}


def pricing_to_wire(pricing: Mapping[str, Price] | None) -> dict[str, dict[str, str]]:
    return {name: price.to_json() for name, price in (pricing or {}).items()}


# The worker's side: activities over the worker's store.


class Activities:
    """The activities a worker runs, each against the worker's own store.

    Each call opens the store and closes it again, as every runner does: a worker keeps no
    run's state between calls, and closing is what lets a later attempt read a key this
    attempt left in flight as unknown. The loop runs in a thread of this worker, the activity
    heartbeating meanwhile.
    """

    def __init__(
        self,
        *,
        store: str,
        confirmer: Confirmer | None = None,
        threads: int = 8,
    ) -> None:
        self.store = store
        self.confirmer = confirmer
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="keelgate-run")

    def close(self) -> None:
        self._threads.shutdown(wait=True)

    @activity.defn(name=DRIVE)
    async def drive(self, request: DriveRequest) -> dict[str, Any]:
        """Drive the run to its next stop; a stop that needs a person or a budget is a result."""
        outcome = await _in_thread(self._threads, self._drive, request)
        if outcome.stop.reason is StopReason.FAILED and outcome.phase is RunPhase.FAILED:
            # Failed for good: retrying would fail the same way.
            raise ApplicationError(
                f"run {outcome.run!r} failed: {outcome.stop.message}",
                outcome_to_wire(outcome),
                type=RUN_FAILED,
                non_retryable=True,
            )
        return outcome_to_wire(outcome)

    def _drive(self, request: DriveRequest) -> Outcome:
        spec = LoopSpec.from_json(request.spec)
        _import_path(spec.source_dir)
        runner = LocalRunner(
            store=self.store,
            confirmer=self.confirmer,
            pricing=_pricing_from_wire(request.pricing),
        )
        return runner.run(spec)

    @activity.defn(name=RECONCILE)
    async def reconcile(self, request: ReconcileRequest) -> dict[str, Any]:
        """``Loop.reconcile``, as ``keelgate reconcile`` calls it."""
        return await _in_thread(self._threads, self._reconcile, request)

    def _reconcile(self, request: ReconcileRequest) -> dict[str, Any]:
        with self._stores() as stores:
            loop = Loop(stores=stores)
            try:
                record = loop.reconcile(
                    request.tenant,
                    request.run,
                    request.action,
                    executed=request.executed,
                    by=request.by,
                )
                repeated = False
            except SettleError as refused:
                # A retried attempt whose first settled the key and died: the same decision by
                # the same person is done, not refused.
                record = _same_settlement(loop, request, refused)
                repeated = True
        return {
            "run": request.run,
            "action": request.action,
            "tool": record.tool,
            "verdict": "executed" if request.executed else "abandoned",
            "by": request.by,
            "repeated": repeated,
        }

    @activity.defn(name=APPROVE)
    async def approve(self, request: ApproveRequest) -> dict[str, Any]:
        """``Loop.approve``, as ``keelgate approve`` calls it."""
        return await _in_thread(self._threads, self._approve, request)

    def _approve(self, request: ApproveRequest) -> dict[str, Any]:
        with self._stores() as stores:
            loop = Loop(stores=stores)
            state = loop.state(request.tenant, request.run)
            actions = state.plan.actions if state.plan is not None else ()
            tool = next((a.tool for a in actions if a.id == request.action), "")
            try:
                loop.approve(
                    request.tenant,
                    request.run,
                    request.action,
                    approved=request.approved,
                    by=request.by,
                )
                repeated = False
            except SettleError:
                decided = loop.state(request.tenant, request.run).approvals.get(request.action)
                if decided is None or (decided.approved, decided.by) != (
                    request.approved,
                    request.by,
                ):
                    raise
                repeated = True  # a retried attempt: the same decision is already recorded
        return {
            "run": request.run,
            "action": request.action,
            "tool": tool,
            "verdict": "approved" if request.approved else "denied",
            "by": request.by,
            "repeated": repeated,
        }

    @activity.defn(name=RAISE_BUDGET)
    async def raise_budget(self, request: ResumeRequest) -> dict[str, Any]:
        """The saved spec with the named budgets raised, as ``keelgate resume`` makes it; the
        workflow drives with it next (the drive records what changed on the audit chain)."""
        return await _in_thread(self._threads, self._raise_budget, request)

    def _raise_budget(self, request: ResumeRequest) -> dict[str, Any]:
        with self._stores() as stores:
            state = Loop(stores=stores).state(request.tenant, request.run)
        dollars = None if request.dollars is None else Decimal(request.dollars)
        resumed = resumed_spec(
            state,
            tokens=request.tokens,
            dollars=dollars,
            max_iterations=request.max_iterations,
            timeout_seconds=request.timeout_seconds,
            max_verifier_rejections=request.max_verifier_rejections,
        )
        return {"spec": resumed.spec.to_json(), "warnings": list(resumed.warnings)}

    @contextlib.contextmanager
    def _stores(self) -> Iterator[Stores]:
        stores = open_stores(self.store)
        try:
            yield stores
        finally:
            stores.close()


def _same_settlement(loop: Loop, request: ReconcileRequest, refused: SettleError) -> KeyRecord:
    """The key's record if it was settled exactly as ``request`` asks; else the refusal."""
    state = loop.state(request.tenant, request.run)
    actions = state.plan.actions if state.plan is not None else ()
    planned = next((a for a in actions if a.id == request.action), None)
    record = None if planned is None else loop.stores.idempotency.get(request.tenant, planned.key)
    wanted = KeyState.COMPLETED if request.executed else KeyState.ABANDONED
    if (
        record is None
        or record.state is not wanted
        or record.settled_by != request.by
        or record.source != "human"
    ):
        raise refused
    return record


def _import_path(source_dir: str) -> None:
    """A manifest's python models and tools import from its folder, where this worker sees it
    (``keelgate run`` does the same); otherwise from the worker's own path."""
    if source_dir and os.path.isdir(source_dir) and source_dir not in sys.path:
        sys.path.insert(0, source_dir)


async def _in_thread(threads: ThreadPoolExecutor, function: Callable[[Any], T], request: Any) -> T:
    """Run ``function(request)`` in a thread, heartbeating until it returns.

    A dead worker stops heartbeating and Temporal retries the attempt elsewhere; a live one
    keeps it. A cancelled attempt (its workflow cancelled, its heartbeat timed out, the worker
    shutting down) cannot stop the loop mid-call without turning a WRITE into an unknown
    outcome, so it waits for the call to return first: the run is then at a checkpointed stop.
    """
    timeout = activity.info().heartbeat_timeout
    every = max(0.2, timeout.total_seconds() / 4) if timeout else 5.0
    future = asyncio.get_running_loop().run_in_executor(threads, function, request)
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=every)
            if done:
                break
            activity.heartbeat()
    except asyncio.CancelledError:
        await asyncio.wait({future})
        raise
    try:
        return future.result()
    except KeelgateError as error:
        raise _application_error(error) from None
    except Exception as error:
        raise ApplicationError(
            scrubbed(f"internal error: {type(error).__name__}: {error}"),
            type=INTERNAL,
            non_retryable=True,  # not knowing is a reason to stop, not to retry
        ) from None


def _application_error(error: KeelgateError) -> ApplicationError:
    """Keelgate's error as Temporal's: its class name, its message (scrubbed of passwords) and
    its own ``retryable`` flag (a busy run or a store that is down may succeed later; a bad
    manifest or a refused decision never will)."""
    return ApplicationError(
        scrubbed(str(error)), type=type(error).__name__, non_retryable=not error.retryable
    )


# The workflow: deterministic; data in, activities out.


@workflow.defn(name=WORKFLOW)
class RunWorkflow:
    """One run: drive it, wait at each resumable stop for a decision, drive again.

    ``stops`` counts the drives that ended (at a stop, or given up after every attempt); a
    client that made a decision waits with ``next_stop(stops)`` for the stop after it.
    """

    @workflow.init
    def __init__(self, request: RunRequest) -> None:
        self._spec = dict(request.spec)
        self._pricing = dict(request.pricing)
        self._settings = request.settings
        self._outcome: dict[str, Any] | None = None
        self._error: dict[str, str] | None = None
        self._stops = 0
        self._wanted = True  # a drive is wanted: at the start, and after every decision
        self._working = 0  # drives and decisions under way or waiting for their turn
        self._finished = False
        # Drives and decisions run one at a time, in the order they came (asyncio's lock is
        # deterministic in a workflow): a decision never races a drive of the same run.
        self._turn = asyncio.Lock()

    @workflow.run
    async def run(self, request: RunRequest) -> dict[str, Any]:
        failure: ApplicationError | None = None
        while failure is None:
            await workflow.wait_condition(lambda: self._wanted)
            self._wanted = False
            async with self._working_turn():
                failure = await self._drive()
            if self._outcome is not None and self._outcome.get("stopReason") == "goal_met":
                break
        self._finished = True
        # Let every waiting client have the last word before the workflow closes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        if failure is not None:
            raise failure
        assert self._outcome is not None
        return self._outcome

    async def _drive(self) -> ApplicationError | None:
        """One drive to the next stop; the error that ends the workflow, if one does."""
        try:
            self._outcome = await workflow.execute_activity(
                DRIVE,
                DriveRequest(self._spec, self._pricing),
                result_type=dict,
                **self._options(),
            )
            self._error = None
            return None
        except ActivityError as error:
            cause = error.cause
            if isinstance(cause, ApplicationError) and cause.type == RUN_FAILED:
                details = cause.details
                self._outcome = dict(details[0]) if details else self._outcome
                return ApplicationError(
                    cause.message, *details, type=RUN_FAILED, non_retryable=True
                )
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                # A bad manifest, a run that is not there, a bug: trying again cannot help.
                return ApplicationError(cause.message, type=cause.type, non_retryable=True)
            # Every attempt was used up on something that may pass (a busy run, a store or a
            # model that is down, workers that kept dying): wait for `resume` to try again.
            self._error = _error_view(cause, self._settings.max_attempts)
            return None
        finally:
            self._stops += 1

    async def _decide(self, name: str, request: Any) -> dict[str, Any]:
        """Run one decision's activity in turn; its refusal fails the update, not the run."""
        async with self._working_turn():
            try:
                result: dict[str, Any] = await workflow.execute_activity(
                    name, request, result_type=dict, **self._options()
                )
            except ActivityError as error:
                cause = error.cause
                if isinstance(cause, ApplicationError):
                    raise ApplicationError(
                        cause.message, type=cause.type, non_retryable=True
                    ) from None
                raise ApplicationError(
                    _error_view(cause, self._settings.max_attempts)["message"],
                    type=type(cause).__name__,
                    non_retryable=True,
                ) from None
            return result

    @contextlib.asynccontextmanager
    async def _working_turn(self) -> Any:
        self._working += 1
        try:
            async with self._turn:
                yield
        finally:
            self._working -= 1

    def _options(self) -> dict[str, Any]:
        settings = self._settings
        return {
            "start_to_close_timeout": timedelta(seconds=settings.activity_timeout),
            "heartbeat_timeout": timedelta(seconds=settings.heartbeat_timeout),
            "retry_policy": RetryPolicy(
                initial_interval=timedelta(seconds=settings.retry_interval),
                backoff_coefficient=2.0,
                maximum_interval=timedelta(seconds=settings.max_retry_interval),
                maximum_attempts=settings.max_attempts,
            ),
        }

    def _target(self) -> tuple[str, str]:
        return str(self._spec["tenant"]), str(self._spec["run"])

    def _view(self) -> dict[str, Any]:
        return {
            "stops": self._stops,
            "outcome": self._outcome,
            "error": self._error,
            "finished": self._finished,
            "busy": not self._idle(),
        }

    def _idle(self) -> bool:
        return not self._wanted and self._working == 0

    def _refuse_when_finished(self) -> None:
        if self._finished:
            raise ApplicationError(
                "the run has finished: there is nothing to decide", type="SettleError"
            )

    # Decisions: each continues the run once made.

    @workflow.update(name="reconcile")
    async def reconcile(self, request: ReconcileRequest) -> dict[str, Any]:
        tenant, run = self._target()
        result = await self._decide(
            RECONCILE,
            ReconcileRequest(request.action, request.executed, request.by, tenant, run),
        )
        self._wanted = True
        return {**result, "stops": self._stops}

    @reconcile.validator
    def _check_reconcile(self, request: ReconcileRequest) -> None:
        self._refuse_when_finished()
        _check_decision(request.action, request.by)

    @workflow.update(name="approve")
    async def approve(self, request: ApproveRequest) -> dict[str, Any]:
        tenant, run = self._target()
        result = await self._decide(
            APPROVE, ApproveRequest(request.action, request.approved, request.by, tenant, run)
        )
        self._wanted = True
        return {**result, "stops": self._stops}

    @approve.validator
    def _check_approve(self, request: ApproveRequest) -> None:
        self._refuse_when_finished()
        _check_decision(request.action, request.by)

    @workflow.update(name="resume")
    async def resume(self, request: ResumeRequest) -> dict[str, Any]:
        tenant, run = self._target()
        warnings: list[str] = []
        if request.raises():
            request.tenant, request.run = tenant, run
            raised = await self._decide(RAISE_BUDGET, request)
            self._spec = dict(raised["spec"])
            warnings = list(raised.get("warnings") or [])
        self._pricing.update(request.pricing)
        stops = self._stops
        self._wanted = True
        return {"stops": stops, "warnings": warnings}

    @resume.validator
    def _check_resume(self, request: ResumeRequest) -> None:
        self._refuse_when_finished()
        _check_totals(request)

    @workflow.update(name=NEXT_STOP)
    async def next_stop(self, request: WaitRequest) -> dict[str, Any]:
        """Where the run stands once it is at a stop counted after ``request.after`` with
        nothing more to do, or has finished; or, after ``request.seconds``, where it stands
        then (``ready`` false)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(
                lambda: self._ready(request.after),
                timeout=timedelta(seconds=max(0.1, request.seconds)),
            )
        return {**self._view(), "ready": self._ready(request.after)}

    def _ready(self, after: int) -> bool:
        return self._finished or (self._idle() and self._stops > after)

    @workflow.query(name=STATUS)
    def status(self) -> dict[str, Any]:
        return self._view()


def _check_decision(action: str, by: str) -> None:
    """What can be refused without a store, refused before the update enters the history."""
    if not action.strip():
        raise ApplicationError("ACTION: name the action, e.g. 2:0", type="InputError")
    try:
        check_actor(by, field="--by")
    except InputError as error:
        raise ApplicationError(str(error), type="InputError") from None


def _check_totals(request: ResumeRequest) -> None:
    for flag, value in (
        ("--tokens", request.tokens),
        ("--max-iterations", request.max_iterations),
        ("--max-verifier-rejections", request.max_verifier_rejections),
    ):
        if value is not None and not 1 <= value <= INT64_MAX:
            raise ApplicationError(f"{flag}: must be between 1 and {INT64_MAX}", type="InputError")
    if request.timeout_seconds is not None and not request.timeout_seconds > 0:
        raise ApplicationError("--timeout: must be more than 0", type="InputError")
    if request.dollars is not None:
        try:
            dollars = Decimal(request.dollars)
        except ArithmeticError:
            dollars = Decimal("NaN")
        if not dollars.is_finite() or dollars < 0:
            raise ApplicationError(
                f"--dollars: {request.dollars!r} must be a non-negative number", type="InputError"
            )


def _error_view(cause: BaseException | None, attempts: int) -> dict[str, str]:
    if isinstance(cause, ApplicationError):
        return {"type": cause.type or "ApplicationError", "message": cause.message}
    if isinstance(cause, ActivityTimeout):
        return {
            "type": "WorkerLost",
            "message": f"the workers driving it stopped answering {attempts} times "
            f"({cause.type.name.lower() if cause.type else 'timeout'})",
        }
    return {"type": type(cause).__name__, "message": str(cause)}


# The client's side: the LoopRunner seam, and the decisions.


@dataclass(frozen=True)
class Stopped:
    """Where a run stands, as the workflow tells it: the last stop and, when the last drive was
    given up after every attempt, why (``error``: the error's class name and message)."""

    outcome: Outcome | None
    error: RemoteError | None
    stops: int
    finished: bool


class TemporalRunner:
    """Drives a LoopSpec through a Temporal workflow (the core ``LoopRunner`` protocol).

    ``run`` starts the run's workflow, or finds the one already driving it, and returns the
    run's next stop. Decisions (``reconcile``, ``approve``, ``resume``) go to that workflow and
    are carried out by a worker; the client never opens a store. Each call connects afresh.
    """

    def __init__(
        self,
        *,
        address: str,
        task_queue: str,
        namespace: str = "default",
        pricing: Mapping[str, Price] | None = None,
        settings: Settings | None = None,
        wait_timeout: float | None = None,
    ) -> None:
        self.address = address
        self.task_queue = task_queue
        self.namespace = namespace
        self.pricing = dict(pricing or {})
        self.settings = settings or Settings()
        #: How long ``run`` waits for the next stop (None: as long as it takes).
        self.wait_timeout = wait_timeout

    # LoopRunner

    def run(self, spec: LoopSpec) -> Outcome:
        """Start or find the run's workflow and return the run's next stop."""
        request, ident = self._request(spec)

        async def run() -> Stopped:
            client = await self._connect()
            await self._start(client, request, ident)
            return await self._wait(client, ident, -1, self.wait_timeout)

        return stop_outcome(_sync(run()))

    def start(self, spec: LoopSpec) -> str:
        """Start the run's workflow unless one runs already; its id."""
        request, ident = self._request(spec)

        async def start() -> None:
            await self._start(await self._connect(), request, ident)

        _sync(start())
        return ident

    def wait(self, ident: str, *, after: int = -1, timeout: float | None = None) -> Stopped:
        """The run's stop after the ``after``-th (-1: the current, or the one under way).

        Waits as long as the run takes, or at most ``timeout`` seconds (then raises
        ``KeelgateError``; the run goes on in its workflow)."""

        async def wait() -> Stopped:
            return await self._wait(await self._connect(), ident, after, timeout)

        return _sync(wait())

    def _request(self, spec: LoopSpec) -> tuple[RunRequest, str]:
        if spec.kind is LoopKind.MONITOR:
            raise InputError(
                "spec.loop",
                "a monitor's ticks are not driven through Temporal yet; use keelgate run",
            )
        if spec_from_manifest(spec.manifest).suspend:
            raise InputError("spec.suspend", "the run is suspended; set suspend: false to run it")
        request = RunRequest(spec.to_json(), pricing_to_wire(self.pricing), self.settings)
        return request, workflow_id(spec.tenant, spec.run)

    async def _start(self, client: Any, request: RunRequest, ident: str) -> None:
        await client.start_workflow(
            WORKFLOW,
            request,
            id=ident,
            task_queue=self.task_queue,
            # The run's workflow already driving it is the one to wait for; a finished one's
            # run is continued by a new one, from its checkpoint.
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    # Decisions

    def reconcile(
        self, tenant: str, run: str, action: str, *, executed: bool, by: str
    ) -> dict[str, Any]:
        """Settle an unknown outcome through the workflow (``Loop.reconcile`` on a worker)."""
        return self._update(tenant, run, "reconcile", ReconcileRequest(action, executed, by))

    def approve(
        self, tenant: str, run: str, action: str, *, approved: bool, by: str
    ) -> dict[str, Any]:
        """Approve or deny a pending action through the workflow (``Loop.approve``)."""
        return self._update(tenant, run, "approve", ApproveRequest(action, approved, by))

    def resume(
        self,
        tenant: str,
        run: str,
        *,
        tokens: int | None = None,
        dollars: Decimal | None = None,
        max_iterations: int | None = None,
        timeout_seconds: float | None = None,
        max_verifier_rejections: int | None = None,
    ) -> dict[str, Any]:
        """Raise the named budgets to new totals (as ``keelgate resume``) and continue."""
        request = ResumeRequest(
            tokens=tokens,
            dollars=None if dollars is None else str(dollars),
            max_iterations=max_iterations,
            timeout_seconds=timeout_seconds,
            max_verifier_rejections=max_verifier_rejections,
            pricing=pricing_to_wire(self.pricing),
        )
        return self._update(tenant, run, "resume", request)

    def status(self, tenant: str, run: str) -> Stopped:
        """Where the run stands now, without waiting."""

        async def query() -> Stopped:
            client = await self._connect()
            handle = client.get_workflow_handle(workflow_id(tenant, run))
            try:
                return _stopped(await handle.query(STATUS))
            except Exception as error:
                return await _closed(handle, error, tenant, run)

        return _sync(query())

    # Plumbing

    def _update(self, tenant: str, run: str, name: str, request: Any) -> dict[str, Any]:
        async def update() -> dict[str, Any]:
            client = await self._connect()
            handle = client.get_workflow_handle(workflow_id(tenant, run))
            try:
                result: dict[str, Any] = await handle.execute_update(
                    name, request, result_type=dict
                )
            except Exception as error:
                raise await _update_refused(handle, error, tenant, run) from None
            return result

        return _sync(update())

    async def _wait(self, client: Any, ident: str, after: int, timeout: float | None) -> Stopped:
        handle = client.get_workflow_handle(ident)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = WaitRequest().seconds if deadline is None else deadline - time.monotonic()
            try:
                view = await handle.execute_update(
                    NEXT_STOP,
                    WaitRequest(after, min(WaitRequest().seconds, max(0.1, left))),
                    result_type=dict,
                )
            except Exception as error:
                tenant, run = ident.split("/", 2)[1:]
                return await _closed(handle, error, tenant, run)
            if view.get("ready"):
                return _stopped(view)
            if deadline is not None and time.monotonic() >= deadline:
                raise KeelgateError(
                    f"{ident}: no stop within {timeout}s; the run goes on in its workflow"
                )

    async def _connect(self) -> Any:
        from temporalio.client import Client

        try:
            return await Client.connect(self.address, namespace=self.namespace)
        except Exception as error:
            raise TemporalUnavailable(
                f"--address: the Temporal server at {self.address} cannot be reached ({error})"
            ) from None


def _sync(work: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(work)
    finally:
        # Free the client's Rust half now, while the interpreter is whole: left to the
        # interpreter's teardown, its runtime threads can abort the process on exit
        # ("PyGILState_Release", temporalio/sdk-python#300). A collection frees it.
        gc.collect()


def _stopped(view: Mapping[str, Any]) -> Stopped:
    outcome = view.get("outcome")
    error = view.get("error")
    return Stopped(
        outcome=None if outcome is None else outcome_from_wire(outcome),
        error=None if not error else RemoteError(str(error["type"]), str(error["message"])),
        stops=int(view.get("stops", 0)),
        finished=bool(view.get("finished")),
    )


async def _closed(handle: Any, error: BaseException, tenant: str, run: str) -> Stopped:
    """The workflow would not answer (closed, or never started): what its result says."""
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError, RPCStatusCode

    try:
        description = await handle.describe()
    except RPCError as missing:
        if missing.status is RPCStatusCode.NOT_FOUND:
            raise _no_workflow(tenant, run) from None
        raise TemporalUnavailable(f"the Temporal server did not answer ({missing})") from None
    if description.close_time is None:
        raise _refusal(error, tenant, run)
    try:
        result = await handle.result()
    except WorkflowFailureError as failure:
        cause = failure.cause
        if isinstance(cause, ApplicationError) and cause.type == RUN_FAILED and cause.details:
            return Stopped(outcome_from_wire(cause.details[0]), None, -1, True)
        if isinstance(cause, ApplicationError):
            raise RemoteError(cause.type or "ApplicationError", cause.message) from None
        raise RemoteError(type(cause).__name__, str(cause)) from None
    return Stopped(outcome_from_wire(result), None, -1, True)


async def _update_refused(
    handle: Any, error: BaseException, tenant: str, run: str
) -> KeelgateError:
    """Why a decision did not go through: refused by the run, or no open workflow to take it."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(error, WorkflowUpdateFailedError) or not isinstance(error, RPCError):
        return _refusal(error, tenant, run)
    try:
        description = await handle.describe()
    except RPCError as missing:
        if missing.status is RPCStatusCode.NOT_FOUND:
            return _no_workflow(tenant, run)
        return TemporalUnavailable(f"the Temporal server did not answer ({missing})")
    if description.close_time is not None:
        return InputError(
            "RUN",
            f"run {run!r} in namespace {tenant!r} has finished (its workflow is closed): "
            "there is nothing to decide",
        )
    return _refusal(error, tenant, run)


def _no_workflow(tenant: str, run: str) -> InputError:
    return InputError(
        "RUN",
        f"no Temporal workflow drives run {run!r} in namespace {tenant!r} "
        "(start it with keelgate temporal run -f)",
    )


def _refusal(error: BaseException, tenant: str, run: str) -> KeelgateError:
    """An update's failure as the error the same decision meets locally."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(error, WorkflowUpdateFailedError):
        cause = error.cause
        if isinstance(cause, ApplicationError):
            return RemoteError(cause.type or "ApplicationError", cause.message)
        return RemoteError(type(cause).__name__, str(cause))
    if isinstance(error, RPCError) and error.status is RPCStatusCode.NOT_FOUND:
        return _no_workflow(tenant, run)
    if isinstance(error, RPCError):
        return TemporalUnavailable(f"the Temporal server refused or did not answer ({error})")
    if isinstance(error, KeelgateError):
        return error
    return RemoteError(type(error).__name__, str(error))


def stop_outcome(stopped: Stopped) -> Outcome:
    """The stop a client shows; the error of a drive given up after every attempt, raised."""
    if stopped.error is not None:
        raise stopped.error
    if stopped.outcome is None:
        raise RemoteError("KeelgateError", "the workflow has no stop to show yet")
    return stopped.outcome


# A worker process.


async def serve(
    *,
    address: str,
    task_queue: str,
    store: str,
    namespace: str = "default",
    confirmer: Confirmer | None = None,
    max_concurrent: int = 8,
    ready: Callable[[], None] | None = None,
) -> None:
    """Poll ``task_queue`` for Keelgate's workflow and activities until SIGINT or SIGTERM.

    The first signal stops polling and lets the drives under way reach their stops (a drive is
    never cut off mid-call); a second one ends the process at once, as a crash would.
    """
    from temporalio.client import Client
    from temporalio.worker import Worker

    try:
        client = await Client.connect(address, namespace=namespace)
    except Exception as error:
        raise TemporalUnavailable(
            f"--address: the Temporal server at {address} cannot be reached ({error})"
        ) from None
    activities = Activities(store=store, confirmer=confirmer, threads=max_concurrent)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(number: int) -> None:
        # The next one gets the default action: the process ends now.
        loop.remove_signal_handler(number)
        stop.set()

    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, on_signal, number)
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[RunWorkflow],
        workflow_runner=_sandbox(),
        activities=[
            activities.drive,
            activities.reconcile,
            activities.approve,
            activities.raise_budget,
        ],
        max_concurrent_activities=max_concurrent,
    )
    try:
        async with worker:
            if ready is not None:
                ready()
            await stop.wait()
    finally:
        activities.close()


def _sandbox() -> Any:
    """Temporal's sandbox for the workflow, with Keelgate's own modules passed through: the
    workflow uses only their plain data and pure functions, and re-importing them (the stores,
    the adapters) for every workflow would cost much and check nothing. This module itself is
    re-imported, so the workflow's code stays under the sandbox's determinism checks."""
    import pkgutil

    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    import keelgate
    import keelgate.runners

    shared = [
        f"keelgate.{module.name}"
        for module in pkgutil.iter_modules(keelgate.__path__)
        if module.name != "runners"
    ]
    shared += [
        f"keelgate.runners.{module.name}"
        for module in pkgutil.iter_modules(keelgate.runners.__path__)
        if module.name != "temporal"
    ]
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*shared)
    return SandboxedWorkflowRunner(restrictions=restrictions)


def serve_forever(**options: Any) -> None:
    """``serve`` in a new event loop (the worker command's body)."""
    _sync(serve(**options))


__all__ = [
    "APPROVE",
    "DRIVE",
    "NEEDS_EXTRA",
    "RAISE_BUDGET",
    "RECONCILE",
    "WORKFLOW",
    "Activities",
    "ApproveRequest",
    "DriveRequest",
    "ReconcileRequest",
    "ResumeRequest",
    "RunRequest",
    "RunWorkflow",
    "Settings",
    "Stopped",
    "TemporalRunner",
    "WaitRequest",
    "outcome_from_wire",
    "outcome_to_wire",
    "serve",
    "serve_forever",
    "stop_outcome",
    "workflow_id",
]
