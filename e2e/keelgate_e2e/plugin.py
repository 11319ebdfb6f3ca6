"""`kubectl keelgate ...` in e2e tests, run exactly as a user runs it.

Why it exists: the plugin's promise is that the machine's kubectl finds `kubectl-keelgate` on
PATH and hands it everything after `keelgate`; so tests put this venv's `bin` first on PATH, set
KUBECONFIG to the test cluster's kubeconfig, and call the real kubectl with the flags after the
plugin's name (kubectl refuses flags before it). It must never point the plugin at a cluster but
the one it is given, and never leave the developer's own KUBECONFIG or store URL in its
environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Where `pip install -e .` put `kubectl-keelgate` (and `keelgate`).
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class KubectlKeelgate:
    """`kubectl keelgate` as one user: `context` and `namespace` become flags when set."""

    kubectl: Path
    kubeconfig: Path
    context: str | None = "admin"
    namespace: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """Run `kubectl keelgate args... [--context C] [-n NS]`; never raises on its exit code."""
        cmd = [str(self.kubectl), "keelgate", *args]
        if self.context:
            cmd.append(f"--context={self.context}")
        if self.namespace:
            cmd += ["-n", self.namespace]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KEELGATE_STORE")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(self.env)
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )

    def as_user(self, context: str | None) -> KubectlKeelgate:
        return KubectlKeelgate(self.kubectl, self.kubeconfig, context, self.namespace, self.env)

    def with_env(self, **env: str) -> KubectlKeelgate:
        return KubectlKeelgate(
            self.kubectl, self.kubeconfig, self.context, self.namespace, {**self.env, **env}
        )


def kubeconfig_for(source: Path, target: Path, context: str, namespace: str) -> Path:
    """A copy of `source` whose current context is `context`, set to `namespace` (as
    `kubectl config set-context --current --namespace` would leave it)."""
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    for entry in config["contexts"]:
        if entry["name"] == context:
            entry["context"]["namespace"] = namespace
    config["current-context"] = context
    target.write_text(yaml.safe_dump(config))
    target.chmod(0o600)
    return target


def last_json(out: str) -> Any:
    """The one JSON object `--output json` ends stdout with."""
    return json.loads(out.strip().splitlines()[-1])
