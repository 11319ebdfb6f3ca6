"""An API server in memory, for the operator's unit tests and the simulator alike: the
``ApiServer`` port (``keelgate.kube.controller.ports``) answered as a kube-apiserver answers it.

Why it exists: the controller talks to the cluster only through that port, and neither a unit
test nor a simulated run has a cluster. One implementation, so that the two agree with each
other and with the real server on what the controller can see: a uid, a resourceVersion that
grows with every change (one counter for the server, as etcd's revision), a generation and a
creation time on each new object and a generation more for each change of its spec; the field
managers' records of the writes other than status (``metadata.managedFields``: per manager, the
time of its last write in whole seconds, as the server keeps them); ``status``
as a subresource (a create drops it, a status patch is an RFC 7386 JSON merge patch guarded by
``resourceVersion``); 409 ``Conflict`` for a name taken, a stale patch or a delete whose uid is
not the object's; 404 ``Gone`` naming the object; a graceful pod deletion that sets
``deletionTimestamp`` once and leaves the pod until its kubelet is done with it, and an object
with finalizers likewise marked and kept until its last finalizer goes. Each change is
told to every ``Watcher`` (a cache, as kopf's watch streams tell it), at once.

Around it, what the rest of a cluster does: the kubelet (``start_pod``, ``finish_pod``,
``remove``), people's ``kubectl patch`` and ``replace`` (``patch_spec``, ``patch_metadata``,
``replace_spec``) and the garbage collector (``collect_owned``), with hooks for whoever plays
the kubelet (``on_pod``, ``on_pod_deleted``) and people (``on_status``). What goes wrong is the
caller's choice: ``refuse_next`` and ``refuse_always`` answer a call with an error (the unit
tests); a subclass may refuse a write with a 409, lose a write's answer, tell a watcher late or
never and collect a deleted owner's objects later (the simulator's
``keelgate.testing.sim.cluster``). It must never import the simulator or the tests, nor talk to
a real cluster.

Why one module past 500 lines: the objects, the one resourceVersion counter and the watchers are
one server's state, and every verb and every actor around it (the kubelet, people, the garbage
collector) changes that state through the same few steps (``_create``, ``_edit``, ``_bump``,
``_tell``); read apart, a verb would sit away from the rules it must keep.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.controller.ports import ApiServer
from keelgate.kube.naming import RUN_LABEL, STEP_POD_LABEL, STEP_POD_NAME
from keelgate.kube.times import stamp

JSON = dict[str, Any]
#: The phases of a pod whose containers have all stopped.
ENDED = ("Succeeded", "Failed")


class Watcher(Protocol):
    """Who watches the server (the operator's cache): told of each object changed or gone."""

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


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (application/merge-patch+json): a null removes a key."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _requirements(selector: str) -> list[str]:
    """A label selector's requirements: split at the commas outside ``in (...)``."""
    found, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            found.append(current.strip())
            current = ""
        else:
            current += char
    return [r for r in [*found, current.strip()] if r]


def _matches(requirement: str, labels: Mapping[str, Any]) -> bool:
    """Whether ``labels`` meet one requirement of a label selector."""
    if requirement.startswith("!"):
        return requirement[1:].strip() not in labels
    if " in " in requirement:
        key, _, values = requirement.partition(" in ")
        allowed = {v.strip() for v in values.strip().strip("()").split(",")}
        return key.strip() in labels and str(labels[key.strip()]) in allowed
    if "=" in requirement:
        key, _, value = requirement.partition("=")
        return str(labels.get(key.strip())) == value.strip() and key.strip() in labels
    return requirement in labels


def _heard(body: JSON) -> None:
    """A hook nobody listens to."""


def _random_uid() -> str:
    return str(uuid.uuid4())


class MemoryApiServer(ApiServer):
    """Objects by (kind, namespace, name); ``writes`` lists every write as ``verb Kind name``,
    ``events`` every Event posted.

    ``clock``: the wall clock its timestamps read (POSIX seconds); ``uids``: where each new
    object's uid comes from (random, as the real server's, unless a run must replay)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        uids: Callable[[], str] = _random_uid,
    ) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.watchers: list[Watcher] = []
        self.events: list[PostedEvent] = []
        self.writes: list[str] = []
        #: Answers to give instead of doing the next call of a verb ("patch_status", ...).
        self.refuse_next: dict[str, Exception] = {}
        #: Answers to give instead of every call of a verb, until removed (a quota, a policy).
        self.refuse_always: dict[str, Exception] = {}
        #: The kubelet hears of each pod created, and of each one deleted while it may still run.
        self.on_pod: Callable[[JSON], None] = _heard
        self.on_pod_deleted: Callable[[JSON], None] = _heard
        #: People see each status written (``kind``, the object as written).
        self.on_status: Callable[[str, JSON], None] = lambda kind, body: None
        self._clock = clock
        self._uids = uids
        self._version = 1000
        self._lock = threading.RLock()

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
        what = f"patch {kind} {namespace}/{name} status"
        with self._lock:
            self._refused("patch_status")
            self.writes.append(f"patch {kind}/status {name}")
            found = self._found(kind, namespace, name, what)
            stale = resource_version and resource_version != found["metadata"]["resourceVersion"]
            if stale or self._conflicts(what):
                raise Conflict(f"{what}: 409 Conflict", status=409)
            found["status"] = merge_patch(found.get("status") or {}, dict(status))
            self._bump(found)
            answer = copy.deepcopy(found)
        self.on_status(kind, answer)
        self._tell(kind, answer)
        if self._answer_lost(what):
            raise ApiFailure(f"{what}: the connection reset")
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
            meta = found["metadata"]
            if meta.get("finalizers"):
                # As the API server does: the object stays, marked once (a second delete
                # changes nothing, and no watcher hears of it), until its last finalizer goes
                # (an Approval's is the operator's: it records decisions first). Marking it
                # moves a custom object's generation, as kube-apiserver's markAsDeleting does.
                if meta.get("deletionTimestamp"):
                    return
                meta["deletionTimestamp"] = stamp(self._clock())
                if meta.get("generation"):
                    meta["generation"] = int(meta["generation"]) + 1
                self._bump(found)
                marked = copy.deepcopy(found)
            else:
                del self.objects[(kind, namespace, name)]
                marked = None
        if marked is not None:
            self._tell(kind, marked)
        else:
            self._gone(kind, namespace, found)

    def set_finalizers(
        self,
        kind: str,
        namespace: str,
        name: str,
        finalizers: Sequence[str],
        *,
        resource_version: str,
    ) -> JSON:
        what = f"patch {kind} {namespace}/{name}"
        with self._lock:
            self._refused("set_finalizers")
            self.writes.append(f"patch {kind}/finalizers {name}")
            found = self._found(kind, namespace, name, what)
            if resource_version != found["metadata"]["resourceVersion"]:
                raise Conflict(f"{what}: 409 Conflict", status=409)
            meta = found["metadata"]
            if meta.get("deletionTimestamp") and set(finalizers) - set(
                meta.get("finalizers") or ()
            ):
                raise ApiFailure(
                    f"{what}: 422 no new finalizers can be added if the object is being deleted",
                    status=422,
                )
            if finalizers:
                meta["finalizers"] = list(finalizers)
            else:
                meta.pop("finalizers", None)
            self._managed(found, "keelgate")
            self._bump(found)
            answer = copy.deepcopy(found)
            gone = bool(meta.get("deletionTimestamp")) and not finalizers
            if gone:
                del self.objects[(kind, namespace, name)]
        if gone:
            self._gone(kind, namespace, answer)
        else:
            self._tell(kind, answer)
        return answer

    def label(self, kind: str, namespace: str, name: str, labels: Mapping[str, str]) -> JSON:
        with self._lock:
            self._refused("label")
            self.writes.append(f"patch {kind}/labels {name}")
        return self.patch_metadata(kind, namespace, name, {"labels": dict(labels)})

    def _gone(self, kind: str, namespace: str, body: JSON) -> None:
        """The object has left the server: watchers hear of it, and what it owned is collected."""
        self._tell(kind, body, deleted=True)
        self._owner_deleted(namespace, str(body["metadata"]["uid"]))

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        pod = self._create("Pod", namespace, body, status={"phase": "Pending"}, verb="create_pod")
        self.on_pod(pod)
        return pod

    def read_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        with self._lock:
            self._refused("read_pod")
            found = self._found("Pod", namespace, name, f"read Pod {namespace}/{name}")
            return copy.deepcopy(found)

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None:
        with self._lock:
            self._refused("delete_pod")
            self.writes.append(f"delete Pod {name}")
            found = self.objects.get(("Pod", namespace, name))
            # Gone already, a newer pod of that name (ClusterApi takes both as done), or being
            # deleted already (a second graceful delete changes nothing).
            if found is None or (uid and found["metadata"]["uid"] != uid):
                return
            if found["metadata"].get("deletionTimestamp"):
                return
            found["metadata"]["deletionTimestamp"] = stamp(self._clock())
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell("Pod", answer)
        if (answer.get("status") or {}).get("phase") in ENDED:
            self.remove("Pod", namespace, name)  # nothing runs in it: its kubelet removes it
        else:
            self.on_pod_deleted(answer)

    def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
        with self._lock:
            self._refused("event")
            self.writes.append(f"create Event {reason}")
            meta = involved.get("metadata", {})
            # ClusterApi cuts the message to 1024 characters, as kubectl's recorder does.
            about, kind = str(meta.get("name")), str(involved.get("kind"))
            self.events.append(PostedEvent(about, kind, type_, reason, message[:1024]))

    # ClusterApi's other calls (the operator's start, its resync, the notifier's ConfigMap)

    def running_step_pods(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> list[str]:
        """The names of the step pods neither succeeded nor failed (one list request, as
        ClusterApi's)."""
        with self._lock:
            self._refused("running_step_pods")
            return [
                str(pod["metadata"]["name"])
                for (kind, ns, _), pod in sorted(self.objects.items())
                if kind == "Pod"
                and (namespace is None or ns == namespace)
                and pod["metadata"].get("labels", {}).get(STEP_POD_LABEL) == STEP_POD_NAME
                and (pod.get("status") or {}).get("phase") not in ENDED
            ]

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        selector: str = "",
        page: int = 500,
        timeout: float = 60,
    ) -> list[JSON]:
        """Every object of ``kind`` (in ``namespace``; None: every one) whose labels match
        ``selector``, as ``ClusterApi.list_all`` lists them: a pod only when it is a run's, and
        a selector of comma-separated requirements (``key``, ``!key``, ``key=value``, ``key in
        (a,b)``), as the API server reads it."""
        required = [RUN_LABEL] if kind == "Pod" else []
        required += _requirements(selector)
        with self._lock:
            self._refused("list_all")
            return [
                copy.deepcopy(body)
                for (k, ns, _), body in sorted(self.objects.items())
                if k == kind
                and (namespace is None or ns == namespace)
                and all(_matches(req, body["metadata"].get("labels") or {}) for req in required)
            ]

    def read_config_map(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            self._refused("read_config_map")
            return self.get("ConfigMap", namespace, name)

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """A merge patch of the ConfigMap's data, or its creation (as ClusterApi's). No watcher
        is told: the operator does not watch ConfigMaps."""
        with self._lock:
            self._refused("write_config_map")
            self.writes.append(f"patch ConfigMap {name}")
            found = self.objects.setdefault(
                ("ConfigMap", namespace, name),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "uid": self._uids(),
                        "creationTimestamp": stamp(self._clock()),
                    },
                    "data": {},
                },
            )
            found["data"] = merge_patch(found.get("data") or {}, dict(data))
            self._bump(found)

    # The kubelet

    def start_pod(self, namespace: str, name: str) -> JSON:
        """The pod's container is running."""
        running = {"phase": "Running"}
        return self._edit("Pod", namespace, name, lambda pod: pod.update(status=running))

    def finish_pod(
        self, namespace: str, name: str, exit_code: int, *, message: str = ""
    ) -> JSON | None:
        """The pod's container exited with ``exit_code`` (its termination ``message``): the pod
        as it ended, which is removed if it was being deleted; None if the pod is gone."""

        def ended(pod: JSON) -> None:
            terminated = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": pod["metadata"]["creationTimestamp"],
                "finishedAt": stamp(self._clock()),
            }
            if message:
                terminated["message"] = message
            pod["status"] = {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": [{"name": "step", "state": {"terminated": terminated}}],
            }

        try:
            answer = self._edit("Pod", namespace, name, ended)
        except Gone:
            return None  # removed already (its node's pods collected)
        if answer["metadata"].get("deletionTimestamp"):
            self.remove("Pod", namespace, name)  # its containers stopped: its kubelet removes it
        return answer

    def remove(self, kind: str, namespace: str, name: str, *, tell: bool = True) -> JSON | None:
        """The object is gone from the server: a deleted pod's kubelet's last word, the pod
        garbage collector's on a pod whose node is gone, or anyone's. With ``tell`` false, no
        watcher hears of it (it was away). None if it was gone already."""
        with self._lock:
            body = self.objects.pop((kind, namespace, name), None)
        if body is not None and tell:
            self._tell(kind, body, deleted=True)
        return body

    # The garbage collector

    def collect_owned(self, namespace: str, owner: str) -> None:
        """Delete what the object of uid ``owner`` owned (its ownerReferences name it)."""
        with self._lock:
            owned = [
                (kind, name)
                for (kind, space, name), body in sorted(self.objects.items())
                if space == namespace and any(r.get("uid") == owner for r in _owners(body))
            ]
        for kind, name in owned:
            if kind == "Pod":
                self.delete_pod(namespace, name)
            else:
                self.delete_object(kind, namespace, name)

    # People, through kubectl

    def patch_spec(self, kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON:
        """``kubectl patch --type merge`` of the spec (the generation moves)."""
        return self._edit(
            kind,
            namespace,
            name,
            lambda found: _respec(found, merge_patch(found.get("spec"), spec)),
        )

    def replace_spec(self, kind: str, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON:
        """``kubectl replace`` of the spec with ``spec`` (the generation moves)."""
        return self._edit(
            kind, namespace, name, lambda found: _respec(found, copy.deepcopy(dict(spec)))
        )

    def patch_metadata(self, kind: str, namespace: str, name: str, meta: Mapping[str, Any]) -> JSON:
        """An edit of labels or annotations (the generation stays)."""
        return self._edit(
            kind,
            namespace,
            name,
            lambda found: found.update(metadata=merge_patch(found["metadata"], meta)),
        )

    # What anyone reads

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        with self._lock:
            found = self.objects.get((kind, namespace, name))
            return None if found is None else copy.deepcopy(found)

    def of_kind(self, kind: str) -> list[JSON]:
        with self._lock:
            return [copy.deepcopy(b) for (k, _, _), b in sorted(self.objects.items()) if k == kind]

    def reasons(self) -> list[str]:
        """The reasons of the Events posted, in order."""
        return [event.reason for event in self.events]

    # What may go wrong: nothing, unless a subclass says so

    def _conflicts(self, what: str) -> bool:
        """Whether the write ``what`` is refused with a 409 though it would land."""
        return False

    def _answer_lost(self, what: str) -> bool:
        """Whether the write ``what``, landed, loses its answer on the way back."""
        return False

    def _deliver(self, watcher: Watcher, kind: str, body: JSON, *, deleted: bool) -> None:
        """Tell ``watcher`` of a change: at once."""
        (watcher.drop if deleted else watcher.put)(kind, copy.deepcopy(body))

    def _owner_deleted(self, namespace: str, owner: str) -> None:
        """The object of uid ``owner`` is gone: no garbage collector runs here (a test removes
        what it wants gone)."""

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
            stored["metadata"].update(
                namespace=namespace,
                uid=self._uids(),
                generation=1,
                creationTimestamp=stamp(self._clock()),
            )
            if status is not None:
                stored["status"] = status
            self._managed(stored, "creator")
            self._bump(stored)
            self.objects[(kind, namespace, name)] = stored
            answer = copy.deepcopy(stored)
        self._tell(kind, answer)
        return answer

    def _edit(self, kind: str, namespace: str, name: str, change: Callable[[JSON], None]) -> JSON:
        """``change`` the object in place: a new resourceVersion, every watcher told."""
        with self._lock:
            found = self._found(kind, namespace, name, f"patch {kind} {namespace}/{name}")
            change(found)
            self._managed(found, "kubectl")
            self._bump(found)
            answer = copy.deepcopy(found)
        self._tell(kind, answer)
        return answer

    def _found(self, kind: str, namespace: str, name: str, what: str) -> JSON:
        found = self.objects.get((kind, namespace, name))
        if found is None:
            raise Gone(f"{what}: 404 Not Found", named=name)
        return found

    def _managed(self, body: JSON, manager: str) -> None:
        """Record a write of ``body`` other than its status by ``manager`` (its field manager's
        entry, time in whole seconds on this server's clock), as the server does for every
        create, update and patch: a decision's entry was made no later than the last one."""
        records = [
            r for r in body["metadata"].get("managedFields") or () if r.get("manager") != manager
        ]
        records.append(
            {
                "manager": manager,
                "operation": "Update",
                "time": stamp(self._clock()),
                "fieldsType": "FieldsV1",
            }
        )
        body["metadata"]["managedFields"] = records

    def _bump(self, body: JSON) -> None:
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)

    def _refused(self, verb: str) -> None:
        refusal = self.refuse_next.pop(verb, None) or self.refuse_always.get(verb)
        if refusal is not None:
            raise refusal

    def _tell(self, kind: str, body: JSON, *, deleted: bool = False) -> None:
        for watcher in list(self.watchers):
            self._deliver(watcher, kind, body, deleted=deleted)


def _owners(body: JSON) -> list[JSON]:
    return list(body["metadata"].get("ownerReferences") or ())


def _respec(found: JSON, spec: Any) -> None:
    """A new spec: the generation moves, even for a spec equal to the old one (a real API
    server's would stay, and so would its resourceVersion)."""
    found["spec"] = spec
    found["metadata"]["generation"] = int(found["metadata"].get("generation", 1)) + 1
