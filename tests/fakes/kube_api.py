"""An API server in memory for the operator's unit tests: ``ClusterApi``'s methods, the API
server's answers.

The controller talks to the cluster only through the ``ApiServer`` seam
(``keelgate.kube.controller.ports``); this fake implements it with what a kube-apiserver does
that the controller can see: a uid, a resourceVersion that grows with every change, a generation
and a creation time on each new object; ``status`` as a subresource (a create drops it, a status
patch is a JSON merge patch guarded by ``resourceVersion``); 409 ``Conflict`` for a name taken
or a stale patch, 404 ``Gone`` naming the object for one that is not there; a graceful pod
deletion that sets ``deletionTimestamp`` and leaves the pod until its kubelet is done; a custom
object with finalizers likewise marked deleted and kept until its last finalizer goes. What it
changes it tells a ``watch`` (a real ``Cache``, as kopf's watch streams would), at once. The
kubelet's part (a pod running, ending with an exit code) is ``finish_pod``, a person's edits are
``patch_spec``. No cluster is needed, and every decision of the controller runs in milliseconds;
the e2e suite proves the same on a real API server.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.controller.ports import ApiServer
from keelgate.kube.naming import RUN_LABEL, STEP_POD_LABEL, STEP_POD_NAME

# RFC 7386 JSON merge patch (what ``patch_status`` sends as application/merge-patch+json): the
# simulator's API server applies it too.
from keelgate.testing.sim.cluster import merge_patch

JSON = dict[str, Any]


class Watch(Protocol):
    def put(self, kind: str, body: JSON) -> None: ...

    def drop(self, kind: str, body: JSON) -> None: ...


@dataclass(frozen=True)
class PostedEvent:
    """A core/v1 Event as the operator posted it."""

    about: str  # the involved object's name
    kind: str  # the involved object's kind
    type: str  # Normal or Warning
    reason: str
    message: str


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApiServer(ApiServer):
    """Objects by (kind, namespace, name); ``writes`` lists every write as ``verb Kind name``."""

    def __init__(self, *, watch: Watch | None = None) -> None:
        self.watch = watch
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.events: list[PostedEvent] = []
        self.writes: list[str] = []
        self._versions = itertools.count(1000)
        self._lock = threading.Lock()
        #: Answers to give instead of doing the next write of a verb ("patch_status", ...).
        self.refuse_next: dict[str, Exception] = {}
        #: Answers to give instead of every call of a verb, until removed (a quota, a policy).
        self.refuse_always: dict[str, Exception] = {}

    # What the operator calls (ClusterApi's interface)

    def create_object(self, kind: str, namespace: str, body: Mapping[str, Any]) -> JSON:
        return self._create(kind, namespace, body, status=None, verb="create_object")

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> JSON:
        with self._lock:
            self._refused("patch_status")
            self.writes.append(f"patch {kind}/status {name}")
            found = self.objects.get((kind, namespace, name))
            if found is None:
                raise Gone(f"patch {kind} {namespace}/{name} status: 404 Not Found", named=name)
            if resource_version and resource_version != found["metadata"]["resourceVersion"]:
                raise Conflict(f"patch {kind} {namespace}/{name} status: 409 Conflict", status=409)
            found["status"] = merge_patch(found.get("status") or {}, dict(status))
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell(kind, answer)
        return answer

    def delete_object(self, kind: str, namespace: str, name: str, *, uid: str = "") -> None:
        with self._lock:
            self._refused("delete_object")
            self.writes.append(f"delete {kind} {name}")
            found = self.objects.get((kind, namespace, name))
            if found is None:
                return  # ClusterApi takes a 404 as done
            if uid and found["metadata"]["uid"] != uid:
                raise Conflict(f"delete {kind} {namespace}/{name}: 409 Conflict", status=409)
            if found["metadata"].get("finalizers"):
                # As the API server does: the object stays, marked, until its finalizers go.
                if not found["metadata"].get("deletionTimestamp"):
                    found["metadata"]["deletionTimestamp"] = _now()
                    self._bump(found)
                answer = copy.deepcopy(found)
                deleted = False
            else:
                del self.objects[(kind, namespace, name)]
                answer, deleted = found, True
        self._tell(kind, answer, deleted=deleted)

    def set_finalizers(
        self,
        kind: str,
        namespace: str,
        name: str,
        finalizers: Sequence[str],
        *,
        resource_version: str,
    ) -> JSON:
        with self._lock:
            self._refused("set_finalizers")
            self.writes.append(f"patch {kind}/finalizers {name}")
            found = self.objects.get((kind, namespace, name))
            if found is None:
                raise Gone(f"patch {kind} {namespace}/{name}: 404 Not Found", named=name)
            if resource_version != found["metadata"]["resourceVersion"]:
                raise Conflict(f"patch {kind} {namespace}/{name}: 409 Conflict", status=409)
            meta = found["metadata"]
            added = set(finalizers) - set(meta.get("finalizers") or ())
            if meta.get("deletionTimestamp") and added:
                raise ApiFailure(
                    f"patch {kind} {namespace}/{name}: 422 no new finalizers can be added if "
                    "the object is being deleted"
                )
            meta["finalizers"] = list(finalizers)
            if not finalizers:
                del meta["finalizers"]
            self._bump(found)
            answer = copy.deepcopy(found)
            gone = bool(meta.get("deletionTimestamp")) and not finalizers
            if gone:
                del self.objects[(kind, namespace, name)]
        self._tell(kind, answer, deleted=gone)
        return answer

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        return self._create("Pod", namespace, body, status={"phase": "Pending"}, verb="create_pod")

    def read_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        with self._lock:
            found = self.objects.get(("Pod", namespace, name))
            if found is None:
                raise Gone(f"read Pod {namespace}/{name}: 404 Not Found", named=name)
            return copy.deepcopy(found)

    def running_step_pods(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> list[str]:
        """The names of the step pods neither succeeded nor failed (one list request, as
        ClusterApi's)."""
        with self._lock:
            return [
                str(pod["metadata"]["name"])
                for (kind, ns, _), pod in sorted(self.objects.items())
                if kind == "Pod"
                and (namespace is None or ns == namespace)
                and pod["metadata"].get("labels", {}).get(STEP_POD_LABEL) == STEP_POD_NAME
                and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]

    def list_all(
        self, kind: str, namespace: str | None = None, *, page: int = 500, timeout: float = 60
    ) -> list[JSON]:
        """Every object of a kind (pods: those labelled with a run), as ClusterApi lists them;
        ``refuse_next["list_all"]`` answers one list with an error instead."""
        with self._lock:
            self._refused("list_all")
            return [
                copy.deepcopy(body)
                for (k, ns, _), body in sorted(self.objects.items())
                if k == kind
                and (namespace is None or ns == namespace)
                and (kind != "Pod" or RUN_LABEL in body["metadata"].get("labels", {}))
            ]

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None:
        with self._lock:
            self.writes.append(f"delete Pod {name}")
            found = self.objects.get(("Pod", namespace, name))
            # Gone already, or a newer pod of that name: ClusterApi takes both as done.
            if found is None or (uid and found["metadata"]["uid"] != uid):
                return
            found["metadata"].setdefault("deletionTimestamp", _now())
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell("Pod", answer)

    def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
        with self._lock:
            self.writes.append(f"create Event {reason}")
            meta = involved.get("metadata", {})
            self.events.append(
                PostedEvent(
                    str(meta.get("name")), str(involved.get("kind")), type_, reason, message[:1024]
                )
            )

    def read_config_map(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            self._refused("read_config_map")
            found = self.objects.get(("ConfigMap", namespace, name))
            return None if found is None else copy.deepcopy(found)

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """A merge patch of the ConfigMap's data, or its creation (as ClusterApi's). No watch
        is told: the operator does not watch ConfigMaps."""
        with self._lock:
            self._refused("write_config_map")
            self.writes.append(f"patch ConfigMap {name}")
            found = self.objects.get(("ConfigMap", namespace, name))
            if found is None:
                found = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
                    "data": {},
                }
                self.objects[("ConfigMap", namespace, name)] = found
            found["data"] = {**found.get("data", {}), **dict(data)}
            self._bump(found)

    # What the rest of the cluster does

    def finish_pod(self, namespace: str, name: str, exit_code: int, *, message: str = "") -> JSON:
        """The kubelet: the pod's container ran and exited with ``exit_code``."""
        with self._lock:
            pod = self.objects[("Pod", namespace, name)]
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": pod["metadata"]["creationTimestamp"],
                "finishedAt": _now(),
            }
            if message:
                terminated["message"] = message
            pod["status"] = {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [{"name": "step", "state": {"terminated": terminated}}],
            }
            self._bump(pod)
            answer = copy.deepcopy(pod)
        self._tell("Pod", answer)
        return answer

    def start_pod(self, namespace: str, name: str) -> JSON:
        """The kubelet: the pod's container is running."""
        with self._lock:
            pod = self.objects[("Pod", namespace, name)]
            pod["status"] = {"phase": "Running"}
            self._bump(pod)
            answer = copy.deepcopy(pod)
        self._tell("Pod", answer)
        return answer

    def remove(self, kind: str, namespace: str, name: str, *, tell: bool = True) -> JSON:
        """The object is gone from the server (deleted by someone, garbage-collected); with
        ``tell`` false, no watch hears of it (it was away)."""
        with self._lock:
            body = self.objects.pop((kind, namespace, name))
        if tell:
            self._tell(kind, body, deleted=True)
        return body

    def patch_spec(self, kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON:
        """A person's ``kubectl patch --type merge`` of the spec (the generation moves)."""
        with self._lock:
            found = self.objects[(kind, namespace, name)]
            found["spec"] = merge_patch(found.get("spec") or {}, dict(spec))
            found["metadata"]["generation"] = int(found["metadata"].get("generation", 1)) + 1
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell(kind, answer)
        return answer

    def patch_metadata(self, kind: str, namespace: str, name: str, meta: Mapping[str, Any]) -> JSON:
        """A person's edit of labels or annotations (the generation stays)."""
        with self._lock:
            found = self.objects[(kind, namespace, name)]
            found["metadata"] = merge_patch(found["metadata"], dict(meta))
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell(kind, answer)
        return answer

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        with self._lock:
            found = self.objects.get((kind, namespace, name))
            return None if found is None else copy.deepcopy(found)

    def of_kind(self, kind: str) -> list[JSON]:
        with self._lock:
            return [copy.deepcopy(b) for (k, _, _), b in sorted(self.objects.items()) if k == kind]

    def reasons(self) -> list[str]:
        return [event.reason for event in self.events]

    # Plumbing

    def _create(
        self, kind: str, namespace: str, body: Mapping[str, Any], *, status: JSON | None, verb: str
    ) -> JSON:
        with self._lock:
            self._refused(verb)
            name = str(body["metadata"]["name"])
            self.writes.append(f"create {kind} {name}")
            if (kind, namespace, name) in self.objects:
                raise Conflict(f"create {kind} {namespace}/{name}: 409 Conflict", status=409)
            stored = copy.deepcopy(dict(body))
            stored.pop("status", None)  # a subresource: a create cannot set it
            stored.setdefault("kind", kind)
            meta = stored["metadata"]
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp=_now(),
            )
            if status is not None:
                stored["status"] = status
            self._bump(stored)
            self.objects[(kind, namespace, name)] = stored
            answer = copy.deepcopy(stored)
        self._tell(kind, answer)
        return answer

    def _bump(self, body: JSON) -> None:
        body["metadata"]["resourceVersion"] = str(next(self._versions))

    def _refused(self, verb: str) -> None:
        refusal = self.refuse_next.pop(verb, None) or self.refuse_always.get(verb)
        if refusal is not None:
            raise refusal

    def _tell(self, kind: str, body: JSON, *, deleted: bool = False) -> None:
        if self.watch is None:
            return
        if deleted:
            self.watch.drop(kind, copy.deepcopy(body))
        else:
            self.watch.put(kind, copy.deepcopy(body))
