"""What the operator has seen of the cluster: the latest body of each watched object.

kopf's watch streams feed it (and the controller adds what its own writes return), so a
reconcile reads objects from memory instead of asking the API server each time. It may be a
moment behind the server, never ahead of it; the controller is written so that acting on a
stale view is harmless (deterministic names, a 409 adopted by owner UID, status patches guarded
by resourceVersion), and the store, not this cache, decides what a step does. A pod that
disappears leaves a tombstone with its last body, so a step pod deleted mid-run is seen as an
attempt that ended without recording a stop. This module must never call the API.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from keelgate.kube.naming import RUN_LABEL

JSON = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)

TERMINAL_POD_PHASES = ("Succeeded", "Failed")


def key_of(kind: str, body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata", {})
    return (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))


def _version(body: Mapping[str, Any]) -> int | None:
    value = body.get("metadata", {}).get("resourceVersion")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def pod_finished(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL_POD_PHASES


def pod_active(pod: Mapping[str, Any]) -> bool:
    return not pod_finished(pod)


class Cache:
    """Thread-safe: kopf's handlers write from the event loop, reconciles read from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, JSON] = {}
        self._tombstones: dict[Key, JSON] = {}

    def put(self, kind: str, body: Mapping[str, Any]) -> None:
        """Remember ``body`` unless a newer version of it is already known."""
        key = key_of(kind, body)
        fresh = copy.deepcopy(dict(body))
        with self._lock:
            known = self._objects.get(key)
            new, old = _version(fresh), None if known is None else _version(known)
            if known is not None and new is not None and old is not None and new < old:
                return
            self._objects[key] = fresh
            self._tombstones.pop(key, None)

    def drop(self, kind: str, body: Mapping[str, Any]) -> None:
        """The object was deleted; a pod leaves its last body as a tombstone."""
        key = key_of(kind, body)
        with self._lock:
            last = self._objects.pop(key, None)
            if kind == "Pod":
                self._tombstones[key] = copy.deepcopy(dict(body)) if last is None else last

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        with self._lock:
            found = self._objects.get((kind, namespace, name))
            return None if found is None else copy.deepcopy(found)

    def tombstone(self, namespace: str, name: str) -> JSON | None:
        """The last body of a pod that was deleted, if this operator saw it go."""
        with self._lock:
            found = self._tombstones.get(("Pod", namespace, name))
            return None if found is None else copy.deepcopy(found)

    def forget_tombstone(self, namespace: str, name: str) -> None:
        with self._lock:
            self._tombstones.pop(("Pod", namespace, name), None)

    def select(
        self, kind: str, namespace: str | None = None, where: Callable[[JSON], bool] | None = None
    ) -> list[JSON]:
        with self._lock:
            found = [
                copy.deepcopy(body)
                for (k, ns, _), body in self._objects.items()
                if k == kind
                and (namespace is None or ns == namespace)
                and (where is None or where(body))
            ]
        return found

    def keys(self, kind: str) -> Iterator[Key]:
        with self._lock:
            return iter([key for key in self._objects if key[0] == kind])

    def count(self, kind: str, where: Callable[[JSON], bool]) -> int:
        with self._lock:
            return sum(1 for (k, _, _), body in self._objects.items() if k == kind and where(body))

    def step_pods(self, namespace: str, run_label: str) -> list[JSON]:
        return self.select(
            "Pod",
            namespace,
            lambda pod: pod.get("metadata", {}).get("labels", {}).get(RUN_LABEL) == run_label,
        )
