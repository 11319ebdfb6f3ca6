"""The operator's unit tests' API server: ``keelgate.testing.apiserver``'s, which the simulator
runs too, with the one watch a test's operator has.

The controller talks to the cluster only through the ``ApiServer`` seam
(``keelgate.kube.controller.ports``); the in-memory server answers it as a kube-apiserver does
(uids, resourceVersions, generations, status as a subresource, 409s and 404s, graceful pod
deletion) and tells a watch (a real ``Cache``, as kopf's watch streams would) at once. The
kubelet's part (a pod running, ending with an exit code) is ``start_pod`` and ``finish_pod``, a
person's edits ``patch_spec``, a failure ``refuse_next`` or ``refuse_always``. No cluster is
needed, and every decision of the controller runs in milliseconds; the e2e suite proves the same
on a real API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from keelgate.testing.apiserver import MemoryApiServer, Watcher


class FakeApiServer(MemoryApiServer):
    """The server with one ``watch`` (the test's operator's cache), or none while it is away."""

    def __init__(
        self, *, watch: Watcher | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(clock=clock)
        self.watch = watch

    @property
    def watch(self) -> Watcher | None:
        return self.watchers[0] if self.watchers else None

    @watch.setter
    def watch(self, watch: Watcher | None) -> None:
        self.watchers[:] = [] if watch is None else [watch]
