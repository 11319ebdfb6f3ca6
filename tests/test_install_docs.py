"""docs/install.md and docs/runbook-outcome-unknown.md hold against the code, without a cluster.

Every ``keelgate`` and ``kubectl keelgate`` command they show names a real subcommand and real
options; every ``helm --set`` names a value of charts/keelgate; every ``kubectl patch`` of a
Reconciliation sends fields the CRD has, to the name the operator gives that Reconciliation;
every ``kubectl wait`` waits for a condition the operator sets; every file they apply exists.
The example manifests under examples/kind parse and validate, the shop they deploy serves what
the docs ask of it, and the story of install.md (a first run, then a run killed right after its
order, OutcomeUnknown, checked against the shop by the key, settled as executed, finished with
one order per run, and the audit's ``loop.reconciled`` event) plays out on the local runner
against that very shop. e2e/tests/test_e2e_install_docs.py renders the helm commands with the
real helm and dry-runs the manifests on the real API server. docs/operator.md's list of Events
names every reason the controller posts one with.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer.main
import yaml

from keelgate.cli import audit_tools as _audit  # noqa: F401 - registers audit RUN
from keelgate.cli import cluster as _cluster  # noqa: F401 - registers step and operator
from keelgate.cli import main
from keelgate.cli import tenant as _tenant  # noqa: F401 - registers tenant add|remove|list
from keelgate.cli.commands import app
from keelgate.cli.plugin.commands import app as plugin_app
from keelgate.kube.naming import action_object_name
from keelgate.kube.status import CONDITION_TYPES
from keelgate.manifest import load_agentrun

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "docs" / "install.md", ROOT / "docs" / "runbook-outcome-unknown.md"]
KIND = ROOT / "examples" / "kind"
CLUSTER_URL = "http://shop.shop.svc.cluster.local:8080"


def shell_lines(path: Path) -> list[str]:
    """The commands of a page's ```sh blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S)
    lines = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(shlex.join(words))
    return lines


ALL_LINES = [(path.name, line) for path in DOCS for line in shell_lines(path)]


def _keelgate_args(line: str) -> tuple[Any, list[str]] | None:
    """(the typer app, its arguments) for a line that runs keelgate: `keelgate ...`,
    `... -- keelgate ...` (kubectl exec), `docker run ... keelgate:TAG ...` (the image's
    entrypoint is keelgate), or the plugin, `kubectl keelgate ...`."""
    words = shlex.split(line)
    if words[0] == "keelgate":
        return app, words[1:]
    if words[:2] == ["kubectl", "keelgate"]:
        return plugin_app, words[2:]
    if "--" in words and words[words.index("--") + 1 :][:1] == ["keelgate"]:
        return app, words[words.index("--") + 2 :]
    if words[:2] == ["docker", "run"]:
        image = next(i for i, w in enumerate(words) if w.startswith("keelgate:"))
        return app, words[image + 1 :]
    return None


KEELGATE_LINES = [(n, line) for n, line in ALL_LINES if _keelgate_args(line) is not None]


@pytest.mark.parametrize(("page", "line"), KEELGATE_LINES)
def test_every_keelgate_command_in_the_docs_exists(page: str, line: str) -> None:
    """The subcommand is keelgate's (or the kubectl plugin's) and each option is one that
    subcommand takes."""
    found = _keelgate_args(line)
    assert found is not None
    typer_app, args = found
    group = typer.main.get_command(typer_app)
    assert isinstance(group, typer.core.TyperGroup)
    command: Any = group
    while isinstance(command, typer.core.TyperGroup) and args and not args[0].startswith("-"):
        # A command group (`keelgate tenant add`): down to the command itself.
        found_command = command.commands.get(args[0])
        assert found_command is not None, f"{page}: no {args[0]} command"
        command, args = found_command, args[1:]
    known = {opt for p in command.params for opt in [*p.opts, *p.secondary_opts]}
    given = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    assert given <= known, f"{page}: {line}: unknown {sorted(given - known)}"


def _crd_spec(kind: str) -> dict[str, Any]:
    for doc in yaml.safe_load_all((ROOT / "crds" / f"{kind}s.keelgate.dev.yaml").read_text()):
        if doc:
            schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return dict(schema["properties"]["spec"]["properties"])
    raise AssertionError(kind)


PATCHES = [(n, line) for n, line in ALL_LINES if " patch reconciliation " in line]


