"""The Temporal runner's activities: what a worker runs against its own store.

Temporal alone runs an activity at least once: a worker that dies mid-activity gets the activity
again on another worker, side effects included. What makes that safe is the loop, not Temporal:
every attempt of ``drive`` calls ``Loop.run_or_resume`` (through ``LocalRunner``), which loads the
checkpoint, replays completed WRITEs from their durable keys, and stops with ``outcome_unknown``
at a WRITE whose process died mid-call. A resumable stop (budget, unknown outcome, approval) is
a normal result, never an error, so Temporal does not retry it; a ``failed`` stop is a
non-retryable ``ApplicationError``; Keelgate's own errors keep their ``retryable`` flag. A drive
heartbeats while the loop runs in a thread, so a dead worker is noticed within the heartbeat
timeout. This module must never retry a decision that was refused, never interrupt a loop
mid-call, and never change ``sys.path`` (a manifest's own code is imported from its folder by
``CallableLoader``, privately).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, TypeVar

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from keelgate.adapters.loading import CallableLoader
    from keelgate.core.loop import Loop
    from keelgate.core.protocols import Confirmer, Stores
    from keelgate.core.redaction import redact_text
    from keelgate.core.spec import LoopSpec
    from keelgate.core.types import KeyRecord, KeyState, Outcome, RunPhase, StopReason
    from keelgate.errors import KeelgateError, SettleError
    from keelgate.runners.local import LocalRunner, resumed_spec
    from keelgate.runners.temporal.wire import (
        APPROVE,
        DRIVE,
        INTERNAL,
        RAISE_BUDGET,
        RECONCILE,
        RUN_FAILED,
        ApproveRequest,
        DriveRequest,
        ReconcileRequest,
        ResumeRequest,
        outcome_to_wire,
        pricing_from_wire,
    )
    from keelgate.stores import open_stores

T = TypeVar("T")


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
        runner = LocalRunner(
            store=self.store,
            confirmer=self.confirmer,
            pricing=pricing_from_wire(request.pricing),
            # A manifest's python models and tools import from its folder, where this worker
            # sees it (``keelgate run`` does the same), else from the worker's own path; the
            # folder is never put on sys.path: runs of other folders share this process.
            callables=CallableLoader(spec.source_dir),
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
                    groups=request.groups,
                )
                repeated = False
            except SettleError:
                decisions = loop.state(request.tenant, request.run).approvals.get(
                    request.action, ()
                )
                if not any((d.approved, d.by) == (request.approved, request.by) for d in decisions):
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
            redact_text(f"internal error: {type(error).__name__}: {error}"),
            type=INTERNAL,
            non_retryable=True,  # not knowing is a reason to stop, not to retry
        ) from None


def _application_error(error: KeelgateError) -> ApplicationError:
    """Keelgate's error as Temporal's: its class name, its message (through the redactor) and
    its own ``retryable`` flag (a busy run or a store that is down may succeed later; a bad
    manifest or a refused decision never will)."""
    return ApplicationError(
        redact_text(str(error)), type=type(error).__name__, non_retryable=not error.retryable
    )
