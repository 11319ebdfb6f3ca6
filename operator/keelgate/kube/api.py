"""The operator's calls to the Kubernetes API beyond what kopf does, through the official client.

kopf watches (and so caches) every object the operator reads; this module writes (step pods,
Reconciliations, Approvals, ticks, Events, and the ``status`` of the operator's own kinds) and
reads only what a watch cannot tell: a pod found on a create's conflict, and, at each resync, the
step pods still running (a deletion made while a watch was away is never reported).
Every write is one request, so a step costs a countable number of them. Pods and Events go as
plain JSON through the client's ``ApiClient`` (its credentials, TLS and pool), not through its
generated models, which cost milliseconds of CPU per step pod. API errors become three outcomes
a controller can act on: ``Conflict`` (409: it exists, or someone changed it first), ``Gone``
(404) and ``ApiFailure`` (anything else, retried later). This module must never write a user's
``spec``, labels or annotations (GitOps tools must see no drift), and never read or log a
Secret's data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from keelgate.kube.api_failures import ApiFailure, Conflict, Gone
from keelgate.kube.naming import GROUP, RUN_LABEL, STEP_POD_LABEL, STEP_POD_NAME, VERSION
from keelgate.kube.times import now

log = logging.getLogger("keelgate.kube.api")

JSON = dict[str, Any]
__all__ = ["PLURALS", "ApiFailure", "ClusterApi", "Conflict", "Gone", "now"]

#: Asks a list for a server-side table (names and a few columns), else whole objects.
TABLE = "application/json;as=Table;g=meta.k8s.io;v=v1, application/json"
PLURALS = {"AgentRun": "agentruns", "Reconciliation": "reconciliations", "Approval": "approvals"}


def _failure(error: ApiException, what: str) -> ApiFailure:
    return _failure_status(int(error.status or 0), str(error.reason or ""), what, error.body)


def _failure_status(status: int, reason: str, what: str, body: Any = None) -> ApiFailure:
    message = f"{what}: {status} {reason.strip()}".strip()
    if status == 409:
        return Conflict(message, status=status)
    if status == 404:
        return Gone(message, status=status, named=_named(body))
    detail = _status_message(body)
    if detail:
        message = f"{message}: {detail}"
    return ApiFailure(message, status=status, detail=detail)


def _status_message(body: Any) -> str:
    """The ``message`` of the server's Status answer, on one line ("" for any other answer)."""
    try:
        answer = json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        return ""
    message = answer.get("message") if isinstance(answer, dict) else None
    return " ".join(str(message).split()) if message else ""


def _named(body: Any) -> str:
    """The name a 404's Status answer gives in ``details.name`` ("" for any other answer)."""
    try:
        answer = json.loads(body) if isinstance(body, str | bytes) else body
        details = answer.get("details") if isinstance(answer, dict) else None
        return str(details.get("name") or "") if isinstance(details, dict) else ""
    except ValueError:
        return ""


