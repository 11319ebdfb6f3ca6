"""A Temporal worker process (``keelgate temporal-worker``): polls a task queue for Keelgate's
workflow and activities until SIGINT or SIGTERM.

The first signal stops polling and lets the drives under way reach their stops (a drive is never
cut off mid-call); a second one ends the process at once, as a crash would. The workflow runs in
Temporal's sandbox with Keelgate's own modules passed through (``sandbox``). The store URL is
this process's setting and never leaves it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from keelgate.core.protocols import Confirmer
    from keelgate.runners.temporal.activities import Activities
    from keelgate.runners.temporal.client import run_sync, unreachable
    from keelgate.runners.temporal.workflow import RunWorkflow


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
        raise unreachable(address, error) from None
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
        workflow_runner=sandbox(),
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


def sandbox() -> Any:
    """Temporal's sandbox for the workflow, with Keelgate's own modules passed through: the
    workflow uses only their plain data and pure functions, and re-importing them (the stores,
    the adapters) for every workflow would cost much and check nothing. The Temporal runner's
    own package (the workflow's module with it) is re-imported, so the workflow's code stays
    under the sandbox's determinism checks."""
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
    run_sync(serve(**options))
