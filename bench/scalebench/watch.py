"""What the bench sees of the cluster, as a user's watch sees it: when each step pod was first
seen created and first seen ended, and when each AgentRun was seen to finish.

Why it exists: hand-off and time-to-first-pod are measured from outside the operator, on the
bench's own clock, through the same watch API any client uses (creation timestamps have
whole-second resolution, too coarse for a hand-off). A broken watch lists again and goes on;
a time is never overwritten once set. It must never write to the cluster.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from keelgate_e2e.kube import ApiError, Kube

JSON = dict[str, Any]

#: The step pods the operator makes (its label on each).
STEP_SELECTOR = "app.kubernetes.io/name=keelgate-step"


class Watch:
    """List, then watch, one collection of every namespace, calling ``seen`` for each object
    (with ``deleted``); lists again whenever the watch breaks."""

    def __init__(
        self, kube: Kube, path: str, params: dict[str, str], seen: Callable[[JSON, bool], None]
    ) -> None:
        self.kube, self.path, self.params, self.seen = kube, path, params, seen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"watch {path}")

    def start(self) -> Watch:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                listed = self.kube.get(self.path, {**self.params, "limit": "0"})
                for item in listed.get("items") or []:
                    self.seen(item, False)
                version = listed["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    params = {**self.params, "resourceVersion": version}
                    for event in self.kube.watch(self.path, params, 120):
                        kind, body = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(body.get("code") or 500), json.dumps(body), "W", "")
                        version = body.get("metadata", {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            self.seen(body, kind == "DELETED")
                        if self.stop.is_set():
                            return
            except Exception as error:  # expired or broken: list again
                if not self.stop.is_set():
                    print(f"watch {self.path}: {type(error).__name__}: {error}", flush=True)
                    time.sleep(0.5)


class PodTimes:
    """First seen created, first seen ended (Succeeded or Failed), per step pod name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.failed: dict[str, str] = {}

    def seen(self, pod: JSON, deleted: bool) -> None:
        now = time.monotonic()
        name = str(pod.get("metadata", {}).get("name", ""))
        if not name:
            return
        phase = (pod.get("status") or {}).get("phase")
        with self.lock:
            self.created.setdefault(name, now)
            if phase in ("Succeeded", "Failed"):
                self.ended.setdefault(name, now)
                if phase == "Failed":
                    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
                    ended = (statuses[0].get("state") or {}).get("terminated") or {}
                    self.failed.setdefault(name, str(ended.get("exitCode", "?")))

    def copy(self) -> tuple[dict[str, float], dict[str, float]]:
        with self.lock:
            return dict(self.created), dict(self.ended)


class RunEnds:
    """Calls ``finished(namespace, name, phase)`` once per AgentRun seen at rest (Succeeded,
    Failed or Stopped) at its current generation."""

    def __init__(self, finished: Callable[[str, str, str], None]) -> None:
        self.finished = finished
        self.told: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def seen(self, run: JSON, deleted: bool) -> None:
        if deleted:
            return
        meta, status = run.get("metadata") or {}, run.get("status") or {}
        phase = status.get("phase")
        if phase not in ("Succeeded", "Failed", "Stopped"):
            return
        if status.get("observedGeneration") != meta.get("generation"):
            return
        key = (str(meta.get("namespace")), str(meta.get("name")))
        with self.lock:
            if key in self.told:
                return
            self.told.add(key)
        self.finished(key[0], key[1], str(phase))
