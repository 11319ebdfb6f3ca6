"""Build a container's environment the way the kubelet does: env, envFrom, valueFrom, downward API.

Why it exists: the node agent runs each container's command as a host process, and the program
must see the environment Kubernetes promises: `envFrom` first, then `env` (later entries win),
`$(VAR)` expansion in values, command and args, values from Secrets and ConfigMaps, and the
downward-API fields (`fieldRef`, `resourceFieldRef`).

It must never read a Secret or ConfigMap the pod does not reference (the API server's Node
authorizer enforces the same), and never put a value the pod did not ask for into its environment
except the base variables documented in `base_env`.
"""

from __future__ import annotations

import base64
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from keelgate_e2e.kube import JSON, ApiError

#: Host variables a host program needs to start at all (images would provide their own).
BASE_VARIABLES = ("PATH", "LANG", "LC_ALL", "TZ", "HOME")

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


class ConfigError(Exception):
    """The environment cannot be built (missing Secret or key, bad field reference).

    The kubelet reports this as waiting reason CreateContainerConfigError."""


def parse_quantity(text: str) -> Decimal:
    """Parse a Kubernetes quantity such as `500m`, `128Mi`, `2` or `1e3`."""
    match = _QUANTITY.match(str(text).strip())
    if match is None or match.group(2) not in _SUFFIX:
        raise ConfigError(f"invalid quantity {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation as exc:
        raise ConfigError(f"invalid quantity {text!r}") from exc


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand `$(NAME)` from `env` as the kubelet does; `$$` escapes; unknown names stay as is."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def _label_key(path: str, prefix: str) -> str | None:
    if path.startswith(prefix + "['") and path.endswith("']"):
        return path[len(prefix) + 2 : -2]
    return None


def field_value(pod: JSON, path: str) -> str:
    """The value of a downward-API `fieldRef.fieldPath` for `pod`."""
    meta: dict[str, Any] = pod.get("metadata", {})
    spec: dict[str, Any] = pod.get("spec", {})
    status: dict[str, Any] = pod.get("status", {})
    simple: dict[str, Callable[[], Any]] = {
        "metadata.name": lambda: meta.get("name", ""),
        "metadata.namespace": lambda: meta.get("namespace", ""),
        "metadata.uid": lambda: meta.get("uid", ""),
        "spec.nodeName": lambda: spec.get("nodeName", ""),
        "spec.serviceAccountName": lambda: spec.get("serviceAccountName", ""),
        "status.hostIP": lambda: status.get("hostIP", ""),
        "status.podIP": lambda: status.get("podIP", ""),
        "status.hostIPs": lambda: ",".join(i["ip"] for i in status.get("hostIPs", [])),
        "status.podIPs": lambda: ",".join(i["ip"] for i in status.get("podIPs", [])),
    }
    if path in simple:
        return str(simple[path]())
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        key = _label_key(path, prefix)
        if key is not None:
            return str(meta.get(source, {}).get(key, ""))
    raise ConfigError(f"unsupported fieldRef.fieldPath {path!r}")


def resource_value(
    pod: JSON, container: JSON, ref: JSON, node_allocatable: Mapping[str, str]
) -> str:
    """The value of a `resourceFieldRef` (limits fall back to the node's allocatable)."""
    target = container
    if ref.get("containerName"):
        every = pod["spec"].get("containers", []) + pod["spec"].get("initContainers", [])
        found = [c for c in every if c["name"] == ref["containerName"]]
        if not found:
            raise ConfigError(f"resourceFieldRef: no container {ref['containerName']!r}")
        target = found[0]
    kind, _, resource = str(ref["resource"]).partition(".")
    if kind not in ("limits", "requests") or not resource:
        raise ConfigError(f"unsupported resourceFieldRef.resource {ref['resource']!r}")
    resources: dict[str, Any] = target.get("resources", {})
    raw = resources.get(kind, {}).get(resource)
    if raw is None and kind == "requests":
        raw = resources.get("limits", {}).get(resource)
    if raw is None:
        raw = node_allocatable.get(resource, "0") if kind == "limits" else "0"
    divisor = parse_quantity(str(ref.get("divisor", "1")))
    if divisor == 0:
        raise ConfigError("resourceFieldRef.divisor must not be zero")
    return str(math.ceil(parse_quantity(str(raw)) / divisor))


Getter = Callable[[str, str], JSON | None]
"""Fetch (kind, name) in the pod's namespace; kind is "secrets" or "configmaps"; None if absent."""


def _source(get: Getter, kind: str, name: str, optional: bool) -> dict[str, str] | None:
    obj = get(kind, name)
    noun = "secret" if kind == "secrets" else "configmap"
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{noun} "{name}" not found')
    values: dict[str, str] = {}
    if kind == "secrets":
        for key, b64 in (obj.get("data") or {}).items():
            values[key] = base64.b64decode(b64).decode(errors="replace")
    else:
        values.update(obj.get("data") or {})
        for key, b64 in (obj.get("binaryData") or {}).items():
            values[key] = base64.b64decode(b64).decode(errors="replace")
    return values


def build_env(
    pod: JSON,
    container: JSON,
    get: Getter,
    *,
    service_env: Mapping[str, str],
    node_allocatable: Mapping[str, str],
    host_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for `container` of `pod`: base, service, envFrom, then env entries."""
    host_env = os.environ if host_env is None else host_env
    env = {k: host_env[k] for k in BASE_VARIABLES if k in host_env}
    env["HOSTNAME"] = str(pod["metadata"]["name"])
    env.update(service_env)
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        for field, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            ref = source.get(field)
            if ref is None:
                continue
            values = _source(get, kind, ref["name"], bool(ref.get("optional", False)))
            for key, value in (values or {}).items():
                if _ENV_NAME.match(prefix + key):  # the kubelet skips invalid names too
                    env[prefix + key] = value
    for item in container.get("env") or []:
        name = str(item["name"])
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        resolved = _value_from(pod, container, item["valueFrom"], get, node_allocatable)
        if resolved is not None:
            env[name] = resolved
    return env


def _value_from(
    pod: JSON, container: JSON, spec: JSON, get: Getter, allocatable: Mapping[str, str]
) -> str | None:
    for field, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
        ref = spec.get(field)
        if ref is None:
            continue
        optional = bool(ref.get("optional", False))
        values = _source(get, kind, ref["name"], optional)
        if values is None:
            return None
        if ref["key"] not in values:
            if optional:
                return None
            noun = "secret" if kind == "secrets" else "configmap"
            raise ConfigError(f"couldn't find key {ref['key']} in {noun} {ref['name']}")
        return values[ref["key"]]
    if "fieldRef" in spec:
        return field_value(pod, str(spec["fieldRef"]["fieldPath"]))
    if "resourceFieldRef" in spec:
        return resource_value(pod, container, spec["resourceFieldRef"], allocatable)
    raise ConfigError(f"unsupported valueFrom {sorted(spec)}")


def command_line(container: JSON, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded. With no command, args run as the command (as for
    an image without ENTRYPOINT); with neither there is nothing the agent can run."""
    command: Sequence[str] = container.get("command") or []
    args: Sequence[str] = container.get("args") or []
    argv = [expand(str(a), env) for a in [*command, *args]]
    if not argv:
        raise ConfigError(
            "container has no command or args: this node agent runs host programs and cannot "
            "run an image's entrypoint"
        )
    return argv


def api_getter(get_json: Callable[[str], JSON], namespace: str) -> Getter:
    """A Getter that reads through the API (None on 404)."""

    def get(kind: str, name: str) -> JSON | None:
        try:
            return get_json(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    return get
