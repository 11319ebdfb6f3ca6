"""The operator's workers: each takes a key from the work queue, runs the controller's reconcile
for it in a thread, and puts the key back when the result asks (``Requeue``), or after an error
with a back-off.

Why it exists: reconciles are synchronous and wait on the store and the API server, so they run
in threads while the event loop keeps watching; a reconcile that raised is retried, its back-off
growing per key (0.5 s doubling, at most 60 s) and forgotten at its first success. It must
never swallow an error without counting it (``keelgate_reconcile_errors_total``) and logging it
in one line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from keelgate.core import clocks
from keelgate.kube.controller.outcomes import Requeue, Result
from keelgate.kube.controller.ports import Key
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.runtime.workqueue import WorkQueue

log = logging.getLogger("keelgate.operator")


def backoff(failures: int) -> float:
    """Seconds before a key whose reconcile failed ``failures`` times in a row goes again."""
    return clocks.backoff(0.5, 60.0, failures)


class Workers:
    def __init__(
        self, queue: WorkQueue[Key], reconcile: Callable[[Key], Result], metrics: Metrics
    ) -> None:
        self._queue = queue
        self._reconcile = reconcile
        self._metrics = metrics
        self._failures: dict[Key, int] = {}  # touched only on the event loop

    async def work(self) -> None:
        """One worker, until cancelled."""
        queue = self._queue
        while True:
            key = await queue.get()
            after: float | None
            try:
                result = await asyncio.to_thread(self._reconcile, key)
            except Exception as error:
                count = self._failures.get(key, 0) + 1
                self._failures[key] = count
                after = backoff(count)
                self._metrics.reconcile_errors.labels(key[0]).inc()
                log.warning(
                    "%s %s/%s: %s: %s (retry in %.0fs)",
                    key[0],
                    key[1],
                    key[2],
                    type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "",
                    after,
                )
            else:
                self._failures.pop(key, None)
                after = result.after if isinstance(result, Requeue) else None
            finally:
                queue.done(key)
            if after is not None:
                queue.add_after(key, after)
