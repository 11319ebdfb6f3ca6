"""The operator's calls to the Kubernetes API beyond what kopf does, through the official client.

kopf watches (and so caches) every object the operator reads; this module only writes: step
pods, Reconciliations, Approvals, ticks, Events, and the ``status`` of the operator's own kinds.
Every write is one request, so a step costs a countable number of them. API errors become three
outcomes a controller can act on: ``Conflict`` (409: it exists, or someone changed it first),
``Gone`` (404) and ``ApiFailure`` (anything else, retried later). This module must never write
a user's ``spec``, labels or annotations (GitOps tools must see no drift), and never read or log
a Secret's data.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from keelgate.kube.naming import GROUP, MANAGED_BY, VERSION

log = logging.getLogger("keelgate.kube.api")

JSON = dict[str, Any]
PLURALS = {"AgentRun": "agentruns", "Reconciliation": "reconciliations", "Approval": "approvals"}


class ApiFailure(Exception):
    """A request the API server refused or did not answer; the controller retries later."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Conflict(ApiFailure):
    """409: the object exists already, or changed since it was read."""


class Gone(ApiFailure):
    """404: the object (or its namespace) does not exist."""


def _failure(error: ApiException, what: str) -> ApiFailure:
    status = int(error.status or 0)
    reason = str(error.reason or "").strip()
    message = f"{what}: {status} {reason}".strip()
    if status == 409:
        return Conflict(message, status=status)
    if status == 404:
        return Gone(message, status=status)
    return ApiFailure(message, status=status)


def now() -> str:
    """The current time as a metav1.Time."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClusterApi:
    """Writes through the official client; counts them (a benchmark reads ``writes``)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        # The client's models are loosely typed; dict bodies are what it sends anyway.
        loader = cast(Any, config)
        if api_client is None:
            try:
                loader.load_incluster_config()
            except config.ConfigException:
                loader.load_kube_config()
            api_client = client.ApiClient()
        self.client: Any = api_client
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        self.writes: dict[str, int] = {}
        self.on_write: Callable[[str], None] | None = None

    def _count(self, what: str) -> None:
        with self._lock:
            self.writes[what] = self.writes.get(what, 0) + 1
        if self.on_write is not None:
            self.on_write(what)

    # Custom objects

    def create_object(self, kind: str, namespace: str, body: Mapping[str, Any]) -> JSON:
        self._count(f"create {kind}")
        try:
            created: JSON = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], dict(body)
            )
        except ApiException as error:
            raise _failure(error, f"create {kind} {namespace}/{body['metadata']['name']}") from None
        return created

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> JSON:
        """Merge-patch ``status``; with ``resource_version``, only if nobody changed the object
        since (a stale operator's patch fails with Conflict instead of undoing a newer one)."""
        body: JSON = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self._count(f"patch {kind}/status")
        try:
            patched: JSON = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURALS[kind], name, body
            )
        except ApiException as error:
            raise _failure(error, f"patch {kind} {namespace}/{name} status") from None
        return patched

    def delete_object(self, kind: str, namespace: str, name: str, *, uid: str = "") -> None:
        self._count(f"delete {kind}")
        options = client.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], name, body=options
            )
        except ApiException as error:
            failure = _failure(error, f"delete {kind} {namespace}/{name}")
            if not isinstance(failure, Gone):
                raise failure from None

    # Pods

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        self._count("create Pod")
        try:
            created = self.core.create_namespaced_pod(namespace, dict(body))
        except ApiException as error:
            raise _failure(error, f"create Pod {namespace}/{body['metadata']['name']}") from None
        result: JSON = self.client.sanitize_for_serialization(created)
        return result

    def read_pod(self, namespace: str, name: str) -> JSON:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            raise _failure(error, f"read Pod {namespace}/{name}") from None
        result: JSON = self.client.sanitize_for_serialization(pod)
        return result

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None:
        self._count("delete Pod")
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None
        )
        try:
            self.core.delete_namespaced_pod(name, namespace, body=options)
        except ApiException as error:
            failure = _failure(error, f"delete Pod {namespace}/{name}")
            if not isinstance(failure, Gone | Conflict):
                raise failure from None

    # Events

    def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about ``involved`` (an object body). Best effort: an Event that
        cannot be posted is logged, never a reason to stop reconciling."""
        meta = involved.get("metadata", {})
        stamp = now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{meta.get('name', 'keelgate')}.",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "keelgate-operator"},
            "reportingComponent": "keelgate.dev/operator",
            "reportingInstance": "keelgate-operator",
        }
        self._count("create Event")
        try:
            self.core.create_namespaced_event(meta.get("namespace"), body)
        except ApiException as error:
            log.warning("%s", _failure(error, f"post Event {reason}"))

    # Secrets (create only: the operator never reads a Secret's data)

    def create_secret(self, namespace: str, name: str, data: Mapping[str, str]) -> bool:
        """Create a Secret unless one of that name exists; True if it was created."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(MANAGED_BY),
            },
            "type": "Opaque",
            "stringData": dict(data),
        }
        self._count("create Secret")
        try:
            self.core.create_namespaced_secret(namespace, body)
        except ApiException as error:
            failure = _failure(error, f"create Secret {namespace}/{name}")
            if isinstance(failure, Conflict):
                return False
            raise failure from None
        return True
