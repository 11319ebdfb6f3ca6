"""The `keelgate` command line as a user and a script meet it: exit codes, JSON output, one-line
errors, and the crash -> unknown outcome -> reconcile -> resume path with a real process death."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from keelgate.cli import main
from keelgate.stores import open_stores
from keelgate.testing.deadlines import pass_deadlines
from support.restock import asked

TOOLS = """
import json, os
from pathlib import Path

import keelgate.testing

BOOK = Path(os.environ["BOOK"])

def look(args, *, idempotency_key):
    return {"sku": args["sku"], "inStock": 3}

def order(args, *, idempotency_key):
    with open(BOOK, "a") as book:
        book.write(json.dumps({"key": idempotency_key}) + "\\n")
        book.flush()
        os.fsync(book.fileno())
    keelgate.testing.failpoint("mid_tool")
    return {"ordered": True}
"""


def manifest(
    *,
    max_iterations: int = 10,
    approval: bool = False,
    side_effect: str = "WRITE",
    sku: str = "A1",
    dollars: str = "",
    tokens: int | None = None,
) -> str:
    budget = f"maxIterations: {max_iterations}" + (f', dollars: "{dollars}"' if dollars else "")
    budget += f", tokens: {tokens}" if tokens is not None else ""
    return textwrap.dedent(f"""\
        apiVersion: keelgate.dev/v1alpha1
        kind: AgentRun
        metadata: {{name: restock, namespace: shop}}
        spec:
          goal: restock
          model:
            provider: scripted
            name: demo
            script:
              - actions: [{{tool: look, args: {{sku: {sku}}}}}]
                usage: {{inputTokens: 10, outputTokens: 5}}
              - actions: [{{tool: order, args: {{sku: {sku}, qty: 20}}}}]
              - done: true
                answer: ordered
          tools:
            - {{name: look, sideEffect: READ, python: {{callable: "kgtools:look"}}}}
            - name: order
              sideEffect: {side_effect}
              requiresApproval: {str(approval).lower()}
              python: {{callable: "kgtools:order"}}
          budget: {{{budget}}}
        """)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the tool module, an order book, and the store; cwd is that folder."""
    (tmp_path / "kgtools.py").write_text(TOOLS)
    monkeypatch.setenv("BOOK", str(tmp_path / "book.jsonl"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("kgtools", None)
    return tmp_path


def write(world: Path, text: str) -> Path:
    path = world / "run.yaml"
    path.write_text(text)
    return path


def orders(world: Path) -> int:
    book = world / "book.jsonl"
    return len(book.read_text().splitlines()) if book.exists() else 0


def last_json(out: str) -> dict[str, object]:
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def cli(world: Path, *args: str, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    """Run `python -m keelgate` in a real process (needed for real crashes)."""
    env = {**os.environ, "PYTHONPATH": f"{world}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("KEELGATE_FAILPOINTS", None)
    if failpoints:
        env["KEELGATE_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "keelgate", *args],
        cwd=world,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_to_goal_prints_the_contract_json_and_exits_0(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --output json` ends with one JSON object in the contract's shape; goal met is 0."""
    code = main(["run", "-f", str(write(world, manifest())), "--output", "json"])
    result = last_json(capsys.readouterr().out)
    assert code == 0
    assert result["run"] == "restock" and result["phase"] == "Succeeded"
    assert result["stopReason"] == "goal_met" and result["resumable"] is False
    assert result["iteration"] == 3 and result["unknownActions"] == []
    assert result["usage"] == {
        "inputTokens": 10,
        "outputTokens": 5,
        "dollars": "0",
        "activeSeconds": result["usage"]["activeSeconds"],
    }  # type: ignore[index]
    assert orders(world) == 1


def test_a_budget_stop_exits_3_and_resume_with_more_continues(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget stop is resumable (exit 3); `resume --max-iterations` continues to the goal."""
    path = write(world, manifest(max_iterations=1))
    assert main(["run", "-f", str(path), "-o", "json"]) == 3
    stopped = last_json(capsys.readouterr().out)
    assert stopped["stopReason"] == "max_iterations" and stopped["resumable"] is True
    assert main(["resume", "restock", "--max-iterations", "5", "-o", "json"]) == 0
    assert last_json(capsys.readouterr().out)["stopReason"] == "goal_met"
    assert orders(world) == 1


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["resume", "restock", "--tokens", "many"], "--tokens"),
        (["resume", "restock", "--dollars", "lots"], "--dollars"),
        (["resume", "restock", "--max-iterations", "0"], "--max-iterations"),
        (["reconcile", "restock", "2:0", "--by", "alice"], "--executed"),
        (["approve", "restock", "2:0", "--by", "bob"], "--approve"),
        (["run"], "--file"),
        (["run", "-f", "missing.yaml"], "--file"),
        (["audit", "restock", "--store", "mysql://x"], "--store"),
        (["approve", "restock", "2:0", "--approve", "--by", " "], "--by:"),
        (["reconcile", "restock", "2:0", "--executed", "--by", "a\nb"], "--by:"),
        (["resume", "restock", "--tokens", "99999999999999999999999999"], "--tokens"),
        (["resume", "restock", "--max-iterations", str(2**63)], "--max-iterations"),
        (["resume", "restock", "--timeout", "inf"], "--timeout"),
        (["resume", "restock", "--timeout", "1e300"], "--timeout"),
        (["resume", "restock", "--timeout", "nan"], "--timeout"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(
    world: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    """A bad flag is one line on stderr naming the flag, exit 2, never a traceback."""
    main(["run", "-f", str(write(world, manifest(max_iterations=1)))])
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert field in err and "Traceback" not in err


def test_a_bad_manifest_exits_2_names_the_field_and_touches_no_saved_state(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad field is exit 2 with its path; the run already in the store is unchanged."""
    good = write(world, manifest(max_iterations=1))
    assert main(["run", "-f", str(good)]) == 3
    db = world / ".keelgate" / "keelgate.db"
    before = db.read_bytes()
    capsys.readouterr()
    bad = write(world, manifest(side_effect="DESTROY"))
    assert main(["run", "-f", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "spec.tools[1].sideEffect" in err
    assert db.read_bytes() == before


def test_a_bad_failpoint_setting_is_one_line_and_exit_2(world: Path) -> None:
    """KEELGATE_FAILPOINTS with an unknown name is refused before anything runs."""
    done = cli(world, "run", "-f", str(write(world, manifest())), failpoints="after_lunch@1")
    assert done.returncode == 2
    assert "after_lunch" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (world / ".keelgate").exists()


def test_a_real_crash_after_the_write_stops_unknown_until_reconciled(world: Path) -> None:
    """Process killed after the WRITE ran: rerun stops outcome_unknown (exit 3) instead of
    ordering again; reconcile --executed and resume finish with exactly one order; the audit
    chain verifies and never shows the arguments."""
    path = str(write(world, manifest(sku="SKU-SECRET-77")))
    crashed = cli(world, "run", "-f", path, failpoints="after_gateway_call@2")
    assert crashed.returncode == 137
    assert orders(world) == 1

    rerun = cli(world, "run", "-f", path, "-o", "json")
    assert rerun.returncode == 3, rerun.stderr
    stopped = last_json(rerun.stdout)
    assert stopped["stopReason"] == "outcome_unknown"
    unknown = stopped["unknownActions"]
    assert isinstance(unknown, list) and unknown[0]["action"] == "2:0"
    assert unknown[0]["tool"] == "order" and unknown[0]["idempotencyKey"].startswith("kg-")
    assert orders(world) == 1

    settled = cli(world, "reconcile", "restock", "2:0", "--executed", "--by", "alice")
    assert settled.returncode == 0, settled.stderr
    again = cli(world, "reconcile", "restock", "2:0", "--not-executed", "--by", "mallory")
    assert again.returncode == 2 and "already settled as executed by alice" in again.stderr

    resumed = cli(world, "resume", "restock", "-o", "json")
    assert resumed.returncode == 0, resumed.stderr
    assert last_json(resumed.stdout)["stopReason"] == "goal_met"
    assert orders(world) == 1

    audit = cli(world, "audit", "restock", "--verify", "-o", "json")
    assert audit.returncode == 0
    trail = last_json(audit.stdout)
    assert trail["verified"] is True
    reconciled = [e for e in trail["events"] if e["type"] == "loop.reconciled"]  # type: ignore[union-attr]
    assert [(e["actor"], e["data"]["source"], e["data"]["verdict"]) for e in reconciled] == [
        ("alice", "human", "executed")
    ]
    assert "SKU-SECRET-77" not in audit.stdout + rerun.stdout + resumed.stdout


def test_audit_verify_exits_1_when_an_event_was_edited(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Editing one stored audit event breaks the chain: `audit --verify` says so, exit 1."""
    assert main(["run", "-f", str(write(world, manifest()))]) == 0
    with sqlite3.connect(world / ".keelgate" / "keelgate.db") as db:
        db.execute("UPDATE keelgate_audit SET actor = 'mallory' WHERE seq = 3")
    capsys.readouterr()
    assert main(["audit", "restock", "--verify"]) == 1
    assert "altered" in capsys.readouterr().out


def _pg_audit(url: str, statement: str) -> None:
    """Change the audit table straight in the database, as someone with write access would."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute(statement)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("statement", "named"),
    [
        (
            "UPDATE keelgate_audit SET data = '{\"forged\": true}' WHERE seq = 3",
            "event 3 (loop.action_started) was altered",
        ),
        ("DELETE FROM keelgate_audit WHERE seq = 4", "event 4 is missing"),
    ],
    ids=["edited", "removed"],
)
def test_audit_verify_on_postgres_exits_1_naming_an_edited_or_removed_event(
    world: Path, capsys: pytest.CaptureFixture[str], pg_url: str, statement: str, named: str
) -> None:
    """On the PostgreSQL store, an event edited or removed in the database is found by
    `audit --verify`: exit 1, the problem named in the output (JSON too); before it, exit 0."""
    assert main(["run", "-f", str(write(world, manifest())), "--store", pg_url]) == 0
    assert main(["audit", "restock", "--verify", "--store", pg_url]) == 0
    _pg_audit(pg_url, statement)
    capsys.readouterr()
    assert main(["audit", "restock", "--verify", "--store", pg_url]) == 1
    assert named in capsys.readouterr().out
    assert main(["audit", "restock", "--verify", "--store", pg_url, "-o", "json"]) == 1
    checked = last_json(capsys.readouterr().out)
    problems = checked["problems"]
    assert checked["verified"] is False and isinstance(problems, list)
    assert any(named in problem for problem in problems), problems


@pytest.mark.postgres
def test_audit_verify_on_postgres_exits_1_when_the_newest_events_are_cut_off(
    world: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    """Deleting the newest events leaves a chain whose links are all intact; on the PostgreSQL
    store `audit --verify` still finds the end missing (the checkpoint's last event is not on
    the chain) and exits 1 saying so."""
    assert main(["run", "-f", str(write(world, manifest())), "--store", pg_url]) == 0
    assert main(["audit", "restock", "--verify", "--store", pg_url]) == 0
    _pg_audit(
        pg_url,
        "DELETE FROM keelgate_audit WHERE seq > (SELECT MAX(seq) - 2 FROM keelgate_audit)",
    )
    capsys.readouterr()
    assert main(["audit", "restock", "--verify", "--store", pg_url, "-o", "json"]) == 1
    checked = last_json(capsys.readouterr().out)
    problems = checked["problems"]
    assert checked["verified"] is False and isinstance(problems, list)
    (problem,) = problems
    assert "events were removed from the end" in problem


def test_a_call_whose_input_alone_would_cross_the_token_budget_is_not_made_by_the_cli(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run` with a token budget smaller than the first request: exit 3 token_budget before the
    model is asked (iteration 0, no tokens used, no tool run), and `resume --tokens` with room
    makes that call and finishes with one order."""
    assert main(["run", "-f", str(write(world, manifest(tokens=5))), "-o", "json"]) == 3
    stopped = last_json(capsys.readouterr().out)
    assert (stopped["stopReason"], stopped["resumable"]) == ("token_budget", True)
    usage = stopped["usage"]
    assert stopped["iteration"] == 0 and isinstance(usage, dict)
    assert usage["inputTokens"] == usage["outputTokens"] == 0
    assert "input alone" in str(stopped["message"])
    assert orders(world) == 0
    assert main(["resume", "restock", "--tokens", "100000", "-o", "json"]) == 0
    done = last_json(capsys.readouterr().out)
    assert (done["stopReason"], done["iteration"]) == ("goal_met", 3)
    assert orders(world) == 1


def test_an_approval_asked_for_at_plan_time_is_still_asked_after_the_manifest_drops_it(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A WRITE planned while its tool required approval stops awaiting_approval; the manifest is
    then edited so the tool no longer asks. Running it again still waits (exit 3, the same
    action pending) and orders nothing; only a person's approval lets it run, once."""
    assert main(["run", "-f", str(write(world, manifest(approval=True))), "-o", "json"]) == 3
    assert last_json(capsys.readouterr().out)["stopReason"] == "awaiting_approval"
    edited = write(world, manifest(approval=False))
    for _ in range(2):
        assert main(["run", "-f", str(edited), "-o", "json"]) == 3
        waiting = last_json(capsys.readouterr().out)
        assert waiting["stopReason"] == "awaiting_approval"
        assert asked(waiting["pendingApprovals"]) == [{"action": "2:0", "tool": "order"}]
    assert orders(world) == 0
    assert main(["approve", "restock", "2:0", "--approve", "--by", "bob"]) == 0
    assert main(["run", "-f", str(edited), "-o", "json"]) == 0
    assert orders(world) == 1


def test_a_denied_approval_never_runs_the_write(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """requiresApproval stops before the call (exit 3); --deny means it never runs."""
    assert main(["run", "-f", str(write(world, manifest(approval=True))), "-o", "json"]) == 3
    stopped = last_json(capsys.readouterr().out)
    assert stopped["stopReason"] == "awaiting_approval"
    assert asked(stopped["pendingApprovals"]) == [{"action": "2:0", "tool": "order"}]
    assert main(["approve", "restock", "2:0", "--deny", "--by", "bob"]) == 0
    assert main(["resume", "restock", "-o", "json"]) == 0
    assert orders(world) == 0


def test_two_people_from_a_group_approve_in_process_with_by_and_group(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool asking two approvals from group payments, not the creator (the manifest's
    keelgate.dev/created-by): the creator's approval is refused (exit 2, one line saying why),
    so is someone outside the group; the first approval from the group says "1 of 2" and
    leaves the run waiting (resume exits 3, nothing ordered); the second lets it order once."""
    text = manifest(approval=True).replace(
        "metadata: {name: restock, namespace: shop}",
        "metadata: {name: restock, namespace: shop, annotations: {keelgate.dev/created-by: ann}}",
    )
    text = text.replace(
        "requiresApproval: true",
        "approval: {required: 2, groups: [payments], notCreator: true}",
    )
    assert main(["run", "-f", str(write(world, text)), "-o", "json"]) == 3
    stopped = last_json(capsys.readouterr().out)
    assert asked(stopped["pendingApprovals"]) == [
        {
            "action": "2:0",
            "tool": "order",
            "rule": {"required": 2, "groups": ["payments"], "notCreator": True},
        }
    ]
    assert (
        main(["approve", "restock", "2:0", "--approve", "--by", "ann", "--group", "payments"]) == 2
    )
    assert "ann created the run" in capsys.readouterr().err
    assert main(["approve", "restock", "2:0", "--approve", "--by", "eve", "--group", "ops"]) == 2
    assert "eve may not decide it" in capsys.readouterr().err
    assert (
        main(["approve", "restock", "2:0", "--approve", "--by", "bob", "--group", "payments"]) == 0
    )
    assert "approved (1 of 2; waiting for 1 more) by bob" in capsys.readouterr().out
    assert main(["resume", "restock", "-o", "json"]) == 3
    assert orders(world) == 0
    capsys.readouterr()
    assert main(["status", "restock"]) == 3
    assert (
        "awaiting approval: order (action 2:0): 1 of 2 approvals from payments, not the run's "
        "creator (so far bob)"
    ) in " ".join(capsys.readouterr().out.split())
    command = ["approve", "restock", "2:0", "--approve", "--by", "cy", "--group", "payments"]
    assert main([*command, "-o", "json"]) == 0
    assert "pending" not in last_json(capsys.readouterr().out)
    assert main(["resume", "restock", "-o", "json"]) == 0
    assert orders(world) == 1


def test_resume_of_an_unknown_run_is_bad_input(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Naming a run the store does not hold is exit 2 with one line naming it; a store that does
    not exist is named as such, and reading commands never create one."""
    for command in (["resume", "nosuch"], ["status", "nosuch"], ["audit", "nosuch", "--verify"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "no store at" in err and len(err.splitlines()) == 1
    assert not (world / ".keelgate").exists()
    assert main(["run", "-f", str(write(world, manifest()))]) == 0
    capsys.readouterr()
    for command in (["resume", "nosuch"], ["status", "nosuch"], ["audit", "nosuch", "--verify"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert "no run named 'nosuch'" in err and len(err.splitlines()) == 1


def test_resume_imports_the_manifests_own_tools_from_anywhere(
    world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run -f` remembers the manifest's folder, so `resume` from another directory (with no
    PYTHONPATH) still finds the manifest's Python tools."""
    folder = world / "agent"
    folder.mkdir()
    (world / "kgtools.py").rename(folder / "kgtools.py")
    path = folder / "run.yaml"
    path.write_text(manifest(max_iterations=1))
    store = f"sqlite:///{world / 'state.db'}"
    elsewhere = world / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(world)])
    sys.modules.pop("kgtools", None)
    assert main(["run", "-f", str(path), "--store", store]) == 3
    sys.modules.pop("kgtools", None)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(folder)])
    capsys.readouterr()
    assert main(["resume", "restock", "--max-iterations", "5", "--store", store]) == 0
    assert orders(world) == 1


@pytest.mark.parametrize("store", ["memory://", "MEMORY://", "Memory://x"])
def test_memory_store_is_refused_by_the_cli(
    world: Path, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    """memory:// keeps nothing past the command, so its resume hint would lie: refused, in
    whatever case its scheme is written (a URL's scheme is read without case), and nothing
    runs."""
    assert main(["run", "-f", str(write(world, manifest())), "--store", store]) == 2
    assert "memory://" in capsys.readouterr().err
    assert orders(world) == 0


def test_a_missing_api_key_is_bad_input_naming_the_variable(
    world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real provider whose key variable is unset stops before anything runs: exit 2, one line
    naming spec.model.apiKeyEnv and the variable, and no store is created."""
    monkeypatch.delenv("KG_TEST_NO_SUCH_KEY", raising=False)
    text = textwrap.dedent("""\
        apiVersion: keelgate.dev/v1alpha1
        kind: AgentRun
        metadata: {name: restock}
        spec:
          goal: restock
          model: {provider: openai, name: gpt-test, apiKeyEnv: KG_TEST_NO_SUCH_KEY}
          tools:
            - {name: look, sideEffect: READ, python: {callable: "kgtools:look"}}
        """)
    assert main(["run", "-f", str(write(world, text))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "spec.model.apiKeyEnv" in err and "KG_TEST_NO_SUCH_KEY" in err
    assert not (world / ".keelgate").exists()


def test_a_pricing_file_prices_a_manifest_that_states_no_prices(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a dollar budget and no price the run stops cost_unknown before any model call;
    `--pricing FILE` supplies the price by model name and dollars are charged exactly."""
    path = write(world, manifest(dollars="1.00"))
    assert main(["run", "-f", str(path), "-o", "json"]) == 3
    stopped = last_json(capsys.readouterr().out)
    assert stopped["stopReason"] == "cost_unknown" and stopped["iteration"] == 0
    prices = world / "prices.yaml"
    prices.write_text(
        'models:\n  demo: {inputPerMillionTokens: "0.40", outputPerMillionTokens: "1.60"}\n'
    )
    assert main(["resume", "restock", "--pricing", str(prices), "-o", "json"]) == 0
    done = last_json(capsys.readouterr().out)
    assert done["stopReason"] == "goal_met"
    assert done["usage"]["dollars"] == "0.000012"  # type: ignore[index]  # 10 in, 5 out


def test_a_bad_pricing_file_is_one_line_naming_the_entry(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pricing file with a bad price is exit 2 naming --pricing and the entry, nothing run."""
    prices = world / "prices.yaml"
    prices.write_text(
        'models:\n  demo: {inputPerMillionTokens: "cheap", outputPerMillionTokens: "1"}\n'
    )
    code = main(["run", "-f", str(write(world, manifest())), "--pricing", str(prices)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--pricing" in err and "models.demo.inputPerMillionTokens" in err
    assert orders(world) == 0


def test_status_of_a_run_whose_process_died_is_running_and_resumable(world: Path) -> None:
    """A run with no stop recorded (its process died) shows phase Running, an empty stop
    reason, resumable, exit 3: never a failure a script would give up on."""
    path = str(write(world, manifest()))
    assert cli(world, "run", "-f", path, failpoints="after_plan@1").returncode == 137
    status = cli(world, "status", "restock", "-o", "json")
    assert status.returncode == 3
    shown = last_json(status.stdout)
    assert (shown["phase"], shown["stopReason"], shown["resumable"]) == ("Running", "", True)
    assert cli(world, "resume", "restock").returncode == 0
    assert orders(world) == 1


def _signalled_mid_run(world: Path, signum: int) -> tuple[int, str]:
    """Start `keelgate run` in a process of its own, send it ``signum`` while its slow READ runs,
    and return its exit code and stderr."""
    import signal
    import time

    started = world / "look-started"
    slow = TOOLS.replace(
        'return {"sku": args["sku"], "inStock": 3}',
        'Path(os.environ["STARTED"]).touch()\n'
        '    import time; time.sleep(float(os.environ.get("SLOW", "0")))\n'
        '    return {"sku": args["sku"], "inStock": 3}',
    )
    (world / "kgtools.py").write_text(slow)
    env = {**os.environ, "PYTHONPATH": str(world), "SLOW": "30", "STARTED": str(started)}
    env.pop("KEELGATE_FAILPOINTS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "keelgate", "run", "-f", str(write(world, manifest()))],
        cwd=world,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal. A test run started in the background by a shell without job
        # control (`sh -c '...' &`) inherits SIGINT ignored, and Python then keeps ignoring it:
        # the run would finish and exit 0, as `nohup`'s commands rightly do.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # The signal must land mid-run, not before the run has begun: wait for the slow READ to start.
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists(), "the run never reached its READ"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def test_ctrl_c_is_one_line_and_exit_130_and_the_run_resumes(world: Path) -> None:
    """SIGINT during a run: one line saying how to continue (the resume command with the run's
    own name, not a placeholder), exit 130, no traceback; the resume finishes with exactly one
    order."""
    import signal

    code, err = _signalled_mid_run(world, signal.SIGINT)
    assert code == 130
    assert "interrupted" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "`keelgate resume restock`" in err and "RUN" not in err  # the command, ready to use
    assert cli(world, "resume", "restock").returncode == 0
    assert orders(world) == 1


def test_sigterm_stops_a_run_as_ctrl_c_does_with_exit_143(world: Path) -> None:
    """SIGTERM during a run (`timeout`, a service manager, `kill`) is one line saying it was
    terminated and how to continue, exit 143 as a shell reports it, no traceback (it used to
    end the process without a word); the resume finishes with exactly one order."""
    import signal

    code, err = _signalled_mid_run(world, signal.SIGTERM)
    assert code == 143
    assert err.strip().splitlines() == [
        "keelgate: error: terminated (SIGTERM): nothing saved was lost; `keelgate resume "
        "restock` continues from the last checkpoint (a WRITE cut off mid-call becomes an "
        "unknown outcome to settle)"
    ]
    assert cli(world, "resume", "restock").returncode == 0
    assert orders(world) == 1


def test_errors_under_output_json_end_with_a_json_object(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script asking for JSON gets JSON even for bad input: the last stdout line is one object
    with the error and the exit code; stderr still has the one line for people."""
    assert main(["run", "-f", "missing.yaml", "-o", "json"]) == 2
    captured = capsys.readouterr()
    assert last_json(captured.out) == {
        "error": "--file: missing.yaml: no such file",
        "exitCode": 2,
    }
    assert "missing.yaml" in captured.err


def test_runs_lists_every_run_with_where_it_stands(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keelgate runs` shows each run's namespace, phase and stop reason; -n narrows it, and an
    empty namespace says which namespaces do hold runs."""
    assert main(["runs"]) == 2  # no store yet: said so, nothing created
    capsys.readouterr()
    assert main(["run", "-f", str(write(world, manifest(max_iterations=1)))]) == 3
    other = manifest().replace("{name: restock, namespace: shop}", "{name: audit, namespace: ops}")
    assert main(["run", "-f", str(write(world, other))]) == 0
    capsys.readouterr()
    assert main(["runs", "-o", "json"]) == 0
    listed = last_json(capsys.readouterr().out)["runs"]
    assert [(r["namespace"], r["run"], r["phase"], r["stopReason"]) for r in listed] == [  # type: ignore[union-attr]
        ("ops", "audit", "Succeeded", "goal_met"),
        ("shop", "restock", "Stopped", "max_iterations"),
    ]
    assert main(["runs", "-n", "shop"]) == 0
    text = capsys.readouterr().out
    assert "restock" in text and "max_iterations" in text and "audit" not in text
    assert main(["runs", "-n", "nope"]) == 0  # empty there is not empty everywhere
    text = " ".join(capsys.readouterr().out.split())
    assert text == "no runs in namespace 'nope' in this store (namespaces with runs: ops, shop)"


def test_resume_warns_when_a_new_total_is_not_more_than_what_is_used(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Budgets on resume are totals: a total at or below what the run already used is named in
    a warning, since the run would stop again at once; a real raise continues without one."""
    assert main(["run", "-f", str(write(world, manifest(max_iterations=1)))]) == 3
    capsys.readouterr()
    assert main(["resume", "restock", "--max-iterations", "1"]) == 3
    assert "--max-iterations 1 is a new total, not more: 1 is already used" in (
        capsys.readouterr().err
    )
    assert main(["resume", "restock", "--max-iterations", "5"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--deny", "--approve"], ["--approve", "--deny"]],
    ids=["deny-then-approve", "approve-then-deny"],
)
def test_an_approval_given_both_ways_is_refused_and_decides_nothing(
    world: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    """`approve --deny --approve` cannot be undone once taken, so neither flag may silently win:
    exit 2, one line naming both flags, and the run still waits for a decision."""
    assert main(["run", "-f", str(write(world, manifest(approval=True)))]) == 3
    capsys.readouterr()
    assert main(["approve", "restock", "2:0", *flags, "--by", "carol"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--approve" in err and "--deny" in err, err
    assert main(["status", "restock", "-o", "json"]) == 3
    shown = last_json(capsys.readouterr().out)
    assert shown["stopReason"] == "awaiting_approval"
    assert asked(shown["pendingApprovals"]) == [{"action": "2:0", "tool": "order"}]


def test_a_reconcile_given_both_ways_is_refused_and_settles_nothing(world: Path) -> None:
    """`reconcile --executed --not-executed` would settle an unknown outcome for good on
    whichever flag came last: both orders are exit 2 with one line, and the outcome stays
    unknown for a real decision."""
    path = str(write(world, manifest()))
    assert cli(world, "run", "-f", path, failpoints="after_gateway_call@2").returncode == 137
    for flags in (["--executed", "--not-executed"], ["--not-executed", "--executed"]):
        done = cli(world, "reconcile", "restock", "2:0", *flags, "--by", "alice")
        assert done.returncode == 2, done.stderr
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and "--executed" in err and "--not-executed" in err
    status = cli(world, "run", "-f", path, "-o", "json")
    assert status.returncode == 3
    assert last_json(status.stdout)["stopReason"] == "outcome_unknown"
    assert orders(world) == 1


def test_a_manifest_path_that_is_not_a_regular_file_says_so(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run -f` of a device or a FIFO says it is not a regular file (it said "no such file", and
    a FIFO must not be read: that would wait for a writer for good); exit 2, one line."""
    fifo = world / "pipe.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        assert main(["run", "-f", path]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"keelgate: error: --file: {path} is not a regular file"
        ]
    assert not (world / ".keelgate").exists()


def _with_tool_timeout(text: str, value: str) -> str:
    """The manifest with ``timeoutSeconds: value`` on its WRITE tool, ``order``."""
    line = "      requiresApproval: false\n"
    assert text.count(line) == 1
    return text.replace(line, f"{line}      timeoutSeconds: {value}\n")


@pytest.mark.parametrize("value", [".inf", "1.0e+300", ".nan", "31536001"])
@pytest.mark.parametrize("where", ["spec.tools[1].timeoutSeconds", "spec.budget.timeoutSeconds"])
def test_a_time_limit_that_no_clock_can_keep_is_bad_input_naming_the_field(
    world: Path, capsys: pytest.CaptureFixture[str], value: str, where: str
) -> None:
    """A timeout of infinity, NaN or more than a year is refused before anything runs (exit 2,
    one line naming the field, no store made). An infinite tool timeout used to be accepted,
    and then every call of that WRITE ran and stopped the run as an unknown outcome."""
    text = manifest()
    if where.startswith("spec.tools"):
        text = _with_tool_timeout(text, value)
    else:
        text = text.replace(
            "budget: {maxIterations", f"budget: {{timeoutSeconds: {value}, maxIterations"
        )
    assert f"timeoutSeconds: {value}" in text
    assert main(["run", "-f", str(write(world, text))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"keelgate: error: {where}: "), err
    assert not (world / ".keelgate").exists()
    assert orders(world) == 0


def test_a_write_with_the_longest_tool_timeout_runs_once_and_is_recorded(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The longest tool timeout taken (a year) is one a thread can wait: the WRITE runs once and
    its result is recorded, the run meets its goal."""
    text = _with_tool_timeout(manifest(), "31536000")
    assert main(["run", "-f", str(write(world, text)), "-o", "json"]) == 0
    assert last_json(capsys.readouterr().out)["stopReason"] == "goal_met"
    assert orders(world) == 1


def test_a_python_tool_refuses_a_timeout_it_could_not_keep() -> None:
    """In Python, a PythonTool with a timeout of infinity, NaN, zero or more than a year is
    refused when it is made, not when a WRITE is already running."""
    from keelgate.adapters.tools.python import PythonTool

    for timeout in (float("inf"), float("nan"), 0.0, 1e300):
        with pytest.raises(ValueError, match="timeout_seconds"):
            PythonTool("order", lambda args, *, idempotency_key: None, timeout_seconds=timeout)
    kept = PythonTool("order", lambda args, *, idempotency_key: "placed", timeout_seconds=5)
    assert kept.invoke({}, idempotency_key="k") == "placed"  # a timeout it can keep still runs


def test_a_name_that_is_not_utf8_is_refused_and_settles_nothing(world: Path) -> None:
    """`--by` typed in a terminal of another encoding (bytes that are not UTF-8) is one line
    naming --by, exit 2, for reconcile and approve alike; the unknown outcome stays unknown and
    the approval stays pending."""
    path = str(write(world, manifest()))
    assert cli(world, "run", "-f", path, failpoints="after_gateway_call@2").returncode == 137
    latin1 = "caf\udce9"  # b"caf\xe9" as Python reads it from argv
    done = cli(world, "reconcile", "restock", "2:0", "--executed", "--by", latin1)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "keelgate: error: --by: is not valid UTF-8 text (check the terminal's encoding)"
    ]
    assert last_json(cli(world, "run", "-f", path, "-o", "json").stdout)["stopReason"] == (
        "outcome_unknown"
    )
    approval = world / "approval"
    approval.mkdir()
    (approval / "kgtools.py").write_text(TOOLS)
    gated = approval / "run.yaml"
    gated.write_text(manifest(approval=True).replace("name: restock", "name: gated"))
    assert cli(approval, "run", "-f", str(gated)).returncode == 3
    done = cli(approval, "approve", "gated", "2:0", "--approve", "--by", latin1)
    assert done.returncode == 2 and "--by: is not valid UTF-8" in done.stderr
    status = cli(approval, "status", "gated", "-o", "json")
    assert last_json(status.stdout)["stopReason"] == "awaiting_approval"


def test_reconciling_an_action_that_awaits_approval_or_never_started_says_so(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reconcile` of an action that waits for approval says to use `approve` (it used to print
    an internal key and no run or action); of one whose call never started, that it has no
    unknown outcome. Either is exit 2 with one line, and neither settles anything: the approval
    still decides, and the order is placed once."""
    path = str(write(world, manifest(approval=True)))
    assert main(["run", "-f", path]) == 3
    capsys.readouterr()
    assert main(["reconcile", "restock", "2:0", "--not-executed", "--by", "alice"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "keelgate: error: restock 2:0: is awaiting approval, not an unknown outcome: approve "
        "or deny it instead"
    ]
    assert main(["approve", "restock", "2:0", "--approve", "--by", "alice"]) == 0
    assert main(["resume", "restock"]) == 0
    assert orders(world) == 1

    other = world / "other"
    other.mkdir()
    (other / "kgtools.py").write_text(TOOLS)
    plain = other / "run.yaml"
    plain.write_text(manifest())
    assert cli(other, "run", "-f", str(plain), failpoints="before_action@2").returncode == 137
    done = cli(other, "reconcile", "restock", "2:0", "--executed", "--by", "alice")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "keelgate: error: restock 2:0: has no unknown outcome to settle (no call of it is on "
        "record)"
    ]
    finished = cli(other, "run", "-f", str(plain), "-o", "json")
    assert last_json(finished.stdout)["stopReason"] == "goal_met"


def test_a_sqlite_store_that_refuses_writes_is_a_store_that_cannot_be_used(
    tmp_path: Path,
) -> None:
    """A SQLite file that cannot be written (read-only, a full or failing disk) makes a write a
    StoreUnavailable (the CLI's exit 5, "--store: ... cannot be written"), not an internal
    error; reads still work, and nothing of the refused commit is kept. Tests run as root, whom
    file modes do not stop, so SQLite's own read-only switch (query_only) makes the refusal."""
    from keelgate.errors import StoreUnavailable
    from keelgate.stores.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "k.db")
    try:
        store.save("shop", "r", 1, {"step": "plan"})
        store._db.execute("PRAGMA query_only = 1")
        with pytest.raises(StoreUnavailable, match=r"k\.db cannot be written: attempt to write"):
            store.save("shop", "r", 2, {"step": "act"})
        kept = store.load("shop", "r")
        assert kept is not None and (kept.seq, kept.state) == (1, {"step": "plan"})
    finally:
        store.close()


def _refused_port() -> int:
    """A local port nobody listens on: a connection to it is refused at once."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Each with the password "hunter2" somewhere, and the exit code the CLI must give: 2 for a URL
# that cannot be read, 5 for one that is well formed but names no reachable store.
MALFORMED_STORES = [
    ("postgresql//postgres:hunter2@db.example/keelgate", 2),  # ':' missing
    ("postgresql:/postgres:hunter2@db.example/keelgate", 2),  # one '/' missing
    ("host=127.0.0.1 password=hunter2", 2),  # libpq key=value, not a URL
    ("host=127.0.0.1 password='hunter2 x'", 2),
    ("postgres ql://postgres:hunter2@db.example/keelgate", 2),  # a space
    ("postgresql://postgres:hunter2@[::1/keelgate", 2),  # unclosed bracket
    ("postgresql://postgres:hunter2@db.example:port/keelgate", 2),  # port not a number
    ("postgresql://postgres:hunter2/keelgate", 2),  # '@host' missing: the password reads as port
    ("postgresql://postgres:hunter2@db.example/keelgate?nonsense=1", 2),  # libpq refuses it
    ("postgresql://postgres:hunter2@db.example/keelgate\n", 2),  # a pasted newline
    ("mysql://root:hunter2@db.example/keelgate", 2),  # unknown kind
    ("sqlite://root:hunter2@db.example/keelgate.db", 2),  # a SQLite URL with a host
    ("langgraph+sqlite://root:hunter2@x/k.db", 2),
    ("hunter2", 2),  # the password pasted on its own
    ("postgresql://postgres:hunter2@127.0.0.1:{port}/keelgate", 5),  # nobody listening
    ("postgresql://postgres@127.0.0.1:{port}/keelgate?password=hunter2", 5),
    ("postgresql://postgres:hunt%65r2@127.0.0.1:{port}/keelgate", 5),  # percent-encoded
    ("postgresql://postgres:x@hunter2@127.0.0.1:{port}/keelgate", 2),  # a raw '@' in it
    ("postgresql://postgres:x@h/hunter2@127.0.0.1:{port}/keelgate", 2),  # a raw '@' and '/'
    ("postgresql://127.0.0.1:{port}?password=x@hunter2", 2),  # libpq: user 127.0.0.1:...=x
    ("postgresql://postgres:hunter2@127.0.0.1:99999/keelgate", 2),  # port out of range
    ("postgresql://postgres:hunter2@127.0.0.1:{port},127.0.0.1:0/keelgate", 2),
    ("postgresql://postgres:hunter2@127.0.0.1:{port}/keelgate?sslmode=bogus", 2),
    ("postgresql://postgres:hunter2@127.0.0.1:{port}/keelgate?connect_timeout=abc", 2),
]


@pytest.mark.parametrize(("url", "code"), MALFORMED_STORES, ids=range(len(MALFORMED_STORES)))
def test_no_output_ever_holds_the_password_of_a_store_url_however_malformed(
    world: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    code: int,
) -> None:
    """A mistyped store URL is refused in one line naming --store, with the exit code for bad
    input (2) or an unreachable store (5), and the password appears in no message and no JSON,
    whichever command meets it, whether given as --store or KEELGATE_STORE."""
    url = url.format(port=_refused_port())
    path = str(write(world, manifest()))
    commands = [
        ["run", "-f", path, "-o", "json", "--store", url],
        ["status", "restock", "-o", "json", "--store", url],
        ["runs", "-o", "json", "--store", url],
        ["audit", "restock", "--verify", "--store", url],
        ["resume", "restock", "--store", url],
        ["approve", "restock", "2:0", "--approve", "--by", "bob", "--store", url],
        ["reconcile", "restock", "2:0", "--executed", "--by", "bob", "--store", url],
    ]
    for command in commands:
        assert main(command) == code, command
        out, err = capsys.readouterr()
        assert "hunter2" not in out + err and "hunt%65r2" not in out + err, (command, out, err)
        assert len(err.strip().splitlines()) == 1 and "--store" in err, err
    monkeypatch.setenv("KEELGATE_STORE", url)
    assert main(["status", "restock", "-o", "json"]) == code
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err and last_json(out)["exitCode"] == code
    assert orders(world) == 0


def test_a_store_url_given_where_no_argument_belongs_is_not_echoed(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL pasted without --store is a stray argument: the usage error says so in one line,
    exit 2, with the password masked."""
    assert main(["status", "restock", "postgresql://keel:hunter2@db.example/k"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and len(err.strip().splitlines()) == 1


def test_a_store_that_cannot_be_opened_exits_5_naming_store(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not a database, or a server nobody listens on, is not a failed run: it is
    exit 5 (documented in --help) with one line naming --store, for reading and running
    commands alike, and nothing is left beside the file."""
    junk = world / "notes.txt"
    junk.write_text("not a database, just notes\n" * 100)
    refused = f"postgresql://keel@127.0.0.1:{_refused_port()}/keelgate"
    path = str(write(world, manifest()))
    for store in (f"sqlite:///{junk}", refused):
        for command in (["run", "-f", path], ["status", "restock"], ["runs"]):
            assert main([*command, "--store", store]) == 5, (command, store)
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and err.startswith("keelgate: error: --store:"), err
    assert sorted(p.name for p in world.iterdir()) == ["kgtools.py", "notes.txt", "run.yaml"]
    assert orders(world) == 0
    assert main(["--help"]) == 0
    assert "5 the store cannot be opened or reached" in " ".join(capsys.readouterr().out.split())


def test_a_store_url_that_cannot_be_read_is_bad_input_naming_store(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unclosed IPv6 bracket used to be an "internal error: ValueError" (exit 1): it is bad
    input, exit 2, naming --store and what is wrong."""
    assert main(["status", "restock", "--store", "postgresql://u:pw@[::1/db"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("keelgate: error: --store:") and "internal error" not in err
    assert "HOST[:PORT]" in err


AT_IN_PASSWORD = "keelgate: error: --store: an '@' in the user or password must be percent-encoded"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:S3c@retPW@127.0.0.1:{port}/db",
        "postgresql://bob:S3c@re/tPW@127.0.0.1:{port}/db",  # with a '/' too
        "postgresql://bob:S3c@re#tPW@127.0.0.1:{port}/db",  # '#' is nothing to libpq
        "postgresql://127.0.0.1:{port}?password=S3c@retPW",  # no /DB before the settings
    ],
)
def test_a_raw_at_sign_in_a_store_password_is_bad_input_and_no_part_of_it_is_shown(
    world: Path, url: str
) -> None:
    """libpq ends the userinfo at the first '@', so a password holding a raw '@' was half read
    as a host: exit 5, and the line quoted the rest of the password. In a real process, it is
    exit 2 with one line naming --store and saying to write '@' as %40, and no part of the user
    or password anywhere."""
    done = cli(world, "runs", "--store", url.format(port=_refused_port()))
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith(AT_IN_PASSWORD), err
    assert "%40" in err
    for part in ("S3c", "retPW", "tPW", "bob"):
        assert part not in (done.stdout + err).replace(AT_IN_PASSWORD, ""), (part, err)


def test_a_password_written_with_percent_40_is_read_whole(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same password with its '@' written %40 is well formed: the store is tried (exit 5,
    nobody listens) and the line names user, host and database, never the password. The last
    line of defence masks a raw one whole too."""
    from keelgate.core.redaction import redact_text

    port = _refused_port()
    assert main(["runs", "--store", f"postgresql://bob:S3c%40retPW@127.0.0.1:{port}/db"]) == 5
    out, err = capsys.readouterr()
    assert f"bob@127.0.0.1:{port}/db" in err and len(err.strip().splitlines()) == 1
    assert "S3c" not in out + err and "retPW" not in out + err
    masked = redact_text(f"store postgresql://bob:S3c@retPW@127.0.0.1:{port}/db down")
    assert masked == f"store postgresql://bob:***@127.0.0.1:{port}/db down"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ("127.0.0.1:99999/db", "port must be a number from 1 to 65535"),
        ("127.0.0.1:0/db", "port must be a number from 1 to 65535"),
        ("127.0.0.1:{port},127.0.0.1:65536/db", "port must be a number from 1 to 65535"),
        ("/db?host=127.0.0.1&port=%2B", "port must be a number from 1 to 65535"),
        ("/db?host=127.0.0.1,127.0.0.1&port={port},{port},{port}", "3 ports for 2 hosts"),
        ("127.0.0.1:{port}/db?sslmode=bogus", "sslmode must be one of disable, allow, prefer,"),
        ("127.0.0.1:{port}/db?sslmode=Require", "sslmode must be one of"),
        ("127.0.0.1:{port}/db?connect_timeout=abc", "connect_timeout must be an integer"),
        ("127.0.0.1:{port}/db?connect_timeout=1.5", "connect_timeout must be an integer"),
        ("127.0.0.1:{port}/db?keepalives_idle=", "keepalives_idle must be an integer"),
        ("127.0.0.1:{port}/db?target_session_attrs=main", "target_session_attrs must be one"),
        ("127.0.0.1:{port}/db?gssencmode=on", "gssencmode must be one of"),
        ("127.0.0.1:{port}/db?channel_binding=yes", "channel_binding must be one of"),
        ("127.0.0.1:{port}/db?ssl_min_protocol_version=TLSv2", "ssl_min_protocol_version must"),
    ],
)
def test_a_postgres_setting_libpq_would_refuse_is_bad_input_naming_it(
    world: Path, capsys: pytest.CaptureFixture[str], settings: str, named: str
) -> None:
    """A port out of 1-65535 (also in a list of hosts), ports that do not match the hosts, an
    sslmode (or another setting of fixed values) out of its set, a connect_timeout that is no
    integer: libpq refused them only on connecting, so they read as an unreachable store
    (exit 5). They are bad input (exit 2): one line naming --store and the setting, never the
    password, and no connection is tried (a server listening on the port sees none)."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        url = f"postgresql://bob:hunter2@{settings.format(port=server.getsockname()[1])}"
        assert main(["runs", "--store", url]) == 2
        out, err = capsys.readouterr()
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody came
    assert len(err.strip().splitlines()) == 1 and err.startswith("keelgate: error: --store: ")
    assert named in err, err
    assert "hunter2" not in out + err


def test_the_postgres_urls_the_docs_show_are_well_formed() -> None:
    """The forms docs/stores.md, docs/install.md and README.md show, with every setting of a
    fixed set at each of its values, pass the checks made before connecting."""
    from keelgate.stores import read_store_url

    well_formed = [
        "postgresql://keelgate:0123456789abcdef@postgres.postgres.svc.cluster.local:5432/keelgate",
        "postgres://keelgate:S3c%40ret%2FPW@127.0.0.1:5432/keelgate",
        "postgresql://auditor@127.0.0.1:5432/keelgate",
        "postgresql://keelgate@db/keelgate?password=S3c@retPW",
        "postgresql://keelgate@db?application_name=me@corp",
        "postgresql://keelgate:pw@h1:5432,h2,[::1]:6432/keelgate?target_session_attrs=primary",
        "postgresql:///keelgate?host=/var/run/postgresql&port=5432",
        "postgresql://db/k?connect_timeout=10&keepalives=1&keepalives_idle=-1&sslmode=verify-full",
        "postgresql://db/k?ssl_min_protocol_version=tlsv1.2&ssl_max_protocol_version=TLSv1.3",
    ]
    for mode in ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"):
        well_formed.append(f"postgresql://keelgate@db/keelgate?sslmode={mode}")
    for url in well_formed:
        read_store_url(url)


READING = [
    ["status", "restock"],
    ["audit", "restock", "--verify"],
    ["runs"],
    ["resume", "restock"],
    ["approve", "restock", "2:0", "--approve", "--by", "bob"],
    ["reconcile", "restock", "2:0", "--executed", "--by", "bob"],
]


@pytest.mark.parametrize("kind", ["sqlite", "langgraph+sqlite"])
def test_commands_on_a_store_that_does_not_exist_create_nothing(
    world: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Only `run` makes a store. Every other command, given a path where no store is (a typo),
    says so in one line naming --store, exit 2, and leaves the folder as it was: no database,
    no owners folder, no lock file, for every kind of SQLite store."""
    before = sorted(p.name for p in world.iterdir())
    for command in READING:
        assert main([*command, "--store", f"{kind}:///{world}/typo.db"]) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--store: no store at" in err, err
    assert sorted(p.name for p in world.iterdir()) == before


def test_commands_on_a_sqlite_file_that_is_no_store_leave_it_as_it_was(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SQLite database of something else is not a store: reading it adds no tables."""
    other = world / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    db.close()
    before = other.read_bytes()
    for command in READING:
        assert main([*command, "--store", f"sqlite:///{other}"]) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "no Keelgate store" in err, err
    assert other.read_bytes() == before
    assert sorted(p.name for p in world.iterdir()) == ["kgtools.py", "other.db"]


@pytest.mark.postgres
def test_commands_on_an_empty_postgres_database_create_nothing(
    world: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    """On a PostgreSQL database that holds no store, every command but `run` says so (exit 2,
    one line naming --store) and creates no table, sequence or anything else in it."""
    import psycopg

    for command in READING:
        assert main([*command, "--store", pg_url]) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--store: no Keelgate store in" in err, err
    with psycopg.connect(pg_url) as conn:
        made = conn.execute(
            "SELECT relname FROM pg_class JOIN pg_namespace n ON n.oid = relnamespace "
            "WHERE nspname = 'public'"
        ).fetchall()
    assert made == []


# The programs a cluster runs, not a person: a step pod always ends with its JSON line, and the
# operator and a Temporal worker are daemons that log.
IN_CLUSTER = {"step", "operator", "temporal-worker"}


def test_every_command_takes_output_json() -> None:
    """A script can ask any command for JSON: every command has the same --output/-o."""
    import typer

    from keelgate.cli import audit_tools, commands  # noqa: F401 - audit_tools registers audit

    group = typer.main.get_command(commands.app)
    # `completion` prints a shell's script, nothing a script reads.
    names = sorted(set(group.commands) - IN_CLUSTER - {"completion"})  # type: ignore[attr-defined]
    assert {"run", "resume", "reconcile", "approve", "audit", "runs", "status"} <= set(names)
    for name in names:
        command = group.commands[name]  # type: ignore[attr-defined]
        # A group (``keelgate temporal``): each of its commands.
        for sub, leaf in (getattr(command, "commands", None) or {name: command}).items():
            options = {o for p in leaf.params for o in p.opts}
            assert {"--output", "-o"} <= options, f"{name} {sub}"


def test_approve_and_reconcile_answer_in_json(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`approve` and `reconcile` under --output json end stdout with one object saying what was
    decided, on which action and tool, and by whom."""
    assert main(["run", "-f", str(write(world, manifest(approval=True)))]) == 3
    capsys.readouterr()
    assert main(["approve", "restock", "2:0", "--deny", "--by", "bob", "-o", "json"]) == 0
    assert last_json(capsys.readouterr().out) == {
        "run": "restock",
        "action": "2:0",
        "tool": "order",
        "verdict": "denied",
        "by": "bob",
    }
    store = f"sqlite:///{world / 'crashed.db'}"
    path = str(write(world, manifest()))
    crashed = cli(world, "run", "-f", path, "--store", store, failpoints="after_gateway_call@2")
    assert crashed.returncode == 137
    settle = ("reconcile", "restock", "2:0", "--not-executed", "--by", "al", "-o", "json")
    early = cli(world, *settle, "--store", store)  # before the call's write deadline
    assert early.returncode == 4, early.stderr
    refused = last_json(early.stdout)
    assert refused["exitCode"] == 4 and "cannot be settled as not executed yet" in refused["error"]
    stores = open_stores(store)
    try:
        pass_deadlines(stores)  # al waits until the deadline has passed
    finally:
        stores.close()
    done = cli(world, *settle, "--store", store)
    assert done.returncode == 0, done.stderr
    assert last_json(done.stdout) == {
        "run": "restock",
        "action": "2:0",
        "tool": "order",
        "verdict": "abandoned",
        "by": "al",
    }


def test_the_audit_trail_says_why_a_call_was_refused_or_denied_and_on_what_date(
    world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keelgate audit` shows why a call did not run: a refused one with its reason
    (side_effect_not_permitted), a denied one as a `denied` decision naming who denied it,
    never as `approved`; and each event's time carries its date."""

    monkeypatch.setenv("COLUMNS", "240")  # a wide terminal: no word folded across lines

    read_only = manifest().replace("  budget:", "  allowedSideEffects: [READ]\n  budget:")
    assert main(["run", "-f", str(write(world, read_only)), "--store", "sqlite:///r.db"]) == 0
    capsys.readouterr()
    assert main(["audit", "restock", "--store", "sqlite:///r.db"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "status=refused reason=side_effect_not_permitted" in table
    assert re.search(r"\b20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\b", table), table

    assert main(["run", "-f", str(write(world, manifest(approval=True)))]) == 3
    assert main(["approve", "restock", "2:0", "--deny", "--by", "bob"]) == 0
    assert main(["resume", "restock"]) == 0
    capsys.readouterr()
    assert main(["audit", "restock", "-o", "json"]) == 0
    events = last_json(capsys.readouterr().out)["events"]
    assert isinstance(events, list)
    decided = [(e["type"], e["actor"]) for e in events if e["data"].get("action") == "2:0"]
    assert ("loop.denied", "bob") in decided and "loop.approved" not in dict(decided)
    (completed,) = [e for e in events if e["type"] == "loop.action_completed"][-1:]
    assert completed["data"]["status"] == "denied"
    assert completed["data"]["reason"] == "denied by bob"
    assert main(["audit", "restock"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert " denied bob action=2:0 tool=order" in table
    assert orders(world) == 0


def test_a_second_run_of_a_busy_run_exits_4_before_running_anything(world: Path) -> None:
    """Two `keelgate run` of one run at once, its READ slow: the second sees the run is busy
    before it runs anything (the READ is not run twice), exits 4 at once with one line, and the
    first finishes with one order."""
    import time

    gated = TOOLS.replace(
        'return {"sku": args["sku"], "inStock": 3}',
        'with open(os.environ["READS"], "a") as reads:\n'
        '        reads.write("read\\n")\n'
        "    import time\n"
        '    while not Path(os.environ["GO"]).exists():\n'
        "        time.sleep(0.02)\n"
        '    return {"sku": args["sku"], "inStock": 3}',
    )
    (world / "kgtools.py").write_text(gated)
    reads, go = world / "reads.txt", world / "go"
    env = {
        **os.environ,
        "PYTHONPATH": str(world),
        "READS": str(reads),
        "GO": str(go),
    }
    env.pop("KEELGATE_FAILPOINTS", None)
    path = str(write(world, manifest()))
    first = subprocess.Popen(
        [sys.executable, "-m", "keelgate", "run", "-f", path],
        cwd=world,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not reads.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reads.exists(), "the first run never reached its READ"
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "keelgate", "run", "-f", path],
            cwd=world,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
        assert second.returncode == 4, second.stderr
        err = second.stderr.strip()
        assert len(err.splitlines()) == 1 and "busy" in err, err
        assert took < 15, took
        assert reads.read_text().splitlines() == ["read"]  # the READ ran once, not twice
    finally:
        go.touch()
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert orders(world) == 1


def test_resuming_a_finished_run_says_there_is_nothing_to_resume(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`resume` of a run that already met its goal (even with a new budget) runs nothing, keeps
    its exit code and JSON, and says in one line that a finished run has nothing to resume."""
    assert main(["run", "-f", str(write(world, manifest()))]) == 0
    capsys.readouterr()
    assert main(["resume", "restock", "--tokens", "100000", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert last_json(out)["stopReason"] == "goal_met"
    assert len(err.strip().splitlines()) == 1
    assert "a finished run has nothing to resume" in err
    assert orders(world) == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            'models:\n  demo: {inputPerMillionTokens: "x", outputPerMillionTokens: "1"}\n',
            "models.demo",
        ),
        ("models: [\n", "line 2"),
        ("", "the file is empty"),
        ("- demo\n", "must be a mapping"),
        (None, "no such file"),
        ("DIR", "is a directory"),
    ],
    ids=["bad-price", "bad-yaml", "empty", "a-list", "missing", "a-directory"],
)
def test_a_pricing_file_problem_names_the_option_and_the_file_once(
    world: Path, capsys: pytest.CaptureFixture[str], text: str | None, problem: str
) -> None:
    """Whatever is wrong with a --pricing file (its prices, its YAML, missing, a folder), the
    one line names --pricing, then the file exactly once, then what is wrong; nothing runs."""
    prices = world / "prices.yaml"
    if text == "DIR":
        prices.mkdir()
    elif text is not None:
        prices.write_text(text)
    assert main(["run", "-f", str(write(world, manifest())), "--pricing", str(prices)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"keelgate: error: --pricing: {prices}: "), err
    assert err.count("prices.yaml") == 1 and problem in err, err
    assert orders(world) == 0


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--lease-retry=0"], "--lease-retry"),
        (["--lease-renew=2"], "--lease-renew"),
        (["--lease-duration=10"], "--lease-duration"),
        (["--lease-namespace="], "--lease-namespace"),
    ],
)
def test_bad_leader_election_settings_are_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    field: str,
) -> None:
    """`keelgate operator --leader-elect` with timings the election cannot keep (a retry under
    a second, a renew deadline within 1.2 retries, a lease no longer than the renew deadline) or
    no namespace for the Lease outside a pod: exit 2, one line naming the flag, before anything
    connects."""
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    namespace = [] if field == "--lease-namespace" else ["--lease-namespace=kg"]
    code = main(
        ["operator", "--store", "postgresql://kg@127.0.0.1:1/kg", "--leader-elect", *namespace]
        + [f for f in flags if f != "--lease-namespace="]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert field in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "field", "words"),
    [
        (["--run-lease=10", "--run-lease-renew=10"], "--run-lease", "longer than"),
        (["--run-lease=-1"], "--run-lease", "greater than or equal to 0"),
        (["--run-lease-renew=0"], "--run-lease-renew", "greater than or equal to 0.1"),
        (["--cluster=East_1"], "--cluster", "a DNS label"),
        (["--cluster=east@west"], "--cluster", "a DNS label"),
    ],
)
def test_bad_run_lease_settings_are_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], field: str, words: str
) -> None:
    """`keelgate operator` with a run lease no longer than its renewal period (or a negative
    lease, a renewal period of 0), or a cluster name that is not a DNS label (it is part of the
    holder's name the other clusters read): exit 2, one line naming the flag, before anything
    connects."""
    code = main(["operator", "--store", "postgresql://kg@127.0.0.1:1/kg", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert f"{field}" in err and words in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["operator"], "the operator and its step pods need PostgreSQL"),
        (["tenant", "list"], "tenant roles exist in PostgreSQL only"),
        (["tenant", "add", "shop", "--print"], "tenant roles exist in PostgreSQL only"),
    ],
)
@pytest.mark.parametrize("store", ["sqlite:///kg.db", "langgraph+sqlite:///kg.db", "memory://"])
def test_commands_that_need_postgresql_refuse_another_store_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    words: str,
    store: str,
) -> None:
    """`keelgate operator` and `keelgate tenant` given a store that is not PostgreSQL: exit 2,
    one line naming --store and why, and no file made where the URL points."""
    monkeypatch.chdir(tmp_path)
    code = main([*command, "--store", store])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "--store" in err and words in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("keepFinishedPods: 0\n", "keepFinishedPods: must be greater than 0"),
        ("resources: {limits: {cpu: lots}}\n", "resources.limits.cpu: must be a Kubernetes"),
        ("priorityClass: low\n", "priorityClass: unknown field (did you mean priorityClassName?)"),
        ("imagePullSecrets: [Not_A_Name]\n", "imagePullSecrets[0]"),
        ("- a list\n", "must be a mapping"),
    ],
)
def test_bad_step_pod_defaults_are_one_line_naming_the_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, problem: str
) -> None:
    """`keelgate operator --step-pod-defaults FILE` (the chart's stepPods) with a bad field:
    exit 2, one line naming the flag, the file and the field, before anything connects."""
    settings = tmp_path / "step-pods.yaml"
    settings.write_text(text)
    code = main(
        [
            "operator",
            "--store",
            "postgresql://kg@127.0.0.1:1/kg",
            "--step-pod-defaults",
            str(settings),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"keelgate: error: --step-pod-defaults: {settings}: "), err
    assert problem in err, err


def test_a_person_decides_on_a_run_an_operator_holds_while_its_drivers_stay_fenced(
    world: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While an operator holds the run (run ownership: taken under an epoch, its lease live),
    ``keelgate approve`` and ``keelgate reconcile`` against the store are a person's decisions,
    not a driver's writes: the approval is recorded (exit 0), as the runbook's ``--store`` path
    promises, where it was refused as a write without the epoch (exit 6). A driver without the
    holder's epoch (``keelgate resume``) is still refused and orders nothing, and the holder
    keeps the run under its epoch."""
    from keelgate.stores import DEFAULT_URL

    assert main(["run", "-f", str(write(world, manifest(approval=True))), "-o", "json"]) == 3
    capsys.readouterr()
    operator = open_stores(DEFAULT_URL)
    owners: Any = operator.checkpoints
    (tenant,) = {ref.tenant for ref in operator.checkpoints.runs() if ref.run == "restock"}
    taken = owners.take(tenant, "restock", holder="operator-a", lease=300.0)
    assert main(["approve", "restock", "2:0", "--approve", "--by", "bob"]) == 0
    said = capsys.readouterr()
    assert "approved by bob" in said.out, said
    assert main(["reconcile", "restock", "2:0", "--executed", "--by", "bob"]) == 2
    capsys.readouterr()  # nothing to settle: the action awaits no outcome (the input is bad)
    assert main(["resume", "restock", "-o", "json"]) == 6  # a driver without the epoch
    capsys.readouterr()
    assert orders(world) == 0
    assert main(["status", "restock", "-o", "json"]) == 3
    shown = last_json(capsys.readouterr().out)
    assert shown["pendingApprovals"] == [], shown  # bob's approval was recorded
    assert owners.holder_of(tenant, "restock").epoch == taken.epoch  # the holder is unmoved
    operator.close()
