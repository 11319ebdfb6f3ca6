"""Helpers for e2e tests against the local cluster: polling, kubectl, small manifests.

Why it exists: every e2e test waits for the cluster to converge and runs the machine's kubectl as
a user would; keeping that here keeps the tests short and their waits bounded. It must never
retry an assertion without a deadline, and never talk to any cluster but the one it is given.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from keelgate_e2e.kube import JSON, ApiError, Kube

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25, what: str = ""
) -> T:
    """Call `probe` until it returns something truthy and return it; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = probe()
        except ApiError as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what or probe}; last value: {last!r}"
            )
        time.sleep(interval)


def find_kubectl() -> Path:
    """The machine's kubectl: $KUBECTL, else `kubectl` on PATH."""
    explicit = os.environ.get("KUBECTL")
    found = explicit or shutil.which("kubectl")
    if not found or not Path(found).is_file():
        raise FileNotFoundError("kubectl not found: put it on PATH or set KUBECTL")
    return Path(found)


@dataclass(frozen=True)
class Kubectl:
    """Runs kubectl against the test cluster as one user, in one namespace."""

    binary: Path
    kubeconfig: Path
    context: str = "admin"
    namespace: str | None = None

    def __call__(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run `kubectl args...`; raise on a non-zero exit when `check`."""
        cmd = [str(self.binary), f"--kubeconfig={self.kubeconfig}", f"--context={self.context}"]
        if self.namespace:
            cmd.append(f"--namespace={self.namespace}")
        cmd += args
        result = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd[3:])} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result

    def as_user(self, context: str) -> Kubectl:
        """The same, as another user (kubeconfig context)."""
        return Kubectl(self.binary, self.kubeconfig, context, self.namespace)


def pod(
    name: str,
    command: Sequence[str],
    *,
    restart_policy: str = "Never",
    container: str = "main",
    extra: dict[str, Any] | None = None,
) -> JSON:
    """A single-container Pod manifest running `command` (the image is never pulled)."""
    spec_container: JSON = {"name": container, "image": "busybox", "command": list(command)}
    spec_container.update(extra or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [spec_container],
        },
    }


def get_pod(kube: Kube, namespace: str, name: str) -> JSON:
    """GET a pod."""
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def pod_phase(kube: Kube, namespace: str, name: str, *phases: str) -> JSON | None:
    """The pod if its phase is one of `phases`, else None (for `wait_for`)."""
    obj = get_pod(kube, namespace, name)
    return obj if obj.get("status", {}).get("phase") in phases else None


def container_status(pod_obj: JSON, name: str = "main") -> JSON:
    """The status of container `name` in a pod object."""
    for status in pod_obj.get("status", {}).get("containerStatuses", []):
        if status["name"] == name:
            return dict(status)
    raise AssertionError(f"no status for container {name!r} in {pod_obj.get('status')}")


def condition(obj: JSON, ctype: str) -> JSON | None:
    """The status condition `ctype` of an object, if present."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def keelgate_venv(extras: str, workdir: Path) -> Path:
    """A venv holding keelgate with only ``extras`` (``operator,postgres``; "" for none),
    installed from the wheel the image's build makes (tests/support/image.py, which keeps it
    under .cache/ while it is what the install left). ``workdir``: where the wheel is built."""
    import sys

    tests = str(Path(__file__).resolve().parents[2] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.image import DOCKERFILE, build_wheel, image_venv, parse_dockerfile, stage_context

    context = stage_context(parse_dockerfile(DOCKERFILE.read_text()), workdir / "src")
    return image_venv(build_wheel(context, workdir / "dist"), extras)
