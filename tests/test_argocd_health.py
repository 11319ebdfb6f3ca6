"""The Argo CD health checks under ``deploy/argocd/`` and the kstatus reading of the same objects.

What a user would notice if these broke: Argo CD showing a run that waits for a person as
Progressing forever, a failed run as Healthy, a script error (Argo CD then shows the resource's
health as unknown), or an ``argocd-cm`` snippet that is not the Lua that was tested. Each
``health.lua`` runs in a real Lua 5.1 with exactly the libraries Argo CD opens
(``support/argocd.py``) over the samples captured from real runs
(``e2e/tests/test_e2e_health_samples.py``); the cases are read from argo-cd's own
``health_test.yaml`` files, the single list of them. The table in ``docs/gitops.md`` is checked
against both: its Argo CD column against those cases, its kstatus column against kstatus's rules
for a custom resource (sigs.k8s.io/cli-utils, ``pkg/kstatus/README.md``: Terminating, an
``observedGeneration`` behind, ``Reconciling``, ``Stalled``), computed here in a few lines rather
than imported.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.argocd import INVALID_MESSAGE, load_yaml, run_health
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
ARGOCD = ROOT / "deploy" / "argocd"
GROUP_DIR = ARGOCD / "keelgate.dev"
KINDS = ("AgentRun", "Reconciliation", "Approval")
DOC = ROOT / "docs" / "gitops.md"


def _cases() -> list[Any]:
    cases = []
    for kind in KINDS:
        listed = yaml.safe_load((GROUP_DIR / kind / "health_test.yaml").read_text())
        for case in listed["tests"]:
            cases.append(pytest.param(kind, case, id=f"{kind}/{case['inputPath']}"))
    return cases


CASES = _cases()


def _health(kind: str, sample: Path) -> dict[str, str]:
    return run_health((GROUP_DIR / kind / "health.lua").read_text(), load_yaml(sample))


@pytest.mark.parametrize(("kind", "case"), CASES)
def test_each_health_test_yaml_case_gives_its_status_and_message(
    kind: str, case: dict[str, Any]
) -> None:
    """Each case of a kind's health_test.yaml, run as argo-cd's TestLuaHealthScript runs it:
    the script over the sample gives exactly the listed status and message."""
    expected = case["healthStatus"]
    got = _health(kind, GROUP_DIR / kind / case["inputPath"])
    assert got == {"status": expected["status"], "message": expected.get("message", "")}


def test_every_sample_is_a_case_and_every_case_has_its_sample() -> None:
    """No captured sample goes untested and no case points at a missing file; every health
    state a run can be in for a GitOps tool is among the cases."""
    seen: dict[str, set[str]] = {}
    for kind in KINDS:
        listed = yaml.safe_load((GROUP_DIR / kind / "health_test.yaml").read_text())["tests"]
        paths = [case["inputPath"] for case in listed]
        files = sorted(
            p.relative_to(GROUP_DIR / kind).as_posix()
            for p in (GROUP_DIR / kind).glob("testdata/*.yaml")
        )
        assert sorted(paths) == files, kind
        seen[kind] = {case["healthStatus"]["status"] for case in listed}
    assert seen["AgentRun"] == {"Healthy", "Progressing", "Suspended", "Degraded"}
    assert (
        seen["Reconciliation"]
        == seen["Approval"]
        == {
            "Healthy",
            "Progressing",
            "Suspended",
            "Degraded",
        }
    )


def test_samples_are_captures_not_hand_written() -> None:
    """Every sample opens with the capture header the e2e test writes and has none of the
    noise it strips (so a hand-edited or raw `kubectl get` file stands out)."""
    for sample in sorted(GROUP_DIR.glob("*/testdata/*.yaml")):
        text = sample.read_text()
        assert text.startswith("# Captured from a real run by e2e/tests/"), sample
        obj = load_yaml(sample)
        assert not {"uid", "resourceVersion", "managedFields"} & set(obj["metadata"]), sample
        assert obj["metadata"]["namespace"] == "keelgate-samples", sample


def test_the_runtime_is_argo_cds_no_string_library_and_unknown_statuses() -> None:
    """The harness is as strict as Argo CD: string functions and methods are absent, and a
    status Argo CD does not know becomes Unknown with Argo CD's message."""
    obj = {"metadata": {"name": "x"}}
    with pytest.raises(Exception, match="string"):
        run_health('return {status = string.upper("healthy")}', obj)
    with pytest.raises(Exception, match="index a string value"):
        run_health('return {status = ("healthy"):upper()}', obj)
    assert run_health('return {status = "Fine"}', obj) == {
        "status": "Unknown",
        "message": INVALID_MESSAGE,
    }
    assert run_health('return {status = "Healthy"}', obj) == {"status": "Healthy", "message": ""}


