"""Model scripts for the crash tests, and what a crash at a given window must lead to.

The scripts are shaped so that every crash window occurs at least three times in one run (several
iterations, a plan with two WRITEs, a PROPOSE), so "crash at the 3rd occurrence" always means
something. Expectations are derived from the script, never hard-coded per case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keelgate.core.failpoints import NAMES
from keelgate.core.spec import Budget, LoopSpec
from keelgate.core.types import SideEffect, idempotency_key

Script = list[dict[str, Any]]

#: The failpoints a crash-free run of a script passes. ``after_settle`` is not among them: it is
#: passed only when an unknown outcome is settled, and has crash tests of its own.
RUN_WINDOWS = tuple(name for name in NAMES if name != "after_settle")

#: The windows outside the tool's own call (``mid_tool``, whose crash cases also say whether the
#: effect landed before the death).
OUTSIDE_TOOL = tuple(name for name in RUN_WINDOWS if name != "mid_tool")


def fresh_spec() -> LoopSpec:
    """The restock run under a fresh name per case, so cases can share one PostgreSQL
    database."""
    import uuid

    return LoopSpec(
        "shop", f"restock-{uuid.uuid4().hex[:8]}", "restock", budget=Budget(max_iterations=10)
    )


def crash_cases(occurrences: Sequence[int] = (1, 2, 3)) -> list[Any]:
    """The crash matrix's cases, ``(window, occurrence, effect)``: every window at each of
    ``occurrences``, and ``mid_tool`` with the effect landing before or after the death."""
    import pytest  # only the tests that build cases need it

    return [
        *[pytest.param(w, n, "before", id=f"{w}@{n}") for w in OUTSIDE_TOOL for n in occurrences],
        *[
            pytest.param("mid_tool", n, effect, id=f"mid_tool@{n}-effect-{effect}")
            for n in occurrences
            for effect in ("before", "after")
        ],
    ]


#: A value that rides in tool arguments and must never appear in the audit chain.
MARK = "deliver-rear-door-7f3a"

SIDE_EFFECT_OF = {
    "get_inventory": SideEffect.READ,
    "place_order": SideEffect.WRITE,
    "notify": SideEffect.PROPOSE,
}

_USAGE = {"inputTokens": 100, "outputTokens": 20}

RESTOCK: Script = [
    {"actions": [{"tool": "get_inventory", "args": {"sku": "A1"}}], "usage": _USAGE},
    {
        "actions": [
            {"tool": "place_order", "args": {"sku": "A1", "qty": 20, "note": MARK}},
            {"tool": "place_order", "args": {"sku": "B2", "qty": 5, "note": MARK}},
        ],
        "usage": _USAGE,
    },
    {
        "actions": [
            {"tool": "get_inventory", "args": {"sku": "C3"}},
            {"tool": "notify", "args": {"to": "buyer", "text": MARK}},
            {"tool": "place_order", "args": {"sku": "C3", "qty": 7, "note": MARK}},
        ],
        "usage": _USAGE,
    },
    {"done": True, "answer": "restocked A1, B2 and C3", "usage": _USAGE},
]


@dataclass(frozen=True)
class Call:
    """One planned tool call as the loop will name it."""

    action: str
    tool: str
    args: Mapping[str, Any]
    side_effect: SideEffect
    key: str

    @property
    def changes_world(self) -> bool:
        return self.side_effect is not SideEffect.READ


def tool_calls(script: Sequence[Mapping[str, Any]], tenant: str, run: str) -> list[Call]:
    """Every tool call of a script, in the order a crash-free run makes them."""
    calls: list[Call] = []
    for iteration, entry in enumerate(script, start=1):
        for index, action in enumerate(entry.get("actions") or []):
            tool, args = action["tool"], dict(action.get("args") or {})
            calls.append(
                Call(
                    f"{iteration}:{index}",
                    tool,
                    args,
                    SIDE_EFFECT_OF[tool],
                    idempotency_key(tenant, run, tool, args),
                )
            )
    return calls


def occurrences(script: Sequence[Mapping[str, Any]]) -> Counter[str]:
    """How often each crash window is passed in a crash-free run of a script whose last entry is
    ``done`` and whose verifier accepts everything."""
    actions = sum(len(entry.get("actions") or []) for entry in script)
    acting = sum(1 for entry in script if entry.get("actions"))
    return Counter(
        {
            "after_plan": len(script),
            "before_action": actions,
            "after_gateway_call": actions,
            "after_action_checkpoint": actions,
            "mid_tool": actions,
            "after_observe": acting,
            "after_verify": len(script),
        }
    )


def expected_crash(
    calls: Sequence[Call], window: str, occurrence: int, effect: str
) -> tuple[Call | None, bool]:
    """What a single crash at ``window@occurrence`` leaves behind: the WRITE or PROPOSE whose
    outcome becomes unknown (None if none does), and whether its side effect happened."""
    if window not in ("after_gateway_call", "mid_tool") or occurrence > len(calls):
        return None, False
    call = calls[occurrence - 1]
    if not call.changes_world:
        return None, False
    # Past the gateway call the tool has returned: its effect happened. Mid-tool it depends on
    # where the tool body puts it.
    return call, window == "after_gateway_call" or effect == "before"