class RateLimit:
    """A token bucket over the operator's own requests (``--kube-qps``, ``--kube-burst``): at
    most ``burst`` at once, then ``qps`` a second; a request beyond waits, in its worker's
    thread, for its token. It bounds what a burst of work (10,000 runs applied at once, a
    restart) asks of the API server, as client-go's limiter does for Go controllers; the API
    server's own Priority and Fairness still applies. ``qps`` 0: no limit."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps < 0 or burst < 0:
            raise ValueError("qps and burst must not be negative")
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._at = clock()

    def wait(self) -> float:
        """Take a token, waiting for one if none is left; the seconds waited."""
        if not self.qps:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1.0  # taken now; a debt is paid by waiting, in arrival order
            owed = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if owed > 0:
            self._sleep(owed)
        return owed


class ClusterApi:
    """Writes through the official client; counts them (a benchmark reads ``writes``)."""

    def __init__(
        self, api_client: client.ApiClient | None = None, *, limit: RateLimit | None = None
    ) -> None:
        # The client's models are loosely typed; dict bodies are what it sends anyway.
        loader = cast(Any, config)
        if api_client is None:
            try:
                loader.load_incluster_config()
            except config.ConfigException:
                loader.load_kube_config()
            api_client = client.ApiClient()
        self.client: Any = api_client
        self.custom: Any = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        self.writes: dict[str, int] = {}
        self.on_write: Callable[[str], None] | None = None
        self.limit = limit or RateLimit(0, 0)
        #: Told the seconds a request waited for the rate limit (the metrics count them).
        self.on_throttle: Callable[[float], None] | None = None

    def _wait_turn(self) -> None:
        waited = self.limit.wait()
        if waited and self.on_throttle is not None:
            self.on_throttle(waited)

    def _count(self, what: str) -> None:
        with self._lock:
            self.writes[what] = self.writes.get(what, 0) + 1
        if self.on_write is not None:
            self.on_write(what)

    # Custom objects

    def create_object(self, kind: str, namespace: str, body: Mapping[str, Any]) -> JSON:
        self._count(f"create {kind}")
        self._wait_turn()
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
        self._wait_turn()
        try:
            patched: JSON = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURALS[kind], name, body
            )
        except ApiException as error:
            raise _failure(error, f"patch {kind} {namespace}/{name} status") from None
        return patched

    def set_finalizers(
        self,
        kind: str,
        namespace: str,
        name: str,
        finalizers: Sequence[str],
        *,
        resource_version: str,
    ) -> JSON:
        """Merge-patch ``metadata.finalizers`` to ``finalizers``, only if nobody changed the
        object since ``resource_version`` (Conflict otherwise: another finalizer added or
        removed meanwhile is never undone). The answer is the object after it (a deleted
        object whose last finalizer went is answered once more, then gone)."""
        body = {"metadata": {"finalizers": list(finalizers), "resourceVersion": resource_version}}
        self._count(f"patch {kind}/finalizers")
        self._wait_turn()
        try:
            patched: JSON = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], name, body
            )
        except ApiException as error:
            raise _failure(error, f"patch {kind} {namespace}/{name} finalizers") from None
        return patched

    def label(self, kind: str, namespace: str, name: str, labels: Mapping[str, str]) -> JSON:
        """Merge-patch ``metadata.labels`` with ``labels`` (no other field is sent)."""
        body = {"metadata": {"labels": dict(labels)}}
        self._count(f"patch {kind}/labels")
        self._wait_turn()
        try:
            patched: JSON = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURALS[kind], name, body
            )
        except ApiException as error:
            raise _failure(error, f"patch {kind} {namespace}/{name} labels") from None
        return patched

    def delete_object(self, kind: str, namespace: str, name: str, *, uid: str = "") -> None:
        self._count(f"delete {kind}")
        self._wait_turn()
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

    # Core objects: plain JSON both ways

    def _core(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: list[tuple[str, str]] | None = None,
        timeout: float | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> JSON:
        """One request through the client's ``ApiClient`` (its credentials, TLS and connection
        pool) with a JSON body and a JSON answer, without the client's generated models: the
        generated methods turn a body into a ``V1Pod`` and the answer into another, a few
        milliseconds of CPU per step pod for documents that are JSON at both ends."""
        self._wait_turn()
        request = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": accept, "Content-Type": content_type},
            body=None if body is None else dict(body),
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(*request, _request_timeout=timeout)
            response.read()
        except ApiException as error:
            raise _failure(error, what) from None
        if not 200 <= response.status <= 299:
            raise _failure_status(
                int(response.status), str(response.reason or ""), what, response.data
            )
        try:
            answer: JSON = json.loads(response.data) if response.data else {}
        except ValueError:
            raise ApiFailure(
                f"{what}: the answer is not JSON", status=int(response.status)
            ) from None
        return answer

    # Listing (the operator's start)

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        selector: str = "",
        page: int = 500,
        timeout: float = 60,
    ) -> list[JSON]:
        """Every object of ``kind`` in ``namespace`` (None: every namespace), as the API server
        has them now, fetched ``page`` at a time; for ``Pod``, the pods that belong to a run
        (the watch's selector); with ``selector``, only those its labels match (a shard's).
        Each item gets its ``apiVersion`` and ``kind``, which a list leaves out."""
        scope = "" if namespace is None else f"/namespaces/{namespace}"
        query: list[tuple[str, str]] = [("limit", str(page))]
        labels = [RUN_LABEL] if kind == "Pod" else []
        if selector:
            labels.append(selector)
        if labels:
            query.append(("labelSelector", ",".join(labels)))
        if kind == "Pod":
            path, api_version = f"/api/v1{scope}/pods", "v1"
        else:
            api_version = f"{GROUP}/{VERSION}"
            path = f"/apis/{api_version}{scope}/{PLURALS[kind]}"
        where = "every namespace" if namespace is None else namespace
        items: list[JSON] = []
        token = ""
        while True:
            asked = query + ([("continue", token)] if token else [])
            listed = self._core(
                "GET", path, f"list {kind} in {where}", query=asked, timeout=timeout
            )
            for item in listed.get("items") or []:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = str((listed.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    # Pods

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        self._count("create Pod")
        what = f"create Pod {namespace}/{body['metadata']['name']}"
        return self._core("POST", f"/api/v1/namespaces/{namespace}/pods", what, body=body)

    def read_pod(self, namespace: str, name: str, *, timeout: float | None = None) -> JSON:
        return self._core(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            f"read Pod {namespace}/{name}",
            timeout=timeout,
        )

    def running_step_pods(
        self, namespace: str | None = None, *, timeout: float | None = None
    ) -> list[str]:
        """The names of the step pods neither succeeded nor failed, in ``namespace`` (None:
        every one), as the API server has them now: one list request, whatever the number of
        runs. As a server-side table of names (about 140 bytes a pod): whole pods are about 5
        KB each and their metadata alone about 3 KB (the field managers' records), which at
        10,000 running pods the API server would encode and this process decode at every
        resync. Without a namespace, a name stands for any namespace's pod of that name."""
        path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
        query = [
            ("labelSelector", f"{STEP_POD_LABEL}={STEP_POD_NAME}"),
            ("fieldSelector", "status.phase!=Succeeded,status.phase!=Failed"),
            ("includeObject", "None"),
            # From the server's watch cache, not a read of every pod in etcd: a list a moment
            # old only makes the caller read a pod or two it did not need to.
            ("resourceVersion", "0"),
        ]
        where = "every namespace" if namespace is None else namespace
        listed = self._core(
            "GET", path, f"list step pods in {where}", query=query, timeout=timeout, accept=TABLE
        )
        if "rows" not in listed:  # a server that sends no table: its items' names
            return [str(item["metadata"]["name"]) for item in listed.get("items") or []]
        columns = [str(c.get("name", "")).lower() for c in listed.get("columnDefinitions") or []]
        at = columns.index("name") if "name" in columns else 0
        return [str(row["cells"][at]) for row in listed.get("rows") or []]

    def delete_pod(self, namespace: str, name: str, *, uid: str = "") -> None:
        self._count("delete Pod")
        options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        # Gone already, or a newer pod of that name (another uid): nothing of ours to delete.
        with contextlib.suppress(Gone, Conflict):
            self._core(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                f"delete Pod {namespace}/{name}",
                body=options,
            )

    # ConfigMaps (the notifier's delivery state)

    def read_config_map(self, namespace: str, name: str) -> JSON | None:
        """The ConfigMap, or None if there is none."""
        try:
            return self._core(
                "GET",
                f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                f"read ConfigMap {namespace}/{name}",
            )
        except Gone:
            return None

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Merge ``data`` into the ConfigMap's, creating it when there is none."""
        what = f"write ConfigMap {namespace}/{name}"
        self._count("patch ConfigMap")
        try:
            self._core(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                what,
                body={"data": dict(data)},
                content_type="application/merge-patch+json",
            )
        except Gone:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace},
                "data": dict(data),
            }
            self._core("POST", f"/api/v1/namespaces/{namespace}/configmaps", what, body=body)

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
            self._core(
                "POST",
                f"/api/v1/namespaces/{meta.get('namespace')}/events",
                f"post Event {reason}",
                body=body,
            )
        except ApiFailure as failure:
            log.warning("%s", failure)
