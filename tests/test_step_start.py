"""What a step pod's program imports before and after it has read its checkpoint.

Every step of every run is a new `keelgate step` process, so what it imports is paid at every
step (issue 12 part 4: exec to checkpoint loaded < 0.4 s; figures in docs/performance.md,
from bench/step_start.py). These tests run the real program over a real store (a SQLite file,
a PostgreSQL server) under `python -X importtime`, which names every module the process
imported, and check that the modules a step has no use for are never loaded: no Kubernetes
client or kopf, no interactive CLI (typer, click, rich), no model SDK or HTTP client when the
run's model and tools are Python, and, for a run that is already finished, nothing that builds a
loop (the manifest, the adapters, the loop itself), because such a step only reads its
checkpoint and exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keelgate.manifest import load_agentrun
from keelgate.stores import open_stores

DATA = Path(__file__).parent / "data"
SUPPORT = Path(__file__).parent / "support_tools"

# Never on a step's path, whatever the run: the operator's world and the interactive CLI.
NEVER = ("kopf", "kubernetes", "aiohttp", "typer", "click", "rich", "keelgate.kube", "temporalio")
# Not for a run whose model is scripted and whose tools are Python functions.
NO_PROVIDER = ("openai", "anthropic", "mcp", "httpx", "keelgate.adapters.models.openai")
# Not for a finished run: it reads its checkpoint and exits, building nothing.
NOTHING_BUILT = (
    "keelgate.manifest",
    "keelgate.adapters",
    "keelgate.runners.build",
    "keelgate.core.loop",
    "yaml",
    "jsonschema",
)


def record(store: str, *, run: str = "restock", manifest: str | None = None) -> None:
    """What the operator does before it starts a step pod: record the run's spec (by default
    tests/data/runner-task.yaml's)."""
    text = manifest if manifest is not None else (DATA / "runner-task.yaml").read_text()
    spec = load_agentrun(text).to_loop_spec()
    stores = open_stores(store)
    try:
        assert stores.specs is not None
        stores.specs.record_spec("shop", run, spec.to_json(), source="uid-1", generation=1)
    finally:
        stores.close()


