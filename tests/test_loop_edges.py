"""Edges of the loop a user meets when something around it misbehaves: an edited spec, a goal
predicate or a model that raises or answers nonsense, and who-decided values that would garble
the audit trail. None may crash the run with a traceback or slip past the record."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, StopReason
from keelgate.errors import InputError, SettleError
from keelgate.stores.sqlite import SQLiteStore

SPEC = LoopSpec("shop", "edges", "restock", budget=Budget(max_iterations=5))


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    store = SQLiteStore(tmp_path / "k.db")
    yield Stores.of(store)
    store.close()


def _loop(stores: Stores, answers: Sequence[Mapping[str, Any]], **kwargs: Any) -> Loop:
    replies = list(answers)

    def model(request: dict[str, Any]) -> Mapping[str, Any]:
        if request["phase"] == "verify":
            return {"verdict": "accept"}
        return replies[request["call"]]

    def look(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        return {"inStock": 3}

    def order(args: dict[str, Any], *, idempotency_key: str | None) -> dict[str, Any]:
        return {"ordered": True}

    return Loop(
        stores=stores,
        model=PythonModel(model),
        tools=[
            PythonTool("look", look),
            PythonTool("order", order, SideEffect.WRITE, requires_approval=True),
        ],
        **kwargs,
    )


def test_an_edited_spec_is_recorded_on_the_chain_by_field_without_its_values(
    stores: Stores,
) -> None:
    """Resuming with a different budget and goal goes on: the chain says which fields changed,
    and the new values (here a goal with a secret in it) do not appear in the event."""
    loop = _loop(stores, [{"actions": [{"tool": "look", "args": {}}]}, {"done": True}])
    first = LoopSpec("shop", "edges", "restock", budget=Budget(max_iterations=1))
    assert loop.run_or_resume(first).stop.reason is StopReason.MAX_ITERATIONS
    edited = LoopSpec("shop", "edges", "restock SECRET-42", budget=Budget(max_iterations=5))
    assert loop.run_or_resume(edited).stop.reason is StopReason.GOAL_MET
    (changed,) = [e for e in loop.audit("shop", "edges") if e.type == "loop.spec_changed"]
    assert changed.data["fields"] == ["budget.maxIterations", "goal"]
    assert "SECRET-42" not in json.dumps(changed.to_json())


def test_a_goal_predicate_that_raises_fails_the_run_with_its_message(stores: Stores) -> None:
    """A broken goal predicate is the run's failure, told in one line, not a traceback."""

    def predicate(history: Sequence[Mapping[str, Any]]) -> bool:
        raise KeyError("inStock")

    loop = _loop(stores, [{"actions": [{"tool": "look", "args": {}}]}], goal_predicate=predicate)
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.FAILED and not outcome.resumable
    assert "goal predicate" in outcome.stop.message and "inStock" in outcome.stop.message


def test_arguments_that_are_not_json_fail_the_run_and_nothing_runs(stores: Stores) -> None:
    """A model asking for a call with NaN in its arguments: no key can be derived, so the run
    fails with a clear message and the tool is never called."""
    loop = _loop(stores, [{"actions": [{"tool": "look", "args": {"ratio": math.nan}}]}])
    outcome = loop.run_or_resume(SPEC)
    assert outcome.stop.reason is StopReason.FAILED
    assert "not valid JSON" in outcome.stop.message
    assert [e.type for e in loop.audit("shop", "edges")][-1] == "loop.stopped"


def test_a_second_decision_on_an_approval_names_the_first(stores: Stores) -> None:
    """Once approved, the action cannot be denied (or approved again); the error says who
    decided, and the stop tells the person to resume."""
    loop = _loop(stores, [{"actions": [{"tool": "order", "args": {"qty": 1}}]}, {"done": True}])
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    after = loop.approve("shop", "edges", "1:0", approved=True, by="bob")
    assert after.pending_approvals == () and "resume to continue" in after.stop.message
    with pytest.raises(SettleError, match="already approved by bob"):
        loop.approve("shop", "edges", "1:0", approved=False, by="mallory")
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.GOAL_MET


@pytest.mark.parametrize("by", ["", "   ", "alice\nkeelgate", "bob\x1b[31m", "x" * 300])
def test_who_decided_must_be_one_printable_line(stores: Stores, by: str) -> None:
    """A name with a newline or a control character would forge lines in the audit trail."""
    loop = _loop(stores, [{"actions": [{"tool": "order", "args": {"qty": 1}}]}])
    assert loop.run_or_resume(SPEC).stop.reason is StopReason.AWAITING_APPROVAL
    with pytest.raises(InputError, match="by"):
        loop.approve("shop", "edges", "1:0", approved=True, by=by)
    assert loop.outcome("shop", "edges").pending_approvals != ()
