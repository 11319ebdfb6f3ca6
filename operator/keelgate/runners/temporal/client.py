"""The Temporal runner's client side: ``TemporalRunner``, the core ``LoopRunner`` seam over a
run's workflow, and the decisions it sends to it.

``run`` starts the run's workflow (or finds the one already driving it) and returns the run's
next stop; ``reconcile``, ``approve`` and ``resume`` are updates of that workflow, carried out by a
worker. The client never opens a store. A refusal comes back as the error the same decision
meets locally. It must never put a store URL into a workflow's input.
"""

from __future__ import annotations

import asyncio
import gc
import re
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from keelgate.core.spec import LoopSpec, Price
    from keelgate.core.types import LoopKind, Outcome
    from keelgate.errors import InputError, KeelgateError, RemoteError, TemporalUnavailable
    from keelgate.manifest import spec_from_manifest
    from keelgate.runners.temporal.wire import (
        NEXT_STOP,
        RUN_FAILED,
        STATUS,
        WORKFLOW,
        ApproveRequest,
        ReconcileRequest,
        ResumeRequest,
        RunRequest,
        Settings,
        WaitRequest,
        outcome_from_wire,
        pricing_to_wire,
        workflow_id,
    )

T = TypeVar("T")


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

        return stop_outcome(run_sync(run()))

    def start(self, spec: LoopSpec) -> str:
        """Start the run's workflow unless one runs already; its id."""
        request, ident = self._request(spec)

        async def start() -> None:
            await self._start(await self._connect(), request, ident)

        run_sync(start())
        return ident

    def wait(self, ident: str, *, after: int = -1, timeout: float | None = None) -> Stopped:
        """The run's stop after the ``after``-th (-1: the current, or the one under way).

        Waits as long as the run takes, or at most ``timeout`` seconds (then raises
        ``KeelgateError``; the run goes on in its workflow)."""

        async def wait() -> Stopped:
            return await self._wait(await self._connect(), ident, after, timeout)

        return run_sync(wait())

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
        self,
        tenant: str,
        run: str,
        action: str,
        *,
        approved: bool,
        by: str,
        groups: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Approve or deny a pending action through the workflow (``Loop.approve``)."""
        request = ApproveRequest(action, approved, by, groups=list(groups))
        return self._update(tenant, run, "approve", request)

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

        return run_sync(query())

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

        return run_sync(update())

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
            raise unreachable(self.address, error) from None


def run_sync(work: Coroutine[Any, Any, T]) -> T:
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


def unreachable(address: str, error: BaseException) -> TemporalUnavailable:
    """The Temporal server at ``address`` cannot be reached, in one line: the reason as a
    person says it, not the Rust client's debug dump of its transport error."""
    text = str(error)
    said = re.search(r'message: "([^"]+)"', text)
    if said:
        reason = said.group(1).lower()  # "connection refused"
    elif "dns error" in text.lower() or "failed to lookup" in text.lower():
        reason = "its host name does not resolve"
    elif "timed out" in text.lower() or "deadline" in text.lower():
        reason = "it did not answer in time"
    elif "tls" in text.lower() or "certificate" in text.lower():
        reason = "the TLS handshake failed"
    else:
        reason = text.split(": ", 1)[0].strip() or type(error).__name__
    return TemporalUnavailable(
        f"--address: the Temporal server at {address} cannot be reached: {reason}; run the "
        "same command again once it answers"
    )
