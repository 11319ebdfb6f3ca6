"""The simulated API server, for the operator mode: the API server in memory
(``keelgate.testing.apiserver``) on virtual time, with the faults a real one shows the operator.

Why it exists: the operator's reconcilers and status writers are driven through their ports
(``keelgate.kube.controller.ports``) against the API server the unit tests use too; what this
adds is what goes wrong around it, drawn from the world's schedule: a watch event delivered
late or never (until the next relist), a status write refused with a 409, a status write that
lands with its answer lost. Deleting an object deletes what it owns a moment later (the garbage
collector), and an object created for an owner already gone goes the same way. Its timestamps
read the world's wall clock and its uids are numbered, so a seed replays. It must never draw
from anything but the world's schedule.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from keelgate.testing.apiserver import JSON, MemoryApiServer, Watcher
from keelgate.testing.sim.world import World

__all__ = ["JSON", "SimApiServer"]


class SimApiServer(MemoryApiServer):
    """The API server, watched by the operators' caches; ``faulty``: with the faults above."""

    def __init__(self, world: World, *, faulty: bool, cluster: str = "") -> None:
        numbers = itertools.count(1)
        # A uid is unique across clusters too (the real server's are random UUIDs): two
        # clusters' objects never share one, so each cluster's uids are its own.
        prefix = f"{cluster}-" if cluster else ""
        super().__init__(clock=world.wall, uids=lambda: f"{prefix}uid-{next(numbers)}")
        self.world = world
        self.faulty = faulty
        self._due: dict[int, float] = {}

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod object goes, when the simulated kubelet or pod garbage collector says so."""
        self.remove("Pod", namespace, name)

    def _conflicts(self, what: str) -> bool:
        return self.faulty and self.world.schedule.chance(30)

    def _answer_lost(self, what: str) -> bool:
        return self.faulty and self.world.schedule.chance(30)

    def _create(
        self, kind: str, namespace: str, body: Mapping[str, Any], *, status: JSON | None, verb: str
    ) -> JSON:
        """As the API server creates it; an object whose owner is gone already (an operator's
        stale cache made a pod for a run deleted meanwhile) is the garbage collector's too: it
        sees the dependent, looks its owner up, finds no object of that uid, and deletes the
        dependent, as it does for any dangling owner reference."""
        created = super()._create(kind, namespace, body, status=status, verb=verb)
        with self._lock:
            present = {
                b["metadata"]["uid"]
                for (_, space, _), b in self.objects.items()
                if space == namespace
            }
        for reference in created["metadata"].get("ownerReferences") or ():
            if reference.get("uid") not in present:
                self._owner_deleted(namespace, str(reference.get("uid")))
        return created

    def _owner_deleted(self, namespace: str, owner: str) -> None:
        self.world.at(
            self.world.schedule.between(0.5, 5.0),
            "the garbage collector",
            lambda: self.collect_owned(namespace, owner),
        )

    def _deliver(self, watcher: Watcher, kind: str, body: JSON, *, deleted: bool) -> None:
        """The watcher hears of the change at once, a little later, or (a dropped event)
        never: its next relist brings it."""
        world = self.world
        schedule = world.schedule
        late = schedule.between(0.1, 5.0) if self.faulty and schedule.chance(150) else 0.0
        if self.faulty and schedule.chance(40):
            return
        told = copy.deepcopy(body)

        def tell() -> None:
            if watcher in self.watchers:
                (watcher.drop if deleted else watcher.put)(kind, told)

        # One stream per watcher: a late event holds back those after it (in order).
        due = max(world.now + late, self._due.get(id(watcher), 0.0))
        if due > world.now:
            self._due[id(watcher)] = due
            world.at(due - world.now, "a watch event", tell)
        else:
            tell()
