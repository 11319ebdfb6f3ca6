"""The requests ``kubectl keelgate`` makes, through the official client, as the user.

Everything the plugin reads or writes in a cluster goes through ``PluginApi``: the AgentRun, its
Reconciliations and Approvals, its step pods and their logs, who the user is (the
SelfSubjectReview API, as ``kubectl auth whoami``) and whether they may do something (a
SelfSubjectAccessReview, as ``kubectl auth can-i``). Errors become the CLI's: a server that
cannot be reached is ``ClusterUnavailable`` (exit 5), a missing object ``InputError`` (exit 2),
anything the server refused one line of its own words (exit 1).

It must never read a Secret (the subclasses that must, for ``keelgate tenant``'s store URL,
``audit export``'s signing key and the decision inbox's store address, say so and show no
Secret's data), never write anything but
the ``spec`` fields a command names (as field manager ``kubectl-keelgate``), and never put a
credential into a message.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from keelgate.cli.plugin.target import Target, connect
from keelgate.errors import ClusterUnavailable, InputError, KeelgateError
from keelgate.kube.naming import GROUP, RUN_LABEL, VERSION, label_value

JSON = dict[str, Any]

#: The field manager of every write, so `kubectl get -o yaml --show-managed-fields` says who.
FIELD_MANAGER = "kubectl-keelgate"
#: Seconds to connect, then to wait for an answer: a command never hangs on a dead server.
TIMEOUT = (10, 60)
PLURALS = {"AgentRun": "agentruns", "Reconciliation": "reconciliations", "Approval": "approvals"}

# urllib3 logs each retry of a refused connection as a warning; the CLI says it once, itself.
logging.getLogger("urllib3").setLevel(logging.ERROR)


class Refused(KeelgateError):
    """The API server refused a request (forbidden, invalid, conflict): exit 1."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, status=status)
        self.status = status


class NotFound(InputError):
    """404: the object is not there (exit 2, as a run that does not exist)."""

    def __init__(self, what: str) -> None:
        super().__init__("", f"{what}: not found")


class PluginApi(Protocol):
    """What the plugin's commands need from a cluster (one namespace, one user)."""

    target: Target

    def whoami(self) -> str: ...

    def identity(self) -> tuple[str, tuple[str, ...]]: ...

    def may(
        self, verb: str, resource: str, name: str, *, namespace: str | None = None
    ) -> tuple[bool, str]: ...

    def agentrun(self, name: str) -> JSON: ...

    def decisions(self, kind: str, run: str) -> list[JSON]: ...

    def patch_spec(self, kind: str, name: str, spec: Mapping[str, Any]) -> JSON: ...

    def append_decision(self, name: str, entry: Mapping[str, Any], *, first: bool) -> JSON: ...

    def pod(self, name: str) -> JSON | None: ...

    def step_pods(self, run: str) -> list[JSON]: ...

    def pod_log(self, name: str, *, tail: int | None = None, since: int | None = None) -> str: ...

    def follow_log(self, name: str, *, tail: int | None = None) -> Iterator[str]: ...

    def listed(
        self, kind: str, *, all_namespaces: bool = False, namespace: str = ""
    ) -> list[JSON]: ...

    def namespaces(self) -> list[str]: ...