def test_every_page_shows_keelgate_commands_and_a_reconciliation_patch() -> None:
    """The parsing finds each page's commands: the checks below do not pass vacuously."""
    pages = {p.name for p in DOCS}
    assert {n for n, _ in KEELGATE_LINES} == pages
    assert {n for n, _ in PATCHES} == pages


@pytest.mark.parametrize(("page", "line"), PATCHES)
def test_every_reconciliation_patch_fits_the_crd(page: str, line: str) -> None:
    """The patch is valid JSON setting only fields the Reconciliation CRD has, with a boolean
    executed and a by; and it patches the name the operator gives that action's
    Reconciliation (restock-crash, action 1:1, place_order)."""
    words = shlex.split(line)
    name = words[words.index("reconciliation") + 1]
    assert name == action_object_name("restock-crash", "1:1", "place_order")
    assert words[words.index("--type") + 1] == "merge"
    patch = json.loads(words[words.index("-p") + 1])
    spec = patch["spec"]
    properties = _crd_spec("reconciliation")
    assert set(patch) == {"spec"} and set(spec) <= set(properties)
    assert isinstance(spec["executed"], bool) and properties["executed"]["type"] == "boolean"
    assert isinstance(spec["by"], str) and spec["by"]


WAITS = [(n, line) for n, line in ALL_LINES if "--for=condition=" in line]


@pytest.mark.parametrize(("page", "line"), WAITS)
def test_every_wait_is_for_a_condition_the_operator_sets(page: str, line: str) -> None:
    """kubectl wait --for=condition=X names a condition type the operator writes."""
    condition = re.search(r"--for=condition=(\w+)", line)
    assert condition is not None
    if " agentrun/" in line:
        assert condition.group(1) in CONDITION_TYPES
    else:
        assert condition.group(1) == "Available" and " deployment " in line  # Deployment's own


def test_every_file_the_docs_apply_exists() -> None:
    """Each `-f PATH` of the pages names a file or folder of this repository."""
    paths = [
        words[i + 1]
        for _, line in ALL_LINES
        for words in [shlex.split(line)]
        for i, w in enumerate(words[:-1])
        if w == "-f"
    ]
    assert paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


HELM = [(n, line) for n, line in ALL_LINES if line.startswith("helm ")]


def test_every_helm_value_the_docs_set_is_the_charts() -> None:
    """Each `--set key=value` of a helm command names a value charts/keelgate/values.yaml has
    (e2e/tests/test_e2e_install_docs.py renders them with the real helm)."""
    values = yaml.safe_load((ROOT / "charts" / "keelgate" / "values.yaml").read_text())
    keys = [
        words[i + 1].split("=", 1)[0]
        for _, line in HELM
        for words in [shlex.split(line)]
        for i, w in enumerate(words[:-1])
        if w == "--set"
    ]
    assert "image.tag" in keys and "store.existingSecret.name" in keys
    for key in keys:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key}: not a value of the chart"
            node = node[part]


# -- the example manifests -----------------------------------------------------------------------


