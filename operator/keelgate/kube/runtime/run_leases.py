"""The runtime's part in run ownership: renewing every held run's lease together, and letting
the idle ones go on a clean stop (design: docs/operator.md, "Run ownership in the store").

Why it exists: the controller takes runs (``kube.controller.ownership``); keeping them is the
running operator's, on its event loop, beside the workers. It must never renew a run one
statement at a time, nor let go of a run a step pod of this cluster still drives (its pod's
writes land while nobody takes a newer epoch, and another cluster's operator must not take it
meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from keelgate.kube.controller.ownership import RunHolding
from keelgate.kube.controller.ports import Key
from keelgate.kube.naming import label_value
from keelgate.kube.resources import pod_active
from keelgate.kube.runtime.cache import Cache

log = logging.getLogger("keelgate.operator")


async def renew_runs(holding: RunHolding, *, every: float, look: Callable[[Key], None]) -> None:
    """Renew the leases of every run ``holding`` holds, in one statement each ``every``
    seconds; a run found lost (its lease lapsed unrenewed, or another holder took it after
    that) is looked at again at once (``look``): taken again before its next pod, or shown held
    elsewhere. A renewal that fails is told and tried at the next period: the lease outlasts two
    of them."""
    while True:
        await asyncio.sleep(every)
        try:
            lost = await asyncio.to_thread(holding.renew)
        except Exception as failure:  # told, then tried again at the next period
            log.warning(
                "cannot renew the leases of %d held runs (%s: %s)",
                len(holding.held()),
                type(failure).__name__,
                str(failure).splitlines()[0] if str(failure) else "",
            )
            continue
        for namespace, run in lost:
            log.warning(
                "run %s/%s is no longer held here (its lease lapsed, or another operator took it)",
                namespace,
                run,
            )
            look(("AgentRun", namespace, run))


async def let_go_idle_runs(holding: RunHolding, cache: Cache) -> None:
    """On a clean stop: let go of the held runs no step pod of this cluster drives, so that the
    next leader takes them at once; a run whose pod still runs keeps its lease until it lapses,
    and its pod's writes land meanwhile (the next leader waits for it)."""
    if not holding.enabled:
        return
    for namespace, run in holding.held():
        if cache.count_step_pods(namespace, label_value(run), pod_active):
            continue
        try:
            await asyncio.to_thread(holding.let_go, namespace, run)
        except Exception as failure:  # the lease lapses on its own
            log.warning("cannot let run %s/%s go (%s)", namespace, run, failure)
