"""`keelgate step`, the program of a step pod, run as a real process over a real store.

The operator records a run's spec in the store and starts one step pod per iteration; these tests
play the operator's part (record the spec, start the program again and again) and check what the
operator reads back: the exit code, the last stdout line (one JSON outcome), and the effects in
the downstream ledger, through a real process death at a failpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keelgate.manifest import load_agentrun
from keelgate.stores import open_stores

DATA = Path(__file__).parent / "data"
SUPPORT = Path(__file__).parent / "support_tools"


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    return {"db": tmp_path / "kg.db", "ledger": ledger}


def record(store: str, text: str) -> None:
    """What the operator does before it starts a step pod: record the run's spec."""
    spec = load_agentrun(text).to_loop_spec()
    stores = open_stores(store)
    try:
        assert stores.specs is not None
        stores.specs.record_spec("shop", "restock", spec.to_json(), source="uid-1", generation=1)
    finally:
        stores.close()


def step(
    store: str, ledger: Path, *extra: str, failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KEELGATE_STORE": store,
        "KG_RUNNER_LEDGER": str(ledger),
        "PYTHONPATH": str(SUPPORT),
        "KEELGATE_FAILPOINTS": failpoints,
    }
    return subprocess.run(
        [sys.executable, "-m", "keelgate", "step", "-n", "shop", "--run", "restock", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def orders(ledger: Path) -> int:
    return sum(1 for line in ledger.read_text().splitlines() if '"place_order"' in line)


def outcome(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    last: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return last


def test_each_step_runs_one_iteration_and_says_how_the_run_stands(world: dict[str, Path]) -> None:
    """Three steps for a three-iteration run: each exits 0 with one JSON line (Running at
    iterations 1 and 2, then Succeeded), one order in all, and a fourth step changes nothing."""
    store = f"sqlite:///{world['db']}"
    record(store, (DATA / "runner-task.yaml").read_text())
    seen = []
    for _ in range(3):
        done = step(store, world["ledger"])
        assert done.returncode == 0, done.stderr
        result = outcome(done)
        seen.append((result["phase"], result["iteration"]))
    assert seen == [("Running", 1), ("Running", 2), ("Succeeded", 3)]
    assert orders(world["ledger"]) == 1
    again = step(store, world["ledger"])
    assert (again.returncode, outcome(again)["phase"]) == (0, "Succeeded")
    assert orders(world["ledger"]) == 1


def test_a_step_killed_after_its_write_leaves_the_next_step_an_unknown_outcome(
    world: dict[str, Path],
) -> None:
    """The step that places the order dies right after it (`os._exit(137)`, exit code 137 as a
    SIGKILL would give); the next step does not order again: it stops outcome_unknown, exit 3,
    naming the action, and the ledger holds one order."""
    store = f"sqlite:///{world['db']}"
    record(store, (DATA / "runner-task.yaml").read_text())
    assert step(store, world["ledger"]).returncode == 0  # iteration 1: the READ
    died = step(store, world["ledger"], failpoints="after_gateway_call@1")
    assert died.returncode == 137
    assert orders(world["ledger"]) == 1
    stopped = step(store, world["ledger"])
    assert stopped.returncode == 3, stopped.stderr
    result = outcome(stopped)
    assert (result["stopReason"], result["resumable"]) == ("outcome_unknown", True)
    assert [u["action"] for u in result["unknownActions"]] == ["2:0"]  # type: ignore[union-attr]
    assert orders(world["ledger"]) == 1


def test_what_a_step_cannot_do_is_one_line_and_the_exit_code_the_operator_reads(
    world: dict[str, Path], tmp_path: Path
) -> None:
    """No spec recorded: exit 2 naming --run; a store that is not there: exit 5; a missing
    option or a malformed KEELGATE_FAILPOINTS: exit 2. Never a traceback, never the password."""
    store = f"sqlite:///{world['db']}"
    open_stores(store).close()  # a store, but nothing recorded in it
    missing = step(store, world["ledger"])
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "--run" in missing.stderr
    gone = step("postgresql://kg:SecretPw9@127.0.0.1:9/none", world["ledger"])
    assert gone.returncode == 5, gone.stderr
    assert "SecretPw9" not in gone.stderr and "Traceback" not in gone.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "keelgate", "step", "-n", "shop"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KEELGATE_STORE": store},
    )
    assert bad.returncode == 2 and "--run" in bad.stderr and "Traceback" not in bad.stderr
    armed = step(store, world["ledger"], failpoints="after_nothing@x")
    assert armed.returncode == 2 and "KEELGATE_FAILPOINTS" in armed.stderr


def test_a_malformed_epoch_in_the_environment_is_one_line_and_leaves_help_working(
    world: dict[str, Path],
) -> None:
    """KEELGATE_EPOCH that is not a whole number: ``keelgate step --help`` still shows the
    flags (exit 0); a step run with it exits 2 naming KEELGATE_EPOCH in one line, before it
    touches the store (the run's spec and its checkpoint stay as they were)."""
    store = f"sqlite:///{world['db']}"
    record(store, (DATA / "runner-task.yaml").read_text())
    env = {**os.environ, "KEELGATE_STORE": store, "KEELGATE_EPOCH": "two"}
    shown = subprocess.run(
        [sys.executable, "-m", "keelgate", "step", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--epoch" in shown.stdout
    before = world["db"].read_bytes()
    bad = subprocess.run(
        [sys.executable, "-m", "keelgate", "step", "-n", "shop", "--run", "restock"],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "KG_RUNNER_LEDGER": str(world["ledger"]), "PYTHONPATH": str(SUPPORT)},
    )
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.count("\n") == 1 and "KEELGATE_EPOCH" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert world["db"].read_bytes() == before
    assert orders(world["ledger"]) == 0


def test_the_step_reads_the_spec_recorded_last(world: dict[str, Path]) -> None:
    """A raised budget recorded by the operator reaches the next step: a run stopped by
    max_iterations continues once a higher limit is recorded, without a new plan for it."""
    store = f"sqlite:///{world['db']}"
    data = yaml.safe_load((DATA / "runner-task.yaml").read_text())
    data["spec"]["budget"]["maxIterations"] = 1
    record(store, yaml.safe_dump(data))
    assert step(store, world["ledger"]).returncode == 0
    stopped = step(store, world["ledger"])
    assert (stopped.returncode, outcome(stopped)["stopReason"]) == (3, "max_iterations")
    data["spec"]["budget"]["maxIterations"] = 5
    record(store, yaml.safe_dump(data))
    resumed = step(store, world["ledger"])
    assert (resumed.returncode, outcome(resumed)["iteration"]) == (0, 2)
    assert orders(world["ledger"]) == 1


def test_a_confirmer_named_as_a_class_or_a_factory_is_one_ready_to_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--confirmer mod:Class`` makes an instance (a class also has ``confirm``, unbound) and
    ``mod:factory`` is called; each gives a confirmer that answers ``confirm``."""
    from keelgate.cli.step import load_confirmer

    (tmp_path / "kg_step_confirmers.py").write_text(
        "class Confirmer:\n"
        "    name = 'desk'\n"
        "    def confirm(self, tenant, run, unknown, args):\n"
        "        return True\n"
        "def factory():\n"
        "    return Confirmer()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("Confirmer", "factory"):
        confirmer = load_confirmer(f"kg_step_confirmers:{name}")
        assert not isinstance(confirmer, type), name
        assert confirmer.confirm("shop", "r", None, {}) is True, name


PAY_TWICE = """\
apiVersion: keelgate.dev/v1alpha1
kind: AgentRun
metadata: {name: restock, namespace: shop}
spec:
  goal: pay two invoices, once each
  model:
    provider: scripted
    name: demo
    script:
      - actions:
          - {tool: pay, args: {to: acme, amount: 40}}
          - {tool: pay, args: {to: bolt, amount: 7}}
      - done: true
        answer: paid
  tools:
    - name: pay
      sideEffect: WRITE
      timeoutSeconds: 30
      python: {callable: "kg_runner_tools:careful_pay"}
  budget: {maxIterations: 5}
"""


def test_a_step_asked_to_stop_mid_write_finishes_it_and_exits_75(
    world: dict[str, Path], tmp_path: Path
) -> None:
    """SIGTERM (a drain) while the first of two payments is being made: the step finishes that
    call, records it, stops at the next checkpoint without making the second, and exits 75
    (preempted) saying so. Nothing is unknown: the next step makes the second payment, and the
    run succeeds with each payment made once."""
    import signal
    import time

    store = f"sqlite:///{world['db']}"
    record(store, PAY_TWICE)
    ready, gate = tmp_path / "ready", tmp_path / "gate"
    env = {
        **os.environ,
        "KEELGATE_STORE": store,
        "KG_RUNNER_LEDGER": str(world["ledger"]),
        "KG_PAY_READY": str(ready),
        "KG_PAY_GATE": str(gate),
        "PYTHONPATH": str(SUPPORT),
    }
    argv = [sys.executable, "-m", "keelgate", "step", "-n", "shop", "--run", "restock"]
    pod = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or pod.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), pod.communicate()
        pod.send_signal(signal.SIGTERM)  # the eviction, mid-call
        time.sleep(0.3)
        assert pod.poll() is None  # still finishing its call
        gate.touch()
        out, err = pod.communicate(timeout=60)
    finally:
        gate.touch()
        if pod.poll() is None:
            pod.kill()
    assert pod.returncode == 75, err
    assert "asked to stop" in err and "error" not in err
    assert json.loads(out.strip().splitlines()[-1])["phase"] == "Running"
    paid = [json.loads(line)["args"]["to"] for line in world["ledger"].read_text().splitlines()]
    assert paid == ["acme"]
    stores = open_stores(store)
    try:
        keys = stores.checkpoints.load("shop", "restock")
        assert keys is not None and not keys.state.get("unknown")
    finally:
        stores.close()
    phases = []
    for _ in range(3):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        phases.append(outcome(done)["phase"])
        if phases[-1] == "Succeeded":
            break
    assert phases[-1] == "Succeeded"
    paid = [json.loads(line)["args"]["to"] for line in world["ledger"].read_text().splitlines()]
    assert paid == ["acme", "bolt"]
