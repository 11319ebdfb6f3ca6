"""The shipped examples and the README work as they say: every manifest validates, every command
the README and the examples' headers show runs as written in a fresh folder with the exit code
the docs claim, the README's Python program runs as written, and the local-model example runs
against a real OpenAI-format server on loopback standing in for Ollama."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.llm import LlmFake, openai_reply
from keelgate.cli import main
from keelgate.manifest import load_agentrun
from support.restock import asked

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "examples").glob("*/agentrun.yaml"))


def test_there_are_examples() -> None:
    """The examples folder is not silently empty (the next test would pass vacuously)."""
    assert len(MANIFESTS) >= 2


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.parent.name)
def test_every_example_manifest_validates(path: Path) -> None:
    """A user copying an example starts from a manifest Keelgate accepts."""
    run = load_agentrun(path)
    assert run.metadata.name and run.to_loop_spec().goal


@pytest.fixture
def ollama() -> Iterator[LlmFake]:
    server = LlmFake("openai").start()
    yield server  # type: ignore[misc]
    server.stop()


def test_the_local_model_example_runs_against_an_openai_compatible_server(
    ollama: LlmFake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With baseURL pointed at the server and no API key set, the example reads the stock,
    orders once with its idempotency key, and meets its goal."""
    text = (ROOT / "examples/ollama/agentrun.yaml").read_text()
    manifest = tmp_path / "agentrun.yaml"
    manifest.write_text(text.replace("http://localhost:11434/v1", ollama.base_url))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("SHOP_DIR", str(tmp_path / "shop"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples/restock"))
    sys.modules.pop("shop", None)
    accept = ("keelgate_verdict", {"verdict": "accept", "reason": "ok"})
    ollama.add(
        openai_reply(calls=[("get_inventory", {"sku": "A1"})]),
        openai_reply(calls=[accept]),
        openai_reply(calls=[("place_order", {"sku": "A1", "qty": 20})]),
        openai_reply(calls=[accept]),
        openai_reply(text="A1 had 3; ordered 20."),
        openai_reply(calls=[accept]),
    )
    assert main(["run", "-f", str(manifest), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["stopReason"] == "goal_met" and result["answer"] == "A1 had 3; ordered 20."
    book = (tmp_path / "shop" / "orders.jsonl").read_text().splitlines()
    assert len(book) == 1 and json.loads(book[0])["idempotencyKey"].startswith("kg-")
    sent = [call.json() for call in ollama.calls()]
    assert len(sent) == 6
    assert {body["model"] for body in sent} == {"llama3.1"}
    assert {body["max_tokens"] for body in sent} == {512}  # what local servers read


def test_the_approval_example_waits_for_a_person_then_orders_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands in the approval example's header work as written: the run stops before
    the order, the approval is recorded, and the resume places exactly one order."""
    monkeypatch.setenv("SHOP_DIR", str(tmp_path / "shop"))
    monkeypatch.setenv("KEELGATE_STORE", f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.syspath_prepend(str(ROOT / "examples/restock"))
    sys.modules.pop("shop", None)
    manifest = str(ROOT / "examples/approval/agentrun.yaml")
    assert main(["run", "-f", manifest, "-o", "json"]) == 3
    stopped = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert asked(stopped["pendingApprovals"]) == [{"action": "2:0", "tool": "place_order"}]
    assert not (tmp_path / "shop" / "orders.jsonl").exists()
    assert main(["approve", "restock-approved", "2:0", "--approve", "--by", "you"]) == 0
    assert main(["resume", "restock-approved"]) == 0
    assert len((tmp_path / "shop" / "orders.jsonl").read_text().splitlines()) == 1


# How the docs show commands: the lines of README.md's ```sh blocks, and the indented comment
# lines ("#   ...") heading an example's manifest. A trailing "# exit N" states the exit code.
DOCS = [ROOT / "README.md", *MANIFESTS]

# Commands the docs show that are not run here as written, and why. Any other command must
# state its exit code and is run: a new one cannot slip in untested.
NOT_RUN = {
    "make test": "it is this very suite (and the e2e tests)",
    "make demo": "it starts the local cluster: e2e/tests/test_e2e_make.py runs it",
    "make demo-local": (
        "make would build a new .venv in the fresh folder: its recipe is run instead"
    ),
    "ollama pull llama3.1 && ollama serve": "needs Ollama itself and a model download",
    "PYTHONPATH=examples/restock keelgate run -f examples/ollama/agentrun.yaml": (
        "needs an Ollama server: the manifest is run against a stand-in above"
    ),
    "kubectl apply -f examples/kind/agentrun.yaml": (
        "needs a cluster: tests/test_install_docs.py runs the manifest on the local runner"
    ),
    "kubectl -n shop wait --for=condition=Succeeded agentrun/restock --timeout=180s": (
        "needs a cluster: tests/test_install_docs.py checks the condition is the operator's"
    ),
}


def doc_commands(path: Path) -> list[tuple[str, int | None]]:
    """(command, exit code it claims or None) for every command ``path`` shows."""
    lines = path.read_text().splitlines()
    if path.suffix == ".md":
        shown, inside = [], False
        for line in lines:
            if line.startswith("```"):
                inside = line.strip() == "```sh"
                continue
            if inside and line.strip():
                shown.append(line)
    else:
        header = [line for line in lines[: next(i for i, x in enumerate(lines) if x[:1] != "#")]]
        shown = [line[4:] for line in header if line.startswith("#   ")]
    commands = []
    for line in shown:
        command, _, comment = line.partition("  #")
        claimed = re.match(r"\s*exit (\d+)\b", comment)
        commands.append((command.strip(), int(claimed.group(1)) if claimed else None))
    return commands


def fresh_folder(tmp_path: Path) -> Path:
    """A folder holding what a fresh clone holds for the examples, after `make venv` (its
    `.venv` is this test's interpreter's), and nothing run yet."""
    folder = tmp_path / "clone"
    shutil.copytree(ROOT / "examples", folder / "examples")
    (folder / ".venv").symlink_to(sys.prefix)
    return folder


def user_env() -> dict[str, str]:
    """A user's shell: no Keelgate or Python settings of ours, and `keelgate` not on PATH until
    the venv is activated (the README's first line does it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEELGATE_", "PYTHON"))}
    env.pop("SHOP_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    venv = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv)
    return env


def test_every_documented_command_states_its_exit_code_or_why_it_is_not_run() -> None:
    """No command in the README or an example's header goes untested by accident, and the
    list of those not run names only commands the docs still show."""
    shown = {command: claimed for path in DOCS for command, claimed in doc_commands(path)}
    assert len(shown) >= 10
    unexplained = [c for c, claimed in shown.items() if claimed is None and c not in NOT_RUN]
    assert unexplained == []
    assert set(NOT_RUN) <= set(shown)


def use_it_block() -> str:
    """The README's "Use it" session: the first ```sh block under that heading."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Use it\n") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


def paste(block: str, folder: Path, codes: Path) -> subprocess.CompletedProcess[str]:
    """``block`` pasted into an interactive bash in ``folder``, as a user's terminal would take
    it, line by line; after each line the shell writes that line's exit code to ``codes``
    (PROMPT_COMMAND runs before each prompt: once before the first line, then after each)."""
    env = {**user_env(), "PROMPT_COMMAND": f'printf "%s\\n" "$?" >> "{codes}"', "PS1": ""}
    return subprocess.run(
        ["bash", "--norc", "--noprofile", "-i"],
        input=block,
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_readme_session_pastes_and_runs_as_written(tmp_path: Path) -> None:
    """The README's "Use it" block, pasted whole into bash in a fresh folder after `make venv`:
    every line states its exit code and gives exactly it (a crash on purpose included), with
    nothing to set up by hand (the block activates the venv and makes its signing keys). Then
    docs/audit.md's export session, pasted into the same shell as it says: each command exits 0
    and prints what its comment says."""
    block = use_it_block()
    lines = [line for line in block.splitlines() if line.strip()]
    claimed = []
    for line in lines:
        found = re.search(r"  #\s*exit (\d+)\b", line)
        assert found is not None, f"states no exit code: {line}"
        claimed.append(int(found.group(1)))
    audit_md = (ROOT / "docs/audit.md").read_text()
    section = audit_md[audit_md.index("## `keelgate audit export` and `keelgate audit verify`") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None
    audit = [x for x in found.group(1).splitlines() if x.strip() and not x.startswith("#")]
    said = [x[2:] for x in found.group(1).splitlines() if x.startswith("# ") and ": " in x]
    folder = fresh_folder(tmp_path)
    codes = tmp_path / "codes"
    done = paste(block + "\n".join(audit) + "\n", folder, codes)
    got = [int(code) for code in codes.read_text().split()][1:]  # the first: before line one
    assert list(zip(lines + audit, got, strict=True)) == list(
        zip(lines + audit, claimed + [0] * len(audit), strict=True)
    ), done.stdout + done.stderr
    assert (folder / "restock.dsse.json").exists()
    for line in said[1:]:  # the first comment says who signs
        assert line in done.stdout.splitlines(), (line, done.stdout)


HEADERS = [
    path for path in MANIFESTS if any(claimed is not None for _, claimed in doc_commands(path))
]


@pytest.mark.parametrize("doc", HEADERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_headers_run_as_written_with_the_exit_codes_claimed(
    doc: Path, tmp_path: Path
) -> None:
    """Each example's commands, pasted in order into bash in a fresh folder with the venv
    activated (as the README's session does first), give exactly the exit codes claimed."""
    steps = [(c, claimed) for c, claimed in doc_commands(doc) if claimed is not None]
    folder = fresh_folder(tmp_path)
    codes = tmp_path / "codes"
    block = "source .venv/bin/activate\n" + "".join(f"{command}\n" for command, _ in steps)
    done = paste(block, folder, codes)
    got = [int(code) for code in codes.read_text().split()][2:]
    assert list(zip([c for c, _ in steps], got, strict=True)) == [
        (command, claimed) for command, claimed in steps
    ], done.stdout + done.stderr


def test_make_demo_local_runs_in_a_fresh_folder(tmp_path: Path) -> None:
    """What `make demo-local` runs (its recipe, with this interpreter for the venv's) ends with
    exit 0 in a fresh folder: one crash, one order."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo-local:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe is not None
    folder = fresh_folder(tmp_path)
    done = subprocess.run(
        ["bash", "-c", recipe.group(1).replace("$(PY)", sys.executable)],
        cwd=folder,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    book = folder / ".keelgate" / "demo" / "shop" / "orders.jsonl"
    assert len(book.read_text().splitlines()) == 1


def test_the_readme_python_program_runs_as_written_and_again_orders_nothing(
    tmp_path: Path,
) -> None:
    """The README's Python block is a whole program: it meets its goal with one order, and run
    a second time it resumes the finished run and orders nothing more."""
    (block,) = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    program = tmp_path / "restock.py"
    program.write_text(block)
    runs = [
        subprocess.run(
            [sys.executable, str(program)],
            cwd=tmp_path,
            env=user_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        for _ in range(2)
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "Succeeded goal_met ordered 20 of A1"
    ordered = [line for done in runs for line in done.stdout.splitlines() if "under key" in line]
    assert len(ordered) == 1 and ordered[0].startswith("ordered 20 of A1 under key kg-")
