"""The shipped examples work as their comments say: every manifest validates, and the local-model
example runs against a real OpenAI-format server on loopback standing in for Ollama."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.llm import LlmFake, openai_reply
from keelgate.cli import main
from keelgate.manifest import load_agentrun

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
    assert stopped["pendingApprovals"] == [{"action": "2:0", "tool": "place_order"}]
    assert not (tmp_path / "shop" / "orders.jsonl").exists()
    assert main(["approve", "restock-approved", "2:0", "--approve", "--by", "you"]) == 0
    assert main(["resume", "restock-approved"]) == 0
    assert len((tmp_path / "shop" / "orders.jsonl").read_text().splitlines()) == 1
