"""The Temporal runner's workflow (``keelgate.run``): one run, driven to each stop, waiting at
each resumable stop for a decision, driven again.

Deterministic: it holds the spec as plain data, drives the run with the ``keelgate.drive``
activity, and between stops waits for updates: ``reconcile``, ``approve``, ``resume`` (raise
budgets) and ``next_stop`` (wait for the run's next stop). It never touches a store; each
decision is an activity calling the same ``Loop`` methods as the CLI, run one at a time with the
drives, so one workflow is its run's only driver. The worker re-imports this module in
Temporal's sandbox, so its code stays under the sandbox's determinism checks; it must never do
I/O, read the clock or keep anything that is not in the workflow's history.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from decimal import Decimal
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    # Plain data and pure functions, shared with the worker's activities as they are: the
    # workflow sandbox need not re-import them (nor the drivers the runners pull in).
    from keelgate.core.loop import check_actor
    from keelgate.core.spec import INT64_MAX
    from keelgate.errors import InputError
    from keelgate.runners.temporal.wire import (
        APPROVE,
        DRIVE,
        NEXT_STOP,
        RAISE_BUDGET,
        RECONCILE,
        RUN_FAILED,
        STATUS,
        WORKFLOW,
        ApproveRequest,
        DriveRequest,
        ReconcileRequest,
        ResumeRequest,
        RunRequest,
        WaitRequest,
    )


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
            APPROVE,
            ApproveRequest(
                request.action, request.approved, request.by, tenant, run, list(request.groups)
            ),
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