def _argocd_cm() -> Any:
    return load_script("deploy/argocd/argocd_cm.py")


def test_the_argocd_cm_snippet_holds_each_health_lua_verbatim() -> None:
    """deploy/argocd/argocd-cm.yaml is what argocd_cm.py renders now, and read as YAML its keys
    are Argo CD's (`resource.customizations.health.keelgate.dev_<Kind>`) with each health.lua,
    byte for byte, as the value."""
    snippet = ARGOCD / "argocd-cm.yaml"
    assert snippet.read_text() == _argocd_cm().render(), "run `make argocd-cm`"
    doc = yaml.safe_load(snippet.read_text())
    assert (doc["kind"], doc["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert doc["data"] == {
        f"resource.customizations.health.keelgate.dev_{kind}": (
            GROUP_DIR / kind / "health.lua"
        ).read_text()
        for kind in KINDS
    }
    check = [sys.executable, str(ARGOCD / "argocd_cm.py"), "--check"]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's generic rules for a custom resource (its README's standard conditions)."""
    meta, status = obj["metadata"], obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    observed = status.get("observedGeneration")
    if observed is not None and observed != meta.get("generation"):
        return "InProgress"
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    if conditions.get("Reconciling") == "True":
        return "InProgress"
    if conditions.get("Stalled") == "True":
        return "Failed"
    return "Current"


ROW = re.compile(
    r"^\| (AgentRun|Reconciliation|Approval) \| `([a-z-]+)` \|[^|]*\| (\w+) \| (\w+) \|$"
)


def _doc_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        found = ROW.match(line)
        if found:
            kind, sample, argo, kstat = found.groups()
            rows.append((kind, sample, argo, kstat))
    return rows


def test_the_docs_table_says_what_argo_cd_and_kstatus_make_of_every_sample() -> None:
    """docs/gitops.md lists every sample once; its Argo CD column is what the health check
    gives (the health_test.yaml case) and its kstatus column is what kstatus's rules give for
    the same object: Current for a run at rest, whatever it waits for; InProgress while the
    operator works or has not caught up; Failed for a failed or stalled run."""
    rows = _doc_rows()
    samples = sorted((p.parents[1].name, p.stem) for p in GROUP_DIR.glob("*/testdata/*.yaml"))
    assert sorted((kind, sample) for kind, sample, _, _ in rows) == samples
    for kind, sample, argo, kstat in rows:
        obj = load_yaml(GROUP_DIR / kind / "testdata" / f"{sample}.yaml")
        assert _health(kind, GROUP_DIR / kind / "testdata" / f"{sample}.yaml")["status"] == argo, (
            kind,
            sample,
        )
        assert kstatus(obj) == kstat, (kind, sample)


def test_a_standby_run_is_suspended_to_argo_cd_and_current_to_kstatus() -> None:
    """A run another cluster's operator holds in the store, with the status this cluster's
    operator writes for it (``kube.status.desired_status``, Standby=True): Argo CD shows it
    Suspended with the holder named (neither Degraded nor Progressing forever), and kstatus
    reads it Current, so neither an Application nor a Flux wait in the standby cluster hangs or
    fails on it; the cluster holding the run shows it Progressing as usual."""
    from keelgate.kube.status import RunView, desired_status

    said = "held by cluster 'east' (operator 'op/3f9a1c@east') under epoch 2, its lease live 9 s"
    shown = {}
    for where, view in (
        ("standby", RunView(generation=1, outcome=None, step={}, stepping=False, standby=said)),
        ("holder", RunView(generation=1, outcome=None, step={"pod": "r-s1-a1"}, stepping=True)),
    ):
        status = desired_status(view, old={}, now="2026-12-07T06:00:00Z")
        obj = {
            "apiVersion": "keelgate.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "shop", "generation": 1},
            "spec": {"loop": "task", "suspend": False},
            "status": status,
        }
        lua = (GROUP_DIR / "AgentRun" / "health.lua").read_text()
        shown[where] = (run_health(lua, obj), kstatus(obj))
    assert shown["standby"] == ({"status": "Suspended", "message": f"Standby: {said}"}, "Current")
    assert shown["holder"][0]["status"] == "Progressing" and shown["holder"][1] == "InProgress"
