"""The runs the bench keeps in flight: N AgentRuns at once, each finished one deleted and replaced.

Why it exists: "10,000 concurrent runs" is a steady state, not a burst that drains: the bench
creates N AgentRuns, and as each reaches its goal it is deleted (as a TTL would, and the
operator's cache and the API server hold what a platform at N holds) and a new one is created,
so the measured window sees N runs under way throughout. Each run reads once, orders once (a
WRITE to the loopback shop, its ``sku`` the run's name, so the shop's book says which run
ordered) and is done: three step pods. Creates and deletes go through a few threads as the
bench's own user (admin). It must never edit a run it created.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from keelgate_e2e.kube import ApiError, Kube

JSON = dict[str, Any]
RUNS = "/apis/keelgate.dev/v1alpha1/namespaces/{ns}/agentruns"


def run_doc(name: str, shop_url: str) -> JSON:
    """A run of three steps: a READ, a WRITE to the shop, done."""
    return {
        "apiVersion": "keelgate.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": f"scale {name}",
            "model": {
                "provider": "scripted",
                "name": "demo",
                "script": [
                    {"actions": [{"tool": "get_inventory", "args": {"sku": name}}]},
                    {"actions": [{"tool": "place_order", "args": {"sku": name, "qty": 1}}]},
                    {"done": True, "answer": "ordered"},
                ],
            },
            "tools": [
                {
                    "name": "get_inventory",
                    "sideEffect": "READ",
                    "http": {"url": f"{shop_url}/items/{{sku}}", "method": "GET"},
                },
                {
                    "name": "place_order",
                    "sideEffect": "WRITE",
                    "http": {"url": f"{shop_url}/orders", "method": "POST"},
                },
            ],
            "budget": {"maxIterations": 5},
        },
    }


class Load:
    """Keeps ``target`` runs in flight across ``namespaces``."""

    def __init__(self, admin: Kube, namespaces: list[str], shop_url: str, *, threads: int = 6):
        self.admin = admin
        self.namespaces = namespaces
        self.shop_url = shop_url
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="load")
        self.lock = threading.Lock()
        self.target = 0
        self.number = 0
        self.in_flight: set[tuple[str, str]] = set()
        self.created: dict[str, float] = {}  # run name -> when its create returned
        self.succeeded: list[str] = []
        self.other_ends: dict[str, str] = {}  # run -> phase, for runs that did not succeed
        self.create_failures = 0

    def set_target(self, target: int) -> None:
        """Create runs until ``target`` are in flight (the creates go on in the background)."""
        with self.lock:
            self.target = target
            missing = target - len(self.in_flight)
            names = [self._name() for _ in range(max(0, missing))]
            self.in_flight.update(names)
        for key in names:
            self.pool.submit(self._create, key)

    def issued(self) -> int:
        """How many runs were asked for so far (created, being created, or given up)."""
        with self.lock:
            return self.number

    def _name(self) -> tuple[str, str]:
        self.number += 1
        return self.namespaces[self.number % len(self.namespaces)], f"r{self.number:06d}"

    def _create(self, key: tuple[str, str]) -> None:
        namespace, name = key
        for attempt in range(5):
            try:
                self.admin.create(RUNS.format(ns=namespace), run_doc(name, self.shop_url))
                with self.lock:
                    self.created[name] = time.monotonic()
                return
            except Exception:
                time.sleep(0.5 * (attempt + 1))
        with self.lock:
            self.create_failures += 1
            self.in_flight.discard(key)

    def finished(self, namespace: str, name: str, phase: str) -> None:
        """A run came to rest: delete it and, while the target holds, create another."""
        key = (namespace, name)
        replacement: tuple[str, str] | None = None
        with self.lock:
            if key not in self.in_flight:
                return
            self.in_flight.discard(key)
            if phase == "Succeeded":
                self.succeeded.append(name)
            else:
                self.other_ends[name] = phase
            if len(self.in_flight) < self.target:
                replacement = self._name()
                self.in_flight.add(replacement)
        self.pool.submit(self._delete, key)
        if replacement is not None:
            self.pool.submit(self._create, replacement)

    def _delete(self, key: tuple[str, str]) -> None:
        namespace, name = key
        with contextlib.suppress(ApiError):
            self.admin.delete(
                f"{RUNS.format(ns=namespace)}/{name}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
            )

    def stop(self) -> None:
        with self.lock:
            self.target = 0
        self.pool.shutdown(wait=True, cancel_futures=True)
