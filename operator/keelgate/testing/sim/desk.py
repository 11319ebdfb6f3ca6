"""The run as its owner keeps it: the manifest (the AgentRun's ``spec``) and its edits.

Why it exists: people edit a run while it runs (add or drop an approval rule, make a tool READ,
allow only READs, raise or lower a budget), and the oracle must know what was asked of each call
then. ``Desk`` holds the current manifest and every version of it, numbered as
``metadata.generation`` numbers them; the local driver records it in the store before each step
(as the operator does), the operator mode writes it into the AgentRun.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from keelgate.testing.sim.downstream import CALL_SECONDS, TOOLS
from keelgate.testing.sim.model import Scenario
from keelgate.testing.sim.world import World

EDITS = (
    "approval place_order",
    "approval notify",
    "approval pay",
    "place_order READ",
    "drop notify",
    "READ only",
    "raise budget",
    "lower budget",
)


@dataclass
class Desk:
    scenario: Scenario
    world: World
    versions: list[dict[str, Any]] = field(default_factory=list)
    #: Each version's approval rules (by generation), tool -> people needed: for the oracle.
    approval_rules: list[dict[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        scenario = self.scenario
        budget: dict[str, Any] = {}
        if scenario.max_iterations is not None:
            budget["maxIterations"] = scenario.max_iterations
        if scenario.tokens is not None:
            budget["tokens"] = scenario.tokens
        tools = [
            {
                "name": name,
                "sideEffect": side_effect.value,
                "requiresApproval": name in scenario.approval,
                **self._rule(name in scenario.approval),
                "timeoutSeconds": CALL_SECONDS,
                "python": {"callable": f"keelgate.testing.sim.downstream:{name}"},
            }
            for name, side_effect in TOOLS
        ]
        self._push(
            {
                "goal": "Restock the shelves",
                "model": {"provider": "scripted", "script": [{"done": True}]},
                "tools": tools,
                "budget": budget,
            }
        )

    @property
    def manifest(self) -> dict[str, Any]:
        return self.versions[-1]

    @property
    def generation(self) -> int:
        return len(self.versions)

    def _rule(self, asked: bool) -> dict[str, Any]:
        """A tool's approval rule when it asks for approval and the scenario wants two people
        (one person needs no more than requiresApproval)."""
        if asked and self.scenario.approvers > 1:
            return {"approval": {"required": self.scenario.approvers}}
        return {}

    def _push(self, manifest: dict[str, Any]) -> None:
        self.versions.append(manifest)
        self.approval_rules.append({t["name"]: needed(t) for t in manifest["tools"] if needed(t)})

    def edit(self, what: str) -> None:
        """One edit a person makes (``EDITS``); each toggles, so a run sees them come and go."""
        new = copy.deepcopy(self.manifest)
        tools = {t["name"]: t for t in new["tools"]}
        budget = new.setdefault("budget", {})
        if what.startswith("approval "):
            tool = tools.get(what.split()[1])
            if tool is not None:
                asked = not needed(tool)
                tool["requiresApproval"] = asked
                tool.pop("approval", None)
                tool.update(self._rule(asked))
        elif what == "place_order READ":
            tool = tools["place_order"]
            tool["sideEffect"] = "READ" if tool["sideEffect"] == "WRITE" else "WRITE"
        elif what == "drop notify":
            if "notify" in tools:
                new["tools"] = [t for t in new["tools"] if t["name"] != "notify"]
            else:
                new["tools"].append(copy.deepcopy(self.versions[0]["tools"][2]))
        elif what == "READ only":
            if "allowedSideEffects" in new:
                del new["allowedSideEffects"]
            else:
                new["allowedSideEffects"] = ["READ"]
        elif what == "raise budget":
            if "maxIterations" in budget:
                budget["maxIterations"] += 2
            if "tokens" in budget:
                budget["tokens"] += 1500
        elif what == "lower budget":
            if "maxIterations" in budget:
                budget["maxIterations"] = max(1, budget["maxIterations"] - 1)
            if "tokens" in budget:
                budget["tokens"] = max(200, budget["tokens"] - 500)
        self.world.say(f"spec edited: {what} (generation {self.generation + 1})")
        self._push(new)

    def restore_tools(self) -> None:
        """The calm end of a run: the tools and side effects as they were at the start (the
        budget as it stands), so every run can finish."""
        new = copy.deepcopy(self.manifest)
        new["tools"] = copy.deepcopy(self.versions[0]["tools"])
        new.pop("allowedSideEffects", None)
        if new != self.manifest:
            self.world.say(f"spec restored (generation {self.generation + 1})")
            self._push(new)

    def max_budget(self, name: str) -> int | None:
        """The largest value a budget ever had (None if it was ever unlimited)."""
        values = [v.get("budget", {}).get(name) for v in self.versions]
        if any(v is None for v in values):
            return None
        return max(int(v) for v in values)


def needed(tool: dict[str, Any]) -> int:
    """How many people a manifest's tool asks to approve each call (0: none)."""
    rule = tool.get("approval")
    if isinstance(rule, dict):
        return int(rule.get("required", 1))
    return 1 if tool.get("requiresApproval") else 0