def step_process(
    store: str, *, run: str, tools: Path, env: dict[str, str], python: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """One `keelgate step` process of ``run`` in namespace shop, its tools importable from
    ``tools``; it must exit 0."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("KEELGATE_FAILPOINTS", "PYTHONPATH")},
        "KEELGATE_STORE": store,
        "PYTHONPATH": str(tools),
        **env,
    }
    done = subprocess.run(
        [sys.executable, *python, "-m", "keelgate", "step", "-n", "shop", "--run", run],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def step(store: str, ledger: Path) -> tuple[dict[str, object], set[str]]:
    """One `keelgate step` process: its outcome line and every module it imported."""
    done = step_process(
        store,
        run="restock",
        tools=SUPPORT,
        env={"KG_RUNNER_LEDGER": str(ledger)},
        python=("-X", "importtime"),
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "keelgate.runners.step" in imported  # the output is what it seems to be
    outcome: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome, imported


def loaded(imported: set[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of ``imported`` that are one of ``packages`` or inside one of them."""
    return sorted(m for m in imported if any(m == p or m.startswith(p + ".") for p in packages))


def steps_of_a_run(store: str, ledger: Path) -> None:
    """Three steps of the run (each a process), checked as it goes, then one more of the
    finished run."""
    record(store)
    for expected in (("Running", 1), ("Running", 2), ("Succeeded", 3)):
        outcome, imported = step(store, ledger)
        assert (outcome["phase"], outcome["iteration"]) == expected
        assert loaded(imported, NEVER + NO_PROVIDER) == []
        # A step that runs an iteration builds its loop, so the test sees the build happen.
        assert "keelgate.core.loop" in imported
    outcome, imported = step(store, ledger)
    assert (outcome["phase"], outcome["iteration"]) == ("Succeeded", 3)
    assert loaded(imported, NEVER + NO_PROVIDER + NOTHING_BUILT) == []


def test_a_step_on_sqlite_loads_no_kubernetes_cli_or_provider_sdk(tmp_path: Path) -> None:
    """On a SQLite store: steps that run an iteration import no kopf, Kubernetes client,
    typer, click, rich or model SDK; the step of a finished run imports nothing that builds a
    loop either, and no PostgreSQL driver."""
    ledger = tmp_path / "ledger.jsonl"
    store = f"sqlite:///{tmp_path / 'kg.db'}"
    steps_of_a_run(store, ledger)
    _, imported = step(store, ledger)
    assert loaded(imported, ("psycopg", "psycopg_pool")) == []


@pytest.mark.postgres
def test_a_step_on_postgresql_loads_no_kubernetes_cli_or_provider_sdk(
    pg_url: str, tmp_path: Path
) -> None:
    """On a PostgreSQL store, as in a cluster: the same, and the SQLite library is not loaded
    either (only a SQLite store needs it)."""
    ledger = tmp_path / "ledger.jsonl"
    steps_of_a_run(pg_url, ledger)
    _, imported = step(pg_url, ledger)
    assert loaded(imported, ("sqlite3", "_sqlite3", "keelgate.stores.sqlite")) == []


def test_the_facade_imports_nothing_until_a_name_is_used() -> None:
    """`import keelgate` (which every keelgate module, a step's among them, runs first) loads
    neither pydantic nor the loop; `from keelgate import X` still gives X as before."""
    probe = (
        "import sys, keelgate\n"
        "before = sorted(m for m in ('pydantic', 'keelgate.core.loop', 'keelgate.stores') "
        "if m in sys.modules)\n"
        "from keelgate import Loop, open_stores, verify_audit\n"
        "from keelgate.core.audit import verify\n"
        "from keelgate.core.loop import Loop as RealLoop\n"
        "print(before, Loop is RealLoop, verify_audit is verify, callable(open_stores))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["[]", "True", "True", "True"]


PROBE_TOOL = """
import gc, json, os

def write(args, *, idempotency_key):
    with open(os.environ["KG_GC_PROBE"], "w") as out:
        json.dump({"collecting": gc.isenabled(), "frozen": gc.get_freeze_count()}, out)
    return {"ok": True}
"""

PROBE_RUN = """
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {name: probe, namespace: shop}
spec:
  goal: "see how the step collects garbage"
  model:
    provider: scripted
    name: demo
    script:
      - actions: [{tool: write, args: {n: 1}}]
      - done: true
        answer: "written"
  tools:
    - name: write
      sideEffect: WRITE
      inputSchema: {type: object, properties: {n: {type: integer}}, required: [n]}
      python: {callable: "kg_gc_probe:write"}
  budget: {maxIterations: 3}
"""


def test_a_step_collects_garbage_while_it_works_but_not_while_it_imports(
    tmp_path: Path,
) -> None:
    """A step process skips the garbage collector's passes over its start-up imports (0.04 to
    0.08 s of every step pod's start), yet its work (the model, the tools) runs with the
    collector on, so a long tool call cannot pile up garbage; the step itself still works."""
    (tmp_path / "kg_gc_probe.py").write_text(PROBE_TOOL)
    store = f"sqlite:///{tmp_path / 'kg.db'}"
    record(store, run="probe", manifest=PROBE_RUN)
    probe = tmp_path / "gc.json"
    done = step_process(store, run="probe", tools=tmp_path, env={"KG_GC_PROBE": str(probe)})
    assert json.loads(done.stdout.strip().splitlines()[-1])["iteration"] == 1
    seen = json.loads(probe.read_text())
    assert seen["collecting"] is True
    assert seen["frozen"] > 1000  # the imports' objects, set aside once they were done


def test_calling_the_cli_in_process_leaves_the_callers_collector_alone(tmp_path: Path) -> None:
    """Only the `keelgate` executable changes how garbage is collected: a program (or a test)
    calling `keelgate.cli.main` keeps its collector on and nothing of its own is frozen."""
    import gc

    from keelgate.cli import main

    frozen = gc.get_freeze_count()
    code = main(["step", "-n", "shop", "--run", "none", "--store", f"sqlite:///{tmp_path}/x.db"])
    assert code == 2  # no spec recorded for that run: bad input, one line
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