class ClusterClient:
    """``PluginApi`` on a real API server, for one command's target."""

    def __init__(self, target: Target, api_client: client.ApiClient | None = None) -> None:
        self.target = target
        self.namespace = target.namespace
        self.client: Any = api_client if api_client is not None else connect(target)
        self.custom: Any = client.CustomObjectsApi(self.client)
        self.core: Any = client.CoreV1Api(self.client)
        self.authn: Any = client.AuthenticationV1Api(self.client)
        self.authz: Any = client.AuthorizationV1Api(self.client)

    def _call(
        self, what: str, request: Any, *args: Any, writes: bool = False, **kwargs: Any
    ) -> Any:
        """One request; its failure in the CLI's terms. ``what`` names it in a message;
        ``writes`` says whether a lost answer leaves its effect unknown."""
        try:
            return request(*args, _request_timeout=TIMEOUT, **kwargs)
        except ApiException as error:
            raise self._refused(error, what) from None
        except urllib3.exceptions.HTTPError as error:
            host = str(getattr(self.client.configuration, "host", "") or "the API server")
            if _never_sent(error) or not writes:
                after = "nothing was read or written"
            else:  # the answer to a patch was lost: it may have landed, and again is harmless
                after = "the change may or may not have been made: the same command again is safe"
            raise ClusterUnavailable(
                f"the API server {host} ({self.target.where}) cannot be reached: "
                f"{_network_reason(error)}; {after}"
            ) from None

    def _refused(self, error: ApiException, what: str) -> KeelgateError:
        status = int(error.status or 0)
        said = _server_message(error)
        if status == 401:
            return Refused(
                f"the API server did not accept the credentials of {self.target.where} "
                "(401 Unauthorized)",
                status=status,
            )
        if status == 404:
            return NotFound(what)
        return Refused(f"{what}: {said}" if said else f"{what}: {status}", status=status)

    def whoami(self) -> str:
        return self.identity()[0]

    def identity(self) -> tuple[str, tuple[str, ...]]:
        """Who the API server says the user is, and the groups it authenticated them in."""
        review = client.V1SelfSubjectReview(
            api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"
        )
        try:
            answer = self._call("who am I", self.authn.create_self_subject_review, review)
        except NotFound:
            raise Refused(
                "the API server does not serve selfsubjectreviews (authentication.k8s.io/v1, "
                "Kubernetes 1.28+), so who you are is unknown; nothing was changed",
                status=404,
            ) from None
        info = answer.status.user_info if answer.status is not None else None
        name = str(info.username or "") if info is not None else ""
        if not name:
            raise Refused("the API server did not say who you are; nothing was changed", status=0)
        groups = tuple(str(g) for g in (info.groups or ())) if info is not None else ()
        return name, groups

    def may(
        self, verb: str, resource: str, name: str, *, namespace: str | None = None
    ) -> tuple[bool, str]:
        """Whether the user may ``verb`` the ``resource`` named ``name`` ("": any) in
        ``namespace`` (None: the target's; "": every namespace), and the API server's reason."""
        review = client.V1SelfSubjectAccessReview(
            api_version="authorization.k8s.io/v1",
            kind="SelfSubjectAccessReview",
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    group=GROUP,
                    resource=resource,
                    verb=verb,
                    namespace=self.namespace if namespace is None else namespace,
                    name=name,
                )
            ),
        )
        answer = self._call(
            f"may I {verb} {resource}", self.authz.create_self_subject_access_review, review
        )
        verdict = answer.status
        if verdict is None:
            return False, ""
        reason = str(verdict.reason or verdict.evaluation_error or "")
        return bool(verdict.allowed) and not bool(verdict.denied), reason

    def agentrun(self, name: str) -> JSON:
        try:
            found: JSON = self._call(
                f"AgentRun {name}",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                "agentruns",
                name,
            )
        except NotFound:
            raise InputError(
                "RUN", f"no AgentRun named {name!r} in namespace {self.namespace!r}"
            ) from None
        return found

    def decisions(self, kind: str, run: str) -> list[JSON]:
        """The run's Reconciliations (or Approvals), found by ``spec.runName``: the label
        narrows the list, the spec decides (a long name's label is a hash of it)."""
        listed = self._call(
            f"list {PLURALS[kind]}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            label_selector=f"{RUN_LABEL}={label_value(run)}",
        )
        items = [i for i in listed.get("items") or [] if i.get("spec", {}).get("runName") == run]
        return sorted(items, key=lambda i: _action_order(str(i["spec"].get("action", ""))))

    def patch_spec(self, kind: str, name: str, spec: Mapping[str, Any]) -> JSON:
        # A JSON merge patch of spec only: the fields named change, nothing else.
        patched: JSON = self._call(
            f"patch {kind.lower()} {name}",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            name,
            {"spec": dict(spec)},
            field_manager=FIELD_MANAGER,
            _content_type="application/merge-patch+json",
            writes=True,
        )
        return patched

    def append_decision(self, name: str, entry: Mapping[str, Any], *, first: bool) -> JSON:
        """Add one decision to an Approval's spec.decisions, as a JSON patch: an ``add`` to the
        end of the list is applied to whatever the list holds when the server takes it, so two
        people deciding at once both land. ``first``: the object has no list yet (an Approval
        made before lists were), which the patch makes; were another person's made meanwhile,
        the CRD's append-only rule refuses it, and the command says so."""
        path = "/spec/decisions" if first else "/spec/decisions/-"
        value: Any = [dict(entry)] if first else dict(entry)
        patched: JSON = self._call(
            f"patch approval {name}",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "approvals",
            name,
            [{"op": "add", "path": path, "value": value}],
            field_manager=FIELD_MANAGER,
            _content_type="application/json-patch+json",
            writes=True,
        )
        return patched

    def pod(self, name: str) -> JSON | None:
        try:
            found = self._call(f"pod {name}", self.core.read_namespaced_pod, name, self.namespace)
        except NotFound:
            return None
        result: JSON = self.client.sanitize_for_serialization(found)
        return result

    def step_pods(self, run: str) -> list[JSON]:
        """The run's step pods (owned by the AgentRun of that name), in no particular order."""
        listed = self._call(
            "list pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{RUN_LABEL}={label_value(run)}",
        )
        pods: list[JSON] = self.client.sanitize_for_serialization(listed).get("items") or []
        return [p for p in pods if _owned_by_run(p, run)]

    def listed(self, kind: str, *, all_namespaces: bool = False, namespace: str = "") -> list[JSON]:
        """Every object of ``kind`` (AgentRun, Reconciliation, Approval) in the namespace (or
        in ``namespace``), or in every namespace at once (a cluster-wide list)."""
        plural = PLURALS[kind]
        if all_namespaces:
            listed = self._call(
                f"list {plural} (all namespaces)",
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                plural,
            )
        else:
            listed = self._call(
                f"list {plural}",
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace or self.namespace,
                plural,
            )
        return list(listed.get("items") or [])

    def namespaces(self) -> list[str]:
        """The cluster's namespaces (a cluster-wide list: Refused, 403, for most people)."""
        listed = self._call("list namespaces", self.core.list_namespace)
        return sorted(str(n.metadata.name) for n in listed.items or ())

    def pod_log(self, name: str, *, tail: int | None = None, since: int | None = None) -> str:
        limits: dict[str, Any] = {}
        if tail is not None:
            limits["tail_lines"] = tail
        if since is not None:
            limits["since_seconds"] = since
        text = self._call(
            f"log of pod {name}",
            self.core.read_namespaced_pod_log,
            name,
            self.namespace,
            container="step",
            **limits,
        )
        return text if isinstance(text, str) else str(text or "")

    def follow_log(self, name: str, *, tail: int | None = None) -> Iterator[str]:
        """The pod's log line by line as it is written, until the container ends (no timeout
        on the stream: it lasts as long as the pod writes)."""
        limits = {} if tail is None else {"tail_lines": tail}
        try:
            response = self.core.read_namespaced_pod_log(
                name,
                self.namespace,
                container="step",
                follow=True,
                _preload_content=False,
                **limits,
            )
        except ApiException as error:
            raise self._refused(error, f"log of pod {name}") from None
        try:
            pending = b""
            for chunk in response.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if pending:
                yield pending.decode(errors="replace")
        finally:
            response.release_conn()


