"""Builds deploy/argocd/argocd-cm.yaml from the health checks in deploy/argocd/keelgate.dev/.

Why it exists: Argo CD reads custom health checks from its `argocd-cm` ConfigMap, one key per
kind (`resource.customizations.health.keelgate.dev_<Kind>`), while the checks are written and
tested as argo-cd lays them out (`<group>/<Kind>/health.lua`). This script makes the first from
the second, byte for byte, so the snippet people install is the Lua the tests ran.
`--write` writes it (`make argocd-cm`); `--check` fails while the file differs (`make lint`;
tests/test_argocd_health.py checks it too). Standard library only; it never edits a .lua file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GROUP = "keelgate.dev"
KINDS = ("AgentRun", "Reconciliation", "Approval")
TARGET = HERE / "argocd-cm.yaml"

HEADER = """\
# Generated from deploy/argocd/keelgate.dev/<Kind>/health.lua by deploy/argocd/argocd_cm.py.
# Do not edit: change the .lua files, then run `make argocd-cm`; tests/test_argocd_health.py
# fails while this file differs from them. What each health state means: docs/gitops.md.
#
# Install into Argo CD (keeps every other key of argocd-cm):
#   kubectl -n argocd patch configmap argocd-cm --type merge \\
#     --patch-file deploy/argocd/argocd-cm.yaml
# or list this file as a patch of argocd-cm in the kustomization that installs Argo CD.
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
data:
"""


def render() -> str:
    """The ConfigMap fragment: one block scalar per kind, its health.lua verbatim."""
    parts = [HEADER]
    for kind in KINDS:
        lua = (HERE / GROUP / kind / "health.lua").read_text()
        if not lua.endswith("\n") or lua.endswith("\n\n"):
            raise SystemExit(f"{kind}/health.lua must end with exactly one newline")
        parts.append(f"  resource.customizations.health.{GROUP}_{kind}: |\n")
        parts.extend(f"    {line}\n" if line else "\n" for line in lua.splitlines())
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {TARGET.name}")
    mode.add_argument("--check", action="store_true", help=f"fail if {TARGET.name} differs")
    args = parser.parse_args(argv)
    wanted = render()
    if args.write:
        TARGET.write_text(wanted)
        return 0
    if not TARGET.exists() or TARGET.read_text() != wanted:
        print(f"{TARGET} differs from the health.lua files: run `make argocd-cm`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
