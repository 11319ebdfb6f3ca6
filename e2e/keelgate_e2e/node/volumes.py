"""A pod's volumes on the node agent, written as the kubelet writes them.

Why it exists: programs read their configuration, credentials and service-account token from
files (`/var/run/secrets/kubernetes.io/serviceaccount/token`, `/etc/config/...`); the operator's
in-cluster client needs exactly the projected volume the ServiceAccount admission plugin injects.
Each volume of a pod is a directory under the pod's state directory,
`<state dir>/pods/<uid>/volumes/<plugin>/<name>` (the kubelet's layout), that the mount helper
(`keelgate_e2e.node.mounts`) binds at every mountPath inside the container's own mount namespace:

- `emptyDir`: an empty directory (mode 0777) that lives as long as the pod, shared by its
  containers; `medium: Memory` is a plain directory too and `sizeLimit` is not enforced.
- `secret`, `configMap`, `downwardAPI` and `projected` (sources `secret`, `configMap`,
  `downwardAPI`, `serviceAccountToken`): files per key with `items` (`key`, `path`, `mode`),
  `defaultMode` and `optional`, written with the kubelet's atomic-writer layout (a timestamped
  directory, a `..data` symlink to it, one symlink per top-level entry), so a resync replaces
  every file at once and a running container sees the new content. They are always mounted
  read-only, as the kubelet mounts them.
- `serviceAccountToken`: a token from the TokenRequest API for the pod's service account, bound
  to the pod (name and uid), with the source's `audience` and `expirationSeconds`; refreshed when
  80% of its lifetime has passed (or after 24 h), as the kubelet's token manager does.

It must never read a Secret or ConfigMap the pod does not reference (the Node authorizer enforces
the same), never request a token that is not bound to the pod, never write outside the pod's
volume directory, and never log a token or a Secret's value.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keelgate_e2e.kube import JSON, Kube
from keelgate_e2e.node import env as envmod

log = logging.getLogger("keelgate_e2e.node.volumes")

#: The kubelet's directory name per volume plugin.
PLUGINS = {
    "emptyDir": "kubernetes.io~empty-dir",
    "secret": "kubernetes.io~secret",
    "configMap": "kubernetes.io~configmap",
    "downwardAPI": "kubernetes.io~downward-api",
    "projected": "kubernetes.io~projected",
}
#: Volume types whose content comes from the API: the kubelet always mounts them read-only.
API_DATA = frozenset({"secret", "configMap", "downwardAPI", "projected"})
#: The API's default file mode for secret/configMap/downwardAPI/projected volumes (0644).
DEFAULT_MODE = 0o644
#: How often API data is re-read (the kubelet's sync frequency).
RESYNC_SECONDS = 60.0
#: The kubelet refreshes a token after 80% of its lifetime, or when it is older than a day.
REFRESH_FRACTION = 0.8
MAX_TOKEN_AGE = 24 * 3600.0
#: The atomic writer's symlink to the current data directory.
DATA_LINK = "..data"


class VolumeError(Exception):
    """A volume cannot be set up (missing Secret, ConfigMap or key, unsupported type, a subPath
    outside its volume). The kubelet keeps such a pod in ContainerCreating and retries."""


@dataclass(frozen=True)
class FileProjection:
    """One file of a volume: its bytes and permission bits."""

    data: bytes
    mode: int


Payload = dict[str, FileProjection]
"""Relative path -> file, the content of one API-data volume."""


@dataclass(frozen=True)
class Mount:
    """One bind mount for the mount helper."""

    source: str
    target: str
    read_only: bool

    def spec(self) -> JSON:
        """As the mount helper reads it."""
        return {"source": self.source, "target": self.target, "readOnly": self.read_only}


@dataclass
class Token:
    """A service-account token the agent obtained, and when it was issued and expires."""

    token: str
    issued: float
    expires: float


def token_needs_refresh(now: float, issued: float, expires: float) -> bool:
    """True once 80% of a token's lifetime has passed, or it is older than 24 hours."""
    lifetime = expires - issued
    return now >= issued + REFRESH_FRACTION * lifetime or now >= issued + MAX_TOKEN_AGE


def _mode(value: Any, default: int) -> int:
    return int(value) if value is not None else default


def _key_payload(
    values: Mapping[str, bytes],
    items: list[JSON] | None,
    default_mode: int,
    optional: bool,
    missing: Callable[[str], str],
) -> Payload:
    """Files for a Secret's or ConfigMap's keys: all keys, or just `items` (kubelet MakePayload)."""
    if not items:
        return {key: FileProjection(data, default_mode) for key, data in values.items()}
    payload: Payload = {}
    for item in items:
        key = str(item["key"])
        if key not in values:
            if optional:
                continue
            raise VolumeError(missing(key))
        payload[str(item["path"])] = FileProjection(
            values[key], _mode(item.get("mode"), default_mode)
        )
    return payload


