"""coordination.k8s.io/v1 Leases over real HTTP on loopback, for the leader election's tests.

No API server runs in the unit tests, and the election is the official ``kubernetes`` client's:
it must talk to something that answers as kube-apiserver does, on the wire. This fake keeps
Leases in memory and serves the four requests the client's Lease lock makes (and the list and
delete of the shard Leases), with the API server's semantics: a create gets a uid, a creation
time and a resourceVersion (409 AlreadyExists if the name is taken); a read of a missing Lease
is 404 NotFound as a ``Status``; a replace must carry the current resourceVersion (409
Conflict, "the object has been modified", otherwise) and gets a new one; a delete may name the
resourceVersion it expects (409 otherwise). Holder, durations and times are the client's to
write and the server's to keep as written: the election itself is client-side, as in
Kubernetes.

Each replica under test talks through a door of its own (``LeaseApi.door``), so a test can cut
one replica off while the other still reaches the same Leases: a door refuses (HTTP 500, an
``InternalError`` Status, as an API server whose etcd times out), drops the connection
without an answer, or hangs (reads the request and never answers).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
import re
import threading
import uuid
from typing import Any

from fakes.loopback import Answer, LoopbackServer, Received

JSON = dict[str, Any]
GROUP = "coordination.k8s.io"
_PATH = re.compile(
    r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/?]+))?"
    r"(?:\?.*)?$"
)
#: What a door does with every request: answer, refuse, drop, hang.
TROUBLES = ("", "refuse", "drop", "hang")


def _status(code: int, reason: str, message: str, name: str = "") -> Answer:
    """A ``metav1.Status`` failure, as the API server sends it."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "group": GROUP, "kind": "leases"}
    return Answer(code, body)


class LeaseApi:
    """The Leases, shared by every door."""

    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], JSON] = {}
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self._doors: list[LeaseDoor] = []
        #: (holderIdentity written, resourceVersion) for every successful create and replace.
        self.writes: list[tuple[str, str]] = []

    def door(self) -> LeaseDoor:
        """A new way in (one per replica): its own port, its own trouble."""
        door = LeaseDoor(self).start()
        assert isinstance(door, LeaseDoor)
        self._doors.append(door)
        return door

    def get(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            found = self._leases.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def close(self) -> None:
        for door in self._doors:
            door.stop()

    def handle(self, method: str, namespace: str, name: str | None, body: Any) -> Answer:
        with self._lock:
            if method == "GET" and name:
                found = self._leases.get((namespace, name))
                if found is None:
                    return _status(404, "NotFound", f'leases.{GROUP} "{name}" not found', name=name)
                return Answer(200, found)
            if method == "GET":
                items = [
                    copy.deepcopy(v)
                    for (ns, _), v in sorted(self._leases.items())
                    if ns == namespace
                ]
                version = str(next(self._versions))
                listed = {"kind": "LeaseList", "apiVersion": f"{GROUP}/v1", "items": items}
                return Answer(200, {**listed, "metadata": {"resourceVersion": version}})
            if method == "DELETE" and name:
                return self._delete(namespace, name, body)
            if method == "POST" and name is None:
                return self._create(namespace, body)
            if method == "PUT" and name:
                return self._replace(namespace, name, body)
        return _status(405, "MethodNotAllowed", f"{method} is not supported here")

    def _create(self, namespace: str, body: Any) -> Answer:
        if not isinstance(body, dict) or body.get("kind", "Lease") != "Lease":
            return _status(400, "BadRequest", "the body is not a Lease")
        meta = body.get("metadata") or {}
        name = meta.get("name", "")
        if not name:
            return _status(422, "Invalid", "Lease.coordination.k8s.io is invalid: metadata.name")
        if (namespace, name) in self._leases:
            return _status(409, "AlreadyExists", f'leases.{GROUP} "{name}" already exists', name)
        stored = {
            "kind": "Lease",
            "apiVersion": f"{GROUP}/v1",
            "metadata": {
                **meta,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(next(self._versions)),
                "creationTimestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": body.get("spec") or {},
        }
        self._leases[(namespace, name)] = stored
        self._wrote(stored)
        return Answer(201, stored)

    def _delete(self, namespace: str, name: str, body: Any) -> Answer:
        current = self._leases.get((namespace, name))
        if current is None:
            return _status(404, "NotFound", f'leases.{GROUP} "{name}" not found', name=name)
        wanted = ((body or {}).get("preconditions") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.{GROUP} "{name}": the precondition '
                "failed",
                name,
            )
        del self._leases[(namespace, name)]
        return Answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def _replace(self, namespace: str, name: str, body: Any) -> Answer:
        current = self._leases.get((namespace, name))
        if current is None:
            return _status(404, "NotFound", f'leases.{GROUP} "{name}" not found', name=name)
        meta = (body or {}).get("metadata") or {}
        if meta.get("name", name) != name:
            return _status(400, "BadRequest", "the name of the object does not match the URL")
        given = meta.get("resourceVersion", "")
        if given and given != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.{GROUP} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                name,
            )
        stored = {
            **current,
            "metadata": {
                **current["metadata"],
                "labels": meta.get("labels"),
                "annotations": meta.get("annotations"),
                "resourceVersion": str(next(self._versions)),
            },
            "spec": body.get("spec") or {},
        }
        stored["metadata"] = {k: v for k, v in stored["metadata"].items() if v is not None}
        self._leases[(namespace, name)] = stored
        self._wrote(stored)
        return Answer(200, stored)

    def _wrote(self, lease: JSON) -> None:
        holder = str(lease["spec"].get("holderIdentity") or "")
        self.writes.append((holder, lease["metadata"]["resourceVersion"]))


class LeaseDoor(LoopbackServer):
    """One replica's way to the Leases. ``trouble`` is what it does with every request."""

    def __init__(self, api: LeaseApi) -> None:
        super().__init__()
        self.api = api
        self.trouble = ""
        self._released = threading.Event()

    def respond(self, received: Received) -> Answer:
        trouble = self.trouble
        if trouble == "refuse":
            return _status(500, "InternalError", "etcdserver: request timed out")
        if trouble == "drop":
            return Answer(drop=True)
        if trouble == "hang":
            self._released.wait(timeout=60)
            return Answer(drop=True)
        match = _PATH.match(received.path)
        if match is None:
            return _status(404, "NotFound", f"the server could not find {received.path}")
        body = json.loads(received.body) if received.body else None
        return self.api.handle(received.method, match["ns"], match["name"], body)

    def mend(self) -> None:
        """No more trouble: requests are answered again, and any that hang are let go."""
        self.trouble = ""
        self._released.set()

    def stop(self) -> None:
        self.mend()
        super().stop()