class SecretReader(ClusterClient):
    """A client that reads Secrets, for the few commands that must (each subclass says which
    Secret and why); what it reads is never shown, logged or put in a message."""

    def read(self, name: str) -> client.V1Secret | None:
        """The Secret ``name`` in the namespace, or None if there is none."""
        try:
            found: client.V1Secret = self._call(
                f"secret {self.namespace}/{name}",
                self.core.read_namespaced_secret,
                name,
                self.namespace,
            )
        except NotFound:
            return None
        return found


def _owned_by_run(pod: Mapping[str, Any], run: str) -> bool:
    refs = pod.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("kind") == "AgentRun" and r.get("name") == run for r in refs)


def _action_order(action: str) -> tuple[int, int]:
    iteration, _, index = action.partition(":")
    try:
        return int(iteration), int(index or 0)
    except ValueError:
        return (1 << 62, 0)


def _server_message(error: ApiException) -> str:
    """The API server's own sentence (a Status object's ``message``), on one line."""
    body = error.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    message = ""
    if isinstance(body, str) and body.strip():
        try:
            decoded = json.loads(body)
        except ValueError:
            message = body
        else:
            message = str(decoded.get("message", "")) if isinstance(decoded, dict) else ""
    message = message or str(error.reason or "")
    return " ".join(message.split())


def _never_sent(error: urllib3.exceptions.HTTPError) -> bool:
    """Whether the request failed before it reached the server (no connection, no TLS)."""
    reason = getattr(error, "reason", None) or error
    return isinstance(
        reason,
        urllib3.exceptions.NewConnectionError
        | urllib3.exceptions.ConnectTimeoutError
        | urllib3.exceptions.SSLError,
    )


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def _network_reason(error: urllib3.exceptions.HTTPError) -> str:
    """Why a connection failed, in a few words ("Connection refused", a TLS failure)."""
    reason = getattr(error, "reason", None) or error
    text = str(reason)
    found = _ERRNO.search(text)
    if found:
        return found.group(1).strip()
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return "its TLS certificate is not trusted by the kubeconfig's certificate authority"
    if isinstance(reason, urllib3.exceptions.TimeoutError) or "timed out" in text.lower():
        return "timed out"
    return type(reason).__name__
