"""What the reconcilers need from the world around them, as small Protocols.

Why it exists: a reconciler decides; it does its I/O only through these seams, which it is
given. The running operator passes the real things (``keelgate.kube.api.ClusterApi``,
``keelgate.kube.runtime.cache.Cache``, ``keelgate.kube.runtime.metrics.Metrics``: mypy checks
they fit), and a unit test passes a fake API server and a real cache, so every decision is
tested in milliseconds without a cluster. Each Protocol lists only what a reconciler calls. This
module must never import the runtime (it sits above the controller) or a client library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

JSON = dict[str, Any]
#: (kind, namespace, name): what the work queue holds.
Key = tuple[str, str, str]
#: Queue a key for another look, after so many seconds (safe from any thread).
Enqueue = Callable[[Key, float], None]


class ApiServer(Protocol):
    """The API server's writes (and the two reads a watch cannot answer), as ``ClusterApi``
    makes them. Failures are ``kube.api.Conflict`` (409), ``Gone`` (404) and ``ApiFailure``."""

    def create_object(self, kind: str, namespace: str, body: Mapping[str, Any]) -> JSON: ...

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> JSON: ...

    def delete_object(self, kind: str, namespace: str, name: str, *, uid: str = "") -> None: ...

    def set_finalizers(
        self,
        kind: str,
        namespace: str,
        name: str,
        finalizers: Sequence[str],
        *,
        resource_version: str,
    ) -> JSON: ...

    def label(self, kind: str, namespace: str, name: str, labels: Mapping[str, str]) -> JSON:
        """Merge ``labels`` into the object's (the run's shard label, and nothing else)."""
        ...

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON: ...

    def read_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON: ...

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None: ...

    def event(
        self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str
    ) -> None: ...


class ClusterView(Protocol):
    """What the operator has seen of the cluster (the watch cache): read from memory, written
    with what the API server answered."""

    def get(self, kind: str, namespace: str, name: str) -> JSON | None: ...

    def put(self, kind: str, body: JSON) -> None: ...

    def metadata(self, kind: str, namespace: str, name: str) -> JSON | None:
        """A copy of the object's ``metadata`` alone (cheaper than ``get`` for a label)."""
        ...

    def select(
        self,
        kind: str,
        namespace: str | None = None,
        where: Callable[[JSON], bool] | None = None,
    ) -> list[JSON]: ...

    def keys(self, kind: str, where: Callable[[JSON], bool] | None = None) -> list[Key]: ...

    def step_pods(self, namespace: str, run_label: str) -> list[JSON]: ...

    def count_step_pods(
        self, namespace: str, run_label: str, where: Callable[[JSON], bool]
    ) -> int: ...

    def active_step_pods(self) -> int: ...

    def tombstone(self, namespace: str, name: str, *, kind: str = "Pod") -> JSON | None: ...

    def forget_tombstone(self, namespace: str, name: str, *, kind: str = "Pod") -> None: ...

    def forget_vanished(self, kind: str, namespace: str, name: str, uid: str) -> JSON | None: ...


class StepMeter(Protocol):
    """The step metrics a reconciler keeps (``keelgate.kube.runtime.metrics``)."""

    def step_started(self) -> None: ...

    def step_ended(self, result: str, seconds: float | None) -> None: ...

    def handoff(self, seconds: float) -> None: ...