def secret_values(obj: JSON) -> dict[str, bytes]:
    """A Secret's data, decoded."""
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def configmap_values(obj: JSON) -> dict[str, bytes]:
    """A ConfigMap's data and binaryData, as bytes."""
    values = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    for key, b64 in (obj.get("binaryData") or {}).items():
        values[key] = base64.b64decode(b64)
    return values


def go_quote(text: str) -> str:
    """Go's strconv.Quote for the strings labels and annotations hold."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) > 0xFF else f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def format_map(values: Mapping[str, str]) -> str:
    """Labels or annotations as a downward-API file holds them: sorted `key="value"` lines."""
    return "\n".join(f"{key}={go_quote(str(values[key]))}" for key in sorted(values))


def downward_payload(
    pod: JSON, items: list[JSON], default_mode: int, allocatable: Mapping[str, str]
) -> Payload:
    """Files of a downwardAPI volume (or projected source): metadata fields and resources."""
    payload: Payload = {}
    meta: JSON = pod.get("metadata", {})
    for item in items:
        mode = _mode(item.get("mode"), default_mode)
        path = os.path.normpath(str(item["path"]))
        try:
            if "fieldRef" in item:
                field_path = str(item["fieldRef"]["fieldPath"])
                if field_path in ("metadata.labels", "metadata.annotations"):
                    value = format_map(meta.get(field_path.split(".")[1]) or {})
                else:
                    value = envmod.field_value(pod, field_path)
            elif "resourceFieldRef" in item:
                ref = item["resourceFieldRef"]
                containers = pod["spec"].get("containers", []) + pod["spec"].get(
                    "initContainers", []
                )
                found = [c for c in containers if c["name"] == ref.get("containerName")]
                value = envmod.resource_value(pod, found[0] if found else {}, ref, allocatable)
            else:
                raise VolumeError(f"downwardAPI item {path!r} has no fieldRef or resourceFieldRef")
        except envmod.ConfigError as exc:
            raise VolumeError(str(exc)) from exc
        payload[path] = FileProjection(value.encode(), mode)
    return payload


def _check_path(rel: str) -> None:
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts or parts[0].startswith(".."):
        raise VolumeError(f"invalid file path {rel!r} in volume")


def _current(target: Path) -> Path | None:
    link = target / DATA_LINK
    return target / os.readlink(link) if link.is_symlink() else None


def _same(directory: Path, payload: Payload) -> bool:
    present = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
    if present != {os.path.normpath(k) for k in payload}:
        return False
    for rel, proj in payload.items():
        path = directory / rel
        if path.read_bytes() != proj.data or path.stat().st_mode & 0o7777 != proj.mode:
            return False
    return True


def write_payload(target: Path, payload: Payload) -> bool:
    """Write `payload` into `target` as the kubelet's atomic writer does; True if it changed.

    Files go to a fresh `..<timestamp>` directory; `..data` is switched to it with one rename,
    then each top-level entry is a symlink through `..data`, so a reader sees either the old set
    of files or the new one, never a mix."""
    for rel in payload:
        _check_path(rel)
    target.mkdir(parents=True, exist_ok=True)
    old = _current(target)
    if old is not None and old.is_dir() and _same(old, payload):
        return False
    stamp = dt.datetime.now(dt.UTC).strftime("%Y_%m_%d_%H_%M_%S.%f")
    fresh = Path(tempfile.mkdtemp(prefix=f"..{stamp}.", dir=target))
    fresh.chmod(0o755)
    for rel, proj in payload.items():
        path = fresh / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_bytes(proj.data)
        path.chmod(proj.mode)
    tmp_link = target / "..data_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(fresh.name)
    tmp_link.replace(target / DATA_LINK)
    wanted = {Path(rel).parts[0] for rel in payload}
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.name not in wanted and entry.is_symlink():
            entry.unlink()  # a key that is gone
    for name in wanted:
        link = target / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_LINK}/{name}")
    if old is not None and old.parent == target and old.name.startswith(".."):
        shutil.rmtree(old, ignore_errors=True)
    return True


Getter = Callable[[str, str], JSON | None]
"""Fetch (kind, name) in the pod's namespace; kind is "secrets" or "configmaps"; None if absent."""