def kind_docs() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(KIND.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_the_kind_manifests_are_kubernetes_objects_with_pinned_images() -> None:
    """Every document under examples/kind is a namespaced object, every AgentRun validates, and
    every image is pinned to a tag (keelgate:dev is the image install.md builds and loads)."""
    docs = kind_docs()
    kinds = {d["kind"] for d in docs}
    assert {"AgentRun", "ConfigMap", "Deployment", "Service", "StatefulSet"} <= kinds
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"] and doc["metadata"]["namespace"]
        if doc["kind"] == "AgentRun":
            assert load_agentrun(yaml.safe_dump(doc)).to_loop_spec().goal
    images = [
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert "keelgate:dev" in images
    assert all(":" in i and not i.endswith(":latest") for i in images)


def test_the_crash_run_is_the_first_run_armed() -> None:
    """agentrun-crash.yaml is agentrun.yaml with another name and the failpoint annotation
    that kills the first step pod right after its second tool call, the order."""
    first = yaml.safe_load((KIND / "agentrun.yaml").read_text())
    crash = yaml.safe_load((KIND / "agentrun-crash.yaml").read_text())
    assert crash["spec"] == first["spec"]
    assert crash["metadata"]["annotations"] == {"keelgate.dev/failpoints": "after_gateway_call@2"}
    assert [a["tool"] for a in first["spec"]["model"]["script"][0]["actions"]] == [
        "get_inventory",
        "place_order",
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[str]:
    """The shop of examples/kind/shop.yaml (its ConfigMap's script), on loopback."""
    configmap = next(d for d in kind_docs() if d["kind"] == "ConfigMap")
    script = tmp_path / "shop.py"
    script.write_text(configmap["data"]["shop.py"])
    port = _free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port)}
    process = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/orders", timeout=1)
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, "no shop"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_shop_answers_what_the_docs_ask(shop: str) -> None:
    """The shop reads stock, books an order under its Idempotency-Key, counts a key's orders
    (what a person checks) and answers a confirmer with a boolean."""
    assert httpx.get(f"{shop}/items/A1").json() == {"sku": "A1", "inStock": 3}
    posted = httpx.post(f"{shop}/orders", json={"qty": 1}, headers={"Idempotency-Key": "kg-1"})
    assert posted.status_code == 201
    assert httpx.get(f"{shop}/orders/kg-1").json() == {"key": "kg-1", "orders": 1}
    assert httpx.get(f"{shop}/confirm/kg-1").json() == {"executed": True}
    assert httpx.get(f"{shop}/confirm/kg-2").json() == {"executed": False}
    assert len(httpx.get(f"{shop}/orders").json()["orders"]) == 1


def _keelgate(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout


def test_the_install_story_plays_out_against_the_shop(
    shop: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sections 6 and 7 of install.md on the local runner: the first run orders once; the
    armed run dies right after its order (137), then stops with its place_order (1:1) unknown
    instead of ordering again; the shop has one order under its key; settled as executed, it
    finishes; the shop holds one order per run, and the audit trail verifies and shows the
    settlement as loop.reconciled with its actor, source and verdict."""
    for name in ("agentrun.yaml", "agentrun-crash.yaml"):
        (tmp_path / name).write_text((KIND / name).read_text().replace(CLUSTER_URL, shop))
    store = f"sqlite:///{tmp_path}/keelgate.db"

    assert _keelgate("run", "-f", "agentrun.yaml", "--store", store, cwd=tmp_path)[0] == 0
    crash = ["run", "-f", "agentrun-crash.yaml", "--store", store]
    died, _ = _keelgate(*crash, cwd=tmp_path, env={"KEELGATE_FAILPOINTS": "after_gateway_call@2"})
    assert died == 137
    code, out = _keelgate(*crash, "-o", "json", cwd=tmp_path)
    assert code == 3
    stopped = json.loads(out.strip().splitlines()[-1])
    assert stopped["stopReason"] == "outcome_unknown"
    [unknown] = stopped["unknownActions"]
    assert (unknown["action"], unknown["tool"]) == ("1:1", "place_order")
    key = unknown["idempotencyKey"]
    assert httpx.get(f"{shop}/orders/{key}").json()["orders"] == 1

    settle = ["reconcile", "restock-crash", "1:1", "--executed", "--by", "alice", "-n", "shop"]
    assert main([*settle, "--store", store]) == 0
    assert main(["resume", "restock-crash", "-n", "shop", "--store", store]) == 0
    orders = httpx.get(f"{shop}/orders").json()["orders"]
    assert len(orders) == 2 and len({o["key"] for o in orders}) == 2 and orders[1]["key"] == key

    capsys.readouterr()
    assert main(["audit", "restock-crash", "-n", "shop", "--store", store, "--verify"]) == 0
    assert "every link intact" in capsys.readouterr().out
    main(["audit", "restock-crash", "-n", "shop", "--store", store, "-o", "json"])
    events = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["events"]
    [reconciled] = [e for e in events if e["type"] == "loop.reconciled"]
    assert reconciled["actor"] == "alice"
    assert reconciled["data"]["source"] == "human"
    assert reconciled["data"]["verdict"] == "executed"
    assert reconciled["data"]["idempotencyKey"] == key


def test_operator_docs_name_every_event_the_controller_posts() -> None:
    """docs/operator.md's list of Events names every reason the controller posts an Event with
    (each literal one in keelgate.kube.controller), so `kubectl describe` shows no reason a user
    cannot look up."""
    source = "\n".join(
        path.read_text()
        for path in (ROOT / "operator" / "keelgate" / "kube" / "controller").glob("*.py")
    )
    posted = set(re.findall(r"events\.(?:normal|warning)\(\s*\w+,\s*\"([A-Za-z]+)\"", source))
    assert {"StepStarted", "FailedCreate", "TickCreated"} <= posted  # the pattern still finds them
    text = (ROOT / "docs" / "operator.md").read_text()
    listed = re.search(r"Events: (`.*?) `StepStarted` tells", text, re.DOTALL)
    assert listed is not None
    assert posted <= set(re.findall(r"`([A-Za-z]+)`", listed.group(1)))
