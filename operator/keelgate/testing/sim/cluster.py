"""A simulated API server and kubelet, for the operator mode: the objects, their versions and
watches as a kube-apiserver keeps them, with the faults a real one shows the operator.

Why it exists: the operator's reconcilers and status writers are driven through their ports
(``keelgate.kube.controller.ports``); this implements ``ApiServer`` in the API server's terms (a
uid and a resourceVersion per change, a generation per spec change, status as a subresource
merged as a JSON merge patch, 409 for a taken name or a stale resourceVersion, 404 naming the
object) and, on virtual time, what goes wrong around it: a watch event delivered late or never
(until the next relist), a status write refused with a 409, a status write that lands with its
answer lost. Deleting an object deletes what it owns a moment later (the garbage collector). Its
kubelet starts a step process for each pod and reports its exit code; the cluster is told of
each pod deleted (``on_pod_deleted``) and of each status written (``on_status``: what people
see).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.times import stamp
from keelgate.testing.sim.world import World

JSON = dict[str, Any]


class Watcher(Protocol):
    def put(self, kind: str, body: JSON) -> None: ...

    def drop(self, kind: str, body: JSON) -> None: ...


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class SimApiServer:
    """The API server: objects by (kind, namespace, name), watched by the operators' caches."""

    def __init__(self, world: World, *, faulty: bool) -> None:
        self.world = world
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.watchers: list[Watcher] = []
        self.on_pod: Callable[[JSON], None] = lambda pod: None
        self.on_pod_deleted: Callable[[JSON], None] = lambda pod: None
        self.on_status: Callable[[str, JSON], None] = lambda kind, body: None
        self._version = 1000
        self._uid = 0
        self.faulty = faulty
        self.events: list[str] = []
        self._due: dict[int, float] = {}

    # What the operator calls (ClusterApi's interface)

    def create_object(self, kind: str, namespace: str, body: Mapping[str, Any]) -> JSON:
        return self._create(kind, namespace, body, status=None)

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> JSON:
        schedule = self.world.schedule
        found = self.objects.get((kind, namespace, name))
        if found is None:
            raise Gone(f"patch {kind} {namespace}/{name} status: 404 Not Found", named=name)
        if resource_version and resource_version != found["metadata"]["resourceVersion"]:
            raise Conflict(f"patch {kind} {namespace}/{name} status: 409 Conflict", status=409)
        if self.faulty and schedule.chance(30):
            raise Conflict(f"patch {kind} {namespace}/{name} status: 409 Conflict", status=409)
        found["status"] = merge_patch(found.get("status") or {}, dict(status))
        self._bump(found)
        answer = copy.deepcopy(found)
        self.on_status(kind, answer)
        self._tell(kind, answer)
        if self.faulty and schedule.chance(30):  # it landed; the answer did not come back
            raise ApiFailure(f"patch {kind} {namespace}/{name} status: the connection reset")
        return answer

    def delete_object(self, kind: str, namespace: str, name: str, *, uid: str = "") -> None:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            return
        if uid and found["metadata"]["uid"] != uid:
            raise Conflict(f"delete {kind} {namespace}/{name}: 409 Conflict", status=409)
        if found["metadata"].get("finalizers"):
            # Marked deleted and kept until its last finalizer goes (an Approval's, the
            # operator's: it records the decisions first).
            if not found["metadata"].get("deletionTimestamp"):
                found["metadata"]["deletionTimestamp"] = stamp(self.world.wall())
                self._bump(found)
                self._tell(kind, copy.deepcopy(found))
            return
        self._gone(kind, namespace, name, found)

    def _gone(self, kind: str, namespace: str, name: str, found: JSON) -> None:
        """The object leaves the server: watchers hear of it, and what it owned is collected."""
        del self.objects[(kind, namespace, name)]
        self._tell(kind, found, deleted=True)
        owner = found["metadata"]["uid"]
        self.world.at(
            self.world.schedule.between(0.5, 5.0),
            "the garbage collector",
            lambda: self._collect(namespace, owner),
        )

    def set_finalizers(
        self,
        kind: str,
        namespace: str,
        name: str,
        finalizers: Sequence[str],
        *,
        resource_version: str,
    ) -> JSON:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            raise Gone(f"patch {kind} {namespace}/{name}: 404 Not Found", named=name)
        if resource_version != found["metadata"]["resourceVersion"]:
            raise Conflict(f"patch {kind} {namespace}/{name}: 409 Conflict", status=409)
        meta = found["metadata"]
        if meta.get("deletionTimestamp") and set(finalizers) - set(meta.get("finalizers") or ()):
            raise ApiFailure(
                f"patch {kind} {namespace}/{name}: 422 no new finalizers can be added if the "
                "object is being deleted"
            )
        if finalizers:
            meta["finalizers"] = list(finalizers)
        else:
            meta.pop("finalizers", None)
        self._bump(found)
        answer = copy.deepcopy(found)
        if meta.get("deletionTimestamp") and not finalizers:
            self._gone(kind, namespace, name, found)
        else:
            self._tell(kind, answer)
        return answer

    def _collect(self, namespace: str, owner: str) -> None:
        """Delete what ``owner`` owned (its ownerReferences name it)."""
        for (kind, space, name), body in sorted(self.objects.items()):
            refs = body["metadata"].get("ownerReferences") or ()
            if space != namespace or not any(r.get("uid") == owner for r in refs):
                continue
            if kind == "Pod":
                self.delete_pod(namespace, name)
            else:
                self.delete_object(kind, namespace, name)

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        pod = self._create("Pod", namespace, body, status={"phase": "Pending"})
        self.on_pod(pod)
        return pod

    def read_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        found = self.objects.get(("Pod", namespace, name))
        if found is None:
            raise Gone(f"read Pod {namespace}/{name}: 404 Not Found", named=name)
        return copy.deepcopy(found)

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None:
        found = self.objects.get(("Pod", namespace, name))
        if found is None or (uid and found["metadata"]["uid"] != uid):
            return
        if found["metadata"].get("deletionTimestamp"):
            return
        found["metadata"]["deletionTimestamp"] = stamp(self.world.wall())
        self._bump(found)
        self._tell("Pod", copy.deepcopy(found))
        if (found.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.remove_pod(namespace, name)  # nothing runs in it: gone at once
        else:
            self.on_pod_deleted(copy.deepcopy(found))

    def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
        self.events.append(f"{type_} {reason}")

    # The rest of the cluster: the kubelet, people's kubectl

    def finish_pod(self, namespace: str, name: str, code: int) -> None:
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None:
            return
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": pod["metadata"]["creationTimestamp"],
            "finishedAt": stamp(self.world.wall()),
        }
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "step", "state": {"terminated": terminated}}],
        }
        self._bump(pod)
        self._tell("Pod", copy.deepcopy(pod))
        if pod["metadata"].get("deletionTimestamp"):
            self.remove_pod(namespace, name)  # its containers stopped: the kubelet removes it

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod object goes: the kubelet's last word on a deleted pod whose containers
        stopped, or the pod garbage collector's on a pod whose node is gone."""
        pod = self.objects.pop(("Pod", namespace, name), None)
        if pod is not None:
            self._tell("Pod", pod, deleted=True)

    def patch_spec(self, kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            return
        found["spec"] = merge_patch(found.get("spec") or {}, dict(spec))
        found["metadata"]["generation"] = int(found["metadata"].get("generation", 1)) + 1
        self._bump(found)
        self._tell(kind, copy.deepcopy(found))

    def replace_spec(self, kind: str, namespace: str, name: str, spec: JSON) -> None:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            return
        found["spec"] = copy.deepcopy(spec)
        found["metadata"]["generation"] = int(found["metadata"].get("generation", 1)) + 1
        self._bump(found)
        self._tell(kind, copy.deepcopy(found))

    def of_kind(self, kind: str) -> list[JSON]:
        return [copy.deepcopy(b) for (k, _, _), b in sorted(self.objects.items()) if k == kind]

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        found = self.objects.get((kind, namespace, name))
        return None if found is None else copy.deepcopy(found)

    # Plumbing

    def _create(
        self, kind: str, namespace: str, body: Mapping[str, Any], *, status: JSON | None
    ) -> JSON:
        name = str(body["metadata"]["name"])
        if (kind, namespace, name) in self.objects:
            raise Conflict(f"create {kind} {namespace}/{name}: 409 Conflict", status=409)
        stored = copy.deepcopy(dict(body))
        stored.pop("status", None)
        stored.setdefault("kind", kind)
        self._uid += 1
        stored["metadata"].update(
            namespace=namespace,
            uid=f"uid-{self._uid}",
            generation=1,
            creationTimestamp=stamp(self.world.wall()),
        )
        if status is not None:
            stored["status"] = status
        self._bump(stored)
        self.objects[(kind, namespace, name)] = stored
        answer = copy.deepcopy(stored)
        self._tell(kind, answer)
        return answer

    def _bump(self, body: JSON) -> None:
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)

    def _tell(self, kind: str, body: JSON, *, deleted: bool = False) -> None:
        """Each watcher hears of the change at once, a little later, or (a dropped event)
        never: its next relist brings it."""
        world = self.world
        schedule = world.schedule
        for watcher in list(self.watchers):
            late = schedule.between(0.1, 5.0) if self.faulty and schedule.chance(150) else 0.0
            if self.faulty and schedule.chance(40):
                continue
            told = copy.deepcopy(body)

            def tell(watcher: Watcher = watcher, told: JSON = told) -> None:
                if watcher in self.watchers:
                    (watcher.drop if deleted else watcher.put)(kind, told)

            # One stream per watcher: a late event holds back those after it (in order).
            due = max(world.now + late, self._due.get(id(watcher), 0.0))
            if due > world.now:
                self._due[id(watcher)] = due
                world.at(due - world.now, "a watch event", tell)
            else:
                tell()