@dataclass
class PodVolumes:
    """The volumes of one pod: set up before its first container, resynced while it runs."""

    kube: Kube
    root: Path
    allocatable: Mapping[str, str]
    get: Getter
    tokens: dict[tuple[str, int], Token] = field(default_factory=dict)
    ready: bool = False
    next_resync: float = 0.0

    def kind(self, volume: JSON) -> str:
        """The volume's type (the key of its source)."""
        for key in volume:
            if key != "name":
                return key
        raise VolumeError(f"volume {volume.get('name')!r} has no source")

    def path(self, volume: JSON) -> Path:
        """The directory holding `volume` on the host."""
        kind = self.kind(volume)
        if kind not in PLUGINS:
            raise VolumeError(
                f"volume {volume['name']!r}: type {kind} is not supported by the node agent"
            )
        return self.root / PLUGINS[kind] / str(volume["name"])

    def sync(self, pod: JSON) -> None:
        """Create every volume of `pod`, or bring its API data up to date; VolumeError if not."""
        for volume in pod["spec"].get("volumes") or []:
            target = self.path(volume)
            kind = self.kind(volume)
            if kind == "emptyDir":
                if not target.is_dir():
                    target.mkdir(parents=True)
                    target.chmod(0o777)  # the kubelet's mode: any user of the pod may write
                continue
            try:
                payload = self._payload(pod, volume, kind)
            except VolumeError as exc:
                name = volume["name"]
                raise VolumeError(f'MountVolume.SetUp failed for volume "{name}": {exc}') from exc
            if write_payload(target, payload) and self.ready:
                log.info("volume %s of %s updated", volume["name"], pod["metadata"]["name"])
        self.ready = True
        self.next_resync = self._next_resync()

    def _next_resync(self) -> float:
        """Monotonic time of the next resync: a minute, or sooner when a token needs it."""
        now_wall, now = time.time(), time.monotonic()
        due = now + RESYNC_SECONDS
        for tok in self.tokens.values():
            refresh_at = tok.issued + REFRESH_FRACTION * (tok.expires - tok.issued)
            due = min(due, now + max(1.0, refresh_at - now_wall))
        return due

    def _payload(self, pod: JSON, volume: JSON, kind: str) -> Payload:
        source: JSON = volume[kind] or {}
        if kind == "projected":
            default = _mode(source.get("defaultMode"), DEFAULT_MODE)
            payload: Payload = {}
            for index, projection in enumerate(source.get("sources") or []):
                payload.update(self._projection(pod, volume, index, projection, default))
            return payload
        default = _mode(source.get("defaultMode"), DEFAULT_MODE)
        if kind == "downwardAPI":
            return downward_payload(pod, source.get("items") or [], default, self.allocatable)
        return self._object_payload(kind, source, default)

    def _object_payload(self, kind: str, source: JSON, default: int) -> Payload:
        optional = bool(source.get("optional", False))
        if kind == "secret":
            name = str(source.get("secretName", ""))
            obj = self.get("secrets", name)
            if obj is None and not optional:
                raise VolumeError(f'secret "{name}" not found')
            values = secret_values(obj) if obj else {}
            missing = "references non-existent secret key: {}"
        else:
            name = str(source.get("name", ""))
            obj = self.get("configmaps", name)
            if obj is None and not optional:
                raise VolumeError(f'configmap "{name}" not found')
            values = configmap_values(obj) if obj else {}
            missing = "configmap references non-existent config key: {}"
        return _key_payload(values, source.get("items"), default, optional, missing.format)

    def _projection(
        self, pod: JSON, volume: JSON, index: int, projection: JSON, default: int
    ) -> Payload:
        if "secret" in projection:
            src = dict(projection["secret"])
            src["secretName"] = src.get("name", "")
            return self._object_payload("secret", src, default)
        if "configMap" in projection:
            return self._object_payload("configMap", projection["configMap"], default)
        if "downwardAPI" in projection:
            items = projection["downwardAPI"].get("items") or []
            return downward_payload(pod, items, default, self.allocatable)
        if "serviceAccountToken" in projection:
            spec = projection["serviceAccountToken"]
            token = self._token(pod, (str(volume["name"]), index), spec)
            return {str(spec["path"]): FileProjection(token.encode(), default)}
        raise VolumeError(f"projected source {sorted(projection)} is not supported")

    def _token(self, pod: JSON, key: tuple[str, int], spec: JSON) -> str:
        cached = self.tokens.get(key)
        if cached is not None and not token_needs_refresh(
            time.time(), cached.issued, cached.expires
        ):
            return cached.token
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        token_spec: JSON = {
            "expirationSeconds": int(spec.get("expirationSeconds", 3600)),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if spec.get("audience"):  # as the kubelet asks: no audience means the API server's own
            token_spec["audiences"] = [spec["audience"]]
        request: JSON = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": token_spec,
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token"
        answer = self.kube.create(path, request)
        status = answer["status"]
        expires = dt.datetime.fromisoformat(
            str(status["expirationTimestamp"]).replace("Z", "+00:00")
        ).timestamp()
        # As the kubelet reckons it: issued = expiry - the lifetime the server granted.
        issued = expires - int(answer["spec"]["expirationSeconds"])
        self.tokens[key] = Token(str(status["token"]), issued, expires)
        if cached is not None:
            log.info("refreshed the token of %s/%s (%s)", meta["namespace"], meta["name"], key[0])
        return str(status["token"])

    def mounts(self, pod: JSON, container: JSON, env: Mapping[str, str]) -> list[Mount]:
        """The bind mounts of `container`'s volumeMounts (subPath and subPathExpr resolved)."""
        volumes = {str(v["name"]): v for v in pod["spec"].get("volumes") or []}
        found: list[Mount] = []
        for entry in container.get("volumeMounts") or []:
            volume = volumes.get(str(entry["name"]))
            if volume is None:
                raise VolumeError(f"volumeMount {entry['name']!r}: no such volume in the pod")
            kind = self.kind(volume)
            base = self.path(volume)
            source = base
            sub = str(entry.get("subPath") or "")
            if entry.get("subPathExpr"):
                sub = envmod.expand(str(entry["subPathExpr"]), env)
            if sub:
                source = sub_path_source(base, sub, writable=kind not in API_DATA)
            read_only = bool(entry.get("readOnly")) or kind in API_DATA
            found.append(Mount(str(source), str(entry["mountPath"]), read_only))
        return found


def sub_path_source(base: Path, sub: str, writable: bool) -> Path:
    """The host path a `subPath` of the volume at `base` names; VolumeError if it leaves the
    volume (a symlink inside may point anywhere on the host). A missing subPath of a writable
    volume is created as a directory, as the kubelet does."""
    if Path(sub).is_absolute() or ".." in Path(sub).parts:
        raise VolumeError(f"subPath {sub!r} must be a relative path within the volume")
    real_base = os.path.realpath(base)
    real = os.path.realpath(base / sub)
    if real != real_base and not real.startswith(real_base + os.sep):
        raise VolumeError(f"subPath {sub!r} resolves outside its volume")
    if not os.path.lexists(real):
        if not writable:
            raise VolumeError(f"subPath {sub!r} does not exist in a read-only volume")
        os.makedirs(real, mode=0o777, exist_ok=True)
    return Path(real)


#: Host paths a container must not inherit: a host that is itself a pod has its own
#: service-account directory, which must not pass for the pod's (say, with automount off).
MASKED = ("/var/run/secrets/kubernetes.io/serviceaccount",)


def masks(mounts: list[Mount], existing: Callable[[str], bool] = os.path.isdir) -> list[str]:
    """The MASKED paths present on the host that no mount covers, contains or sits inside."""
    targets = [os.path.realpath(m.target) for m in mounts]
    out = []
    for path in MASKED:
        real = os.path.realpath(path)
        if not existing(real):
            continue
        overlaps = any(
            t == real or t.startswith(real + os.sep) or real.startswith(t.rstrip(os.sep) + os.sep)
            for t in targets
        )
        if not overlaps:
            out.append(path)
    return out


#: Host paths a container's own programs come from (this checkout, its venv, the Python it runs
#: on): they stand in for the image, so a volume mounted over a parent of one of them (an
#: emptyDir at /tmp, with the checkout under /tmp) must not hide them. The helper mounts them
#: again on top, at the same path, read-only.
HOST_PROGRAMS = tuple(
    dict.fromkeys(
        os.path.realpath(p)
        for p in (str(Path(__file__).resolve().parents[3]), sys.prefix, sys.base_prefix)
    )
)


def helper_spec(
    mounts: list[Mount],
    masked: list[str],
    working_dir: str | None,
    *,
    cgroup: Path | None = None,
) -> str:
    """The mount helper's SPEC argument; ``cgroup`` is the pod's CPU group to join first."""
    return json.dumps(
        {
            "mounts": [m.spec() for m in mounts],
            "masks": masked,
            "workingDir": working_dir,
            "keep": list(HOST_PROGRAMS),
            "cgroup": None if cgroup is None else str(cgroup / "cgroup.procs"),
        }
    )
