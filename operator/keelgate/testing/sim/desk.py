"""The run as its owner keeps it: the manifest (the AgentRun's ``spec``) and its edits.

Why it exists: people edit a run while it runs (add, drop or change an approval rule: its count,
its groups, notCreator, its expiry; make a tool READ, allow only READs, raise or lower a budget;
with issue 46's moves, send a tool somewhere else after its call was approved), and the oracle
must know what was asked of each call then. ``Desk`` holds the current manifest and every version
of it, numbered as ``metadata.generation`` numbers them, each booked with the moment it came into
force (``Books.specs``); the local driver records it in the store before each step (as the
operator does), the operator mode writes it into the AgentRun. The manifest's tools are the
shop's: ``place_order`` over HTTP or, in some runs, MCP; ``notify`` the same in the whole world
(over HTTP in the kept seeds' world); ``check_stock`` over HTTP;
``pay`` a Python function; its model reached in process or over HTTP (OpenAI or Anthropic).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from keelgate.core.spec import LoopSpec
from keelgate.manifest import spec_from_manifest
from keelgate.testing.sim.books import CREATOR, Books, SpecVersion, rule_of
from keelgate.testing.sim.downstream import (
    CALL_SECONDS,
    PAY_CALLABLE,
    RUSH,
    SHOP,
    TOOLS,
    http_tool,
    mcp_tool,
)
from keelgate.testing.sim.model import Scenario, dollars_text
from keelgate.testing.sim.modelserver import manifest_model
from keelgate.testing.sim.world import World

EDITS = (
    "approval place_order",
    "approval notify",
    "approval pay",
    "rule place_order",
    "rule pay",
    "place_order READ",
    "drop notify",
    "READ only",
    "raise budget",
    "lower budget",
)
#: Edits of a tool's definition (where its call goes), issue 46's: on with ``moves``.
DEFINITION_EDITS = ("place_order url", "place_order method")
#: The edit of an MCP tool's definition (``mcp_remote``): the tool of the shop's MCP server
#: ``place_order`` calls, its own or another (``downstream.RUSH``), toggled.
MCP_DEFINITION_EDITS = ("place_order remote",)
GROUP_CHOICES: tuple[tuple[str, ...], ...] = ((), ("payments-approvers",), ("shop-devs",))
#: Every side effect, as a monitor that acts must list them (``allowedSideEffects``).
ALL_EFFECTS = ["READ", "PROPOSE", "WRITE"]
#: A monitor's schedule: a tick a minute (the cron job keeps to it: ``monitor.PERIOD``).
SCHEDULE = "* * * * *"
EXPIRY_CHOICES: tuple[float | None, ...] = (None, 60.0, 300.0, 900.0)
#: A run's time budget (``budget.timeoutSeconds``: active seconds), where it has one
#: (``time_budget``: half the runs); the budget edits raise it by ``TIME_RAISE`` and lower it
#: by ``TIME_LOWER`` (never below ``TIME_LEAST``).
TIME_CHOICES = (30, 60, 120, 240)
TIME_RAISE, TIME_LOWER, TIME_LEAST = 120, 30, 15
#: How a run's model is reached: over HTTP through the product's adapters in a quarter of the
#: runs (an SDK call costs milliseconds; the in-process model, the same planner, microseconds).
MODEL_FACES = ("in-process",) * 6 + ("openai", "anthropic")


@dataclass
class Desk:
    scenario: Scenario
    world: World
    books: Books
    moves: bool = False
    #: A monitor (``loop: monitor``, a tick a minute) allowed every side effect, as a monitor
    #: that restocks is (a monitor's default is READ only).
    monitor: bool = False
    #: The run's spec names a limit on the verifier's rejections, one or two, that the budget
    #: edits raise and lower (the default of three is met by a run only now and then): drawn
    #: only with it on, so that the worlds of the kept seeds draw as they did.
    rejection_limit: bool = False
    #: The shop's MCP server is used more: ``place_order`` is an MCP tool in half the runs (not
    #: a quarter), and ``notify`` in half of them too (a draw made only with it on).
    mcp_often: bool = False
    #: An edit of ``place_order``'s definition, where it is an MCP tool, points it at another
    #: tool of the shop's MCP server (``definition_edit``); without it the URL and method
    #: edits, which change nothing of an MCP tool, are drawn as before.
    mcp_remote: bool = False
    #: Half the runs have a time budget (``budget.timeoutSeconds``), read from the rest of the
    #: draw that decides whether ``place_order`` is an MCP tool (no draw of its own).
    time_budget: bool = False
    #: A drawn rule lets ServiceAccounts decide in a third of the rules (read from the rest of
    #: its notCreator draw), and a rule's edit turns it in a third of the edits (read from the
    #: rest of the edit's own draw): no draw of its own.
    service_account_rules: bool = False
    versions: list[dict[str, Any]] = field(default_factory=list)
    #: Who the run's spec names as its creator (alice, who really created it; "" for a run
    #: driven by a program that names nobody, until its owner records her: ``record_creator``).
    creator: str = CREATOR
    _kept: list[dict[str, Any]] = field(default_factory=list)
    _recorded: tuple[int, str, LoopSpec] | None = None

    def __post_init__(self) -> None:
        scenario, schedule = self.scenario, self.world.schedule
        budget: dict[str, Any] = {}
        if scenario.max_iterations is not None:
            budget["maxIterations"] = scenario.max_iterations
        if scenario.tokens is not None:
            budget["tokens"] = scenario.tokens
        pricing: dict[str, Any] = {}
        if scenario.dollars is not None and scenario.pricing is not None:
            budget["dollars"] = scenario.dollars
            per_input, per_output = scenario.pricing
            pricing["pricing"] = {
                "inputPerMillionTokens": per_input,
                "outputPerMillionTokens": per_output,
            }
        mcp, rest = schedule.chance_and_rest(500 if self.mcp_often else 250)
        over_mcp = {"place_order"} if mcp else set()
        if self.time_budget and rest % 2:
            budget["timeoutSeconds"] = TIME_CHOICES[(rest // 2) % len(TIME_CHOICES)]
        self.model_face = MODEL_FACES[schedule.pick(len(MODEL_FACES))]
        if self.mcp_often and schedule.chance(500):
            over_mcp.add("notify")
        tools = []
        for name, side_effect in TOOLS:
            tool: dict[str, Any] = {
                "name": name,
                "sideEffect": side_effect.value,
                "timeoutSeconds": CALL_SECONDS,
            }
            if name == "pay":
                tool["python"] = {"callable": PAY_CALLABLE}
            elif name in over_mcp:
                tool.update(mcp_tool(name))
            else:
                tool.update(http_tool(name))
            if name in scenario.approval:
                tool.update(self._drawn_rule())
            tools.append(tool)
        if self.rejection_limit:
            budget["maxVerifierRejections"] = 1 + schedule.pick(2)
        self._push(
            {
                "goal": "Restock the shelves",
                "model": manifest_model(self.model_face),
                "tools": tools,
                "budget": budget,
                **pricing,
                **(
                    {"loop": "monitor", "schedule": SCHEDULE, "allowedSideEffects": ALL_EFFECTS}
                    if self.monitor
                    else {}
                ),
            }
        )

    def _drawn_rule(self) -> dict[str, Any]:
        """An approval rule: one approval by anyone (``requiresApproval``), or a rule of one or
        two people, from a group or anyone, maybe not the creator, maybe expiring."""
        schedule = self.world.schedule
        required = 1 + schedule.pick(2) if self.scenario.approvers > 1 else 1
        groups = GROUP_CHOICES[schedule.pick(len(GROUP_CHOICES))]
        not_creator, rest = schedule.chance_and_rest(400)
        bots = self.service_account_rules and rest % 3 == 1
        expires = EXPIRY_CHOICES[schedule.pick(len(EXPIRY_CHOICES))]
        if required == 1 and not groups and not not_creator and expires is None and not bots:
            return {"requiresApproval": True}
        rule: dict[str, Any] = {"required": required}
        if groups:
            rule["groups"] = list(groups)
        if not_creator:
            rule["notCreator"] = True
        if bots:
            rule["serviceAccounts"] = True
        if expires is not None:
            rule["expiresAfter"] = f"{int(expires)}s"
        return {"approval": rule}

    @property
    def manifest(self) -> dict[str, Any]:
        return self.versions[-1]

    @property
    def generation(self) -> int:
        return len(self.versions)

    def generation_of(self, manifest: Mapping[str, Any] | None) -> int:
        """The newest generation whose manifest this is, as the product keeps a manifest (its
        defaults filled in): 0 if it is none of the owner's."""
        for number in range(len(self.versions), 0, -1):
            if self._kept[number - 1] == manifest:
                return number
        return 0

    def loop_spec(self, tenant: str, run: str) -> LoopSpec:
        """The newest manifest as a driver records it for ``run`` (with its creator, alice, for
        a rule's notCreator, where the spec names her), built once per generation."""
        recorded = self._recorded
        if recorded is None or recorded[:2] != (self.generation, self.creator):
            spec = spec_from_manifest(self.manifest).loop_spec(
                tenant=tenant, run=run, creator=self.creator
            )
            recorded = self._recorded = (self.generation, self.creator, spec)
        return recorded[2]

    def name_no_creator(self) -> None:
        """The run is driven by a program whose ``LoopSpec`` names no creator (the Python API
        asks none; ``keelgate run -f`` would refuse a manifest whose rule says notCreator
        without one): a rule's notCreator then counts nobody's approval."""
        self.creator = ""

    def record_creator(self) -> None:
        """The run's owner, told that no approval can count until the run's creator is on
        record, records herself as it (the next step reads it)."""
        if not self.creator:
            self.creator = CREATOR
            self.world.say(f"{CREATOR} records herself as the run's creator")

    def tool(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.manifest["tools"] if t["name"] == name), None)

    def _push(self, manifest: dict[str, Any]) -> None:
        self.versions.append(manifest)
        # How the product keeps it (the operator and the local driver record it so): what a
        # step process is given, to be told apart by.
        kept = spec_from_manifest(manifest).loop_spec(tenant="", run="").manifest
        self._kept.append(dict(kept or {}))
        self.books.specs.append(
            SpecVersion(len(self.versions), self.world.now, copy.deepcopy(manifest))
        )

    def definition_edit(self) -> str:
        """The edit of a tool's definition the run's owner makes now (drawn): the URL or the
        method of an HTTP ``place_order``; with ``mcp_remote``, the remote tool of an MCP one
        (one draw either way, so every later choice is drawn as before)."""
        tool = self.tool("place_order")
        edits: tuple[str, ...] = DEFINITION_EDITS
        if self.mcp_remote and tool is not None and "mcp" in tool:
            edits = MCP_DEFINITION_EDITS
        return edits[self.world.schedule.pick(len(edits))]

    def edit(self, what: str) -> None:
        """One edit a person makes (``EDITS``, ``DEFINITION_EDITS``); each toggles, so a run
        sees them come and go."""
        new = copy.deepcopy(self.manifest)
        tools = {t["name"]: t for t in new["tools"]}
        budget = new.setdefault("budget", {})
        if what.startswith("approval "):
            tool = tools.get(what.split()[1])
            if tool is not None:
                asked = not rule_of(tool).required
                tool.pop("requiresApproval", None)
                tool.pop("approval", None)
                if asked:
                    tool.update(self._drawn_rule())
        elif what.startswith("rule "):
            tool = tools.get(what.split()[1])
            if tool is not None and rule_of(tool).required:
                self._change_rule(tool)
        elif what == "place_order READ":
            tool = tools["place_order"]
            tool["sideEffect"] = "READ" if tool["sideEffect"] == "WRITE" else "WRITE"
        elif what == "drop notify":
            if "notify" in tools:
                new["tools"] = [t for t in new["tools"] if t["name"] != "notify"]
            else:
                new["tools"].append(copy.deepcopy(self.versions[0]["tools"][2]))
        elif what == "READ only":
            if new.get("allowedSideEffects") == ["READ"]:
                self._allow_all(new)
            else:
                new["allowedSideEffects"] = ["READ"]
        elif what == "raise budget":
            if "maxIterations" in budget:
                budget["maxIterations"] += 2
            if "tokens" in budget:
                budget["tokens"] += 1500
            if "maxVerifierRejections" in budget:
                budget["maxVerifierRejections"] += 1
            if "timeoutSeconds" in budget:
                budget["timeoutSeconds"] += TIME_RAISE
            if "dollars" in budget:  # five plain answers more
                budget["dollars"] = dollars_text(Decimal(budget["dollars"]) + 5 * self._answer)
        elif what == "lower budget":
            if "maxIterations" in budget:
                budget["maxIterations"] = max(1, budget["maxIterations"] - 1)
            if "tokens" in budget:
                budget["tokens"] = max(200, budget["tokens"] - 500)
            if "maxVerifierRejections" in budget:
                budget["maxVerifierRejections"] = max(1, budget["maxVerifierRejections"] - 1)
            if "timeoutSeconds" in budget:
                budget["timeoutSeconds"] = max(TIME_LEAST, budget["timeoutSeconds"] - TIME_LOWER)
            if "dollars" in budget:  # two plain answers less, one left
                lowered = Decimal(budget["dollars"]) - 2 * self._answer
                budget["dollars"] = dollars_text(max(self._answer, lowered))
        elif what == "place_order url":
            http = tools["place_order"].get("http")
            if http is not None:
                steal = f"{SHOP}/steal"
                http["url"] = f"{SHOP}/orders" if http["url"] == steal else steal
        elif what == "place_order method":
            http = tools["place_order"].get("http")
            if http is not None:
                http["method"] = "POST" if http.get("method") == "DELETE" else "DELETE"
        elif what == "place_order remote":
            mcp = tools["place_order"].get("mcp")
            if mcp is not None:
                mcp["tool"] = "place_order" if mcp.get("tool") == RUSH else RUSH
        self.world.say(f"spec edited: {what} (generation {self.generation + 1})")
        self._push(new)

    @property
    def _answer(self) -> Decimal:
        return self.scenario.answer_dollars

    def regroup(self, name: str) -> None:
        """The run's owner names the other groups for the approvals of tool ``name``, whose
        call the run waits on (a rule naming none, or no rule, is left as it is): the call was
        planned under one list and is now asked of another, both in play. It draws nothing
        from the schedule."""
        tool = self.tool(name)
        rule = None if tool is None else tool.get("approval")
        named = tuple(sorted(rule.get("groups") or ())) if isinstance(rule, Mapping) else ()
        if not named:
            return
        new = copy.deepcopy(self.manifest)
        edited = next(t for t in new["tools"] if t["name"] == name)
        edited["approval"]["groups"] = list(next(g for g in GROUP_CHOICES if g and g != named))
        self.world.say(f"spec edited: groups of {name} (generation {self.generation + 1})")
        self._push(new)

    def turn_service_accounts(self, name: str) -> None:
        """The run's owner turns whether ServiceAccounts may decide the approvals of tool
        ``name``, whose call the run waits on (its CI job let in, or, its token leaked, people
        only again): the call was planned under one rule and is now asked of the other, both
        in play. A tool that asks no approval is left as it is. It draws nothing."""
        tool = self.tool(name)
        if tool is None or not rule_of(tool).required:
            return
        new = copy.deepcopy(self.manifest)
        edited = next(t for t in new["tools"] if t["name"] == name)
        rule = dict(edited.pop("approval", None) or {"required": 1})
        edited.pop("requiresApproval", None)
        if rule.pop("serviceAccounts", False) is False:
            rule["serviceAccounts"] = True
        edited["approval"] = rule
        said = "let" if rule.get("serviceAccounts") else "no longer let"
        self.world.say(
            f"spec edited: ServiceAccounts {said} decide {name} (generation {self.generation + 1})"
        )
        self._push(new)

    def _change_rule(self, tool: dict[str, Any]) -> None:
        """The rule's fields change: one drawn from the schedule (its count, its groups,
        notCreator, its expiry), and, as often as not, others with it (``_also_changed``; with
        ``service_account_rules``, whether ServiceAccounts may decide, one edit in three): most
        edits name other groups than the rule did, so that an action planned under one list
        and called under another (both in play) is common, not a one-in-a-thousand story."""
        schedule = self.world.schedule
        rule = dict(tool.get("approval") or {"required": 1})
        tool.pop("requiresApproval", None)
        # One draw, as ever (``pick(4)`` is its remainder): the rest of it decides the other
        # fields, so that every later choice of the run is drawn as before the others were.
        drawn = schedule.raw()
        which = drawn % 4
        if which == 0:
            rule["required"] = 2 if int(rule.get("required", 1)) == 1 else 1
        elif which == 1:
            groups = GROUP_CHOICES[schedule.pick(len(GROUP_CHOICES))]
            rule.pop("groups", None)
            if groups:
                rule["groups"] = list(groups)
        elif which == 2:
            if rule.pop("notCreator", False) is False:
                rule["notCreator"] = True
        else:
            expires = EXPIRY_CHOICES[schedule.pick(len(EXPIRY_CHOICES))]
            rule.pop("expiresAfter", None)
            if expires is not None:
                rule["expiresAfter"] = f"{int(expires)}s"
        tool["approval"] = _also_changed(rule, drawn // 4, drawn=which)
        # Read from bits ``_also_changed`` leaves alone: a rule that let ServiceAccounts decide
        # now asks people only, or the other way round.
        turned = self.service_account_rules and (drawn >> 13) % 3 == 1
        if turned and tool["approval"].pop("serviceAccounts", False) is False:
            tool["approval"]["serviceAccounts"] = True

    def _allow_all(self, manifest: dict[str, Any]) -> None:
        """Every side effect allowed again: by default for a task, by name for a monitor."""
        if self.monitor:
            manifest["allowedSideEffects"] = list(ALL_EFFECTS)
        else:
            manifest.pop("allowedSideEffects", None)

    def restore_tools(self) -> None:
        """The calm end of a run: the tools and side effects as they were at the start (the
        budget as it stands), so every run can finish."""
        new = copy.deepcopy(self.manifest)
        new["tools"] = copy.deepcopy(self.versions[0]["tools"])
        self._allow_all(new)
        if new != self.manifest:
            self.world.say(f"spec restored (generation {self.generation + 1})")
            self._push(new)

    def max_budget(self, name: str) -> int | None:
        """The largest value a budget ever had (None if it was ever unlimited)."""
        values = [v.get("budget", {}).get(name) for v in self.versions]
        if any(v is None for v in values):
            return None
        return max(int(v) for v in values)


def _also_changed(rule: dict[str, Any], bits: int, *, drawn: int) -> dict[str, Any]:
    """``rule`` with the fields a rule edit changes besides the one it drew (``drawn``: 0 the
    count, 1 the groups, 2 notCreator, 3 the expiry), read from ``bits`` (the rest of the
    edit's own draw; 0, the calm draw, changes nothing more). Three edits in four name other
    groups than the rule named (the other list, where it named one); one in four each turns
    notCreator, the expiry and the count."""
    changed = dict(rule)
    if drawn != 1 and bits % 4:
        named = tuple(sorted(changed.get("groups") or ()))
        others = [g for g in GROUP_CHOICES if g and g != named]
        changed["groups"] = list(others[(bits // 4) % len(others)])
    if drawn != 2 and (bits >> 3) % 4 == 3 and changed.pop("notCreator", False) is False:
        changed["notCreator"] = True
    if drawn != 3 and (bits >> 5) % 4 == 3:
        expires = EXPIRY_CHOICES[(bits >> 7) % len(EXPIRY_CHOICES)]
        changed.pop("expiresAfter", None)
        if expires is not None:
            changed["expiresAfter"] = f"{int(expires)}s"
    if drawn != 0 and (bits >> 9) % 4 == 3:
        changed["required"] = 2 if int(changed.get("required", 1)) == 1 else 1
    return changed
