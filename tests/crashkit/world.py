"""The downstream world of the crash tests: a system of record that outlives any process.

Every side effect a tool causes is appended to a JSON-lines journal and fsynced before the tool
goes on, so a test (or a fresh process) can count how many times a WRITE really happened, even
after ``os._exit``. The world must never deduplicate by idempotency key: if Keelgate ran a WRITE
twice, the journal has to say two, or the tests could not catch it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.model import Model, ModelReply, ModelRequest
from keelgate.core.types import ApprovalRule, SideEffect, UnknownAction
from keelgate.errors import ToolError
from keelgate.testing import failpoint

#: Tool classes whose calls change the world and so must happen at most once.
SIDE_EFFECTS = frozenset({SideEffect.WRITE, SideEffect.PROPOSE})

Placement = Literal["before", "after"]

_INVENTORY = {"A1": 3, "B2": 0, "C3": 12}

#: The SKU the downstream system refuses to order (a definite failure: nothing happens).
DISCONTINUED = "discontinued-sku"


class Journal:
    """An append-only JSON-lines file; each line is written whole in one ``write`` and, unless
    ``fsync=False`` (in-process deaths only: the page cache survives them), fsynced."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()

    def record(self, kind: str, **fields: Any) -> None:
        line = (json.dumps({"kind": kind, **fields}, sort_keys=True) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
                if self.fsync:
                    os.fsync(fd)  # survives power loss too, not only a process death
            finally:
                os.close(fd)

    def entries(self, kind: str | None = None) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [row for row in rows if kind is None or row["kind"] == kind]


@dataclass(frozen=True)
class World:
    """Tools over a journal: ``get_inventory`` (READ), ``place_order`` (WRITE), ``notify``
    (PROPOSE). Every tool body passes the ``mid_tool`` failpoint; ``effect`` says whether a
    side effect lands before it (a crash there leaves it done) or after it (left undone). An
    order for ``DISCONTINUED`` is refused (``ToolError``) and changes nothing."""

    journal: Journal
    effect: Placement = "before"
    approval: frozenset[str] = field(default_factory=frozenset)
    #: Tools with an approval rule of their own (several people, groups, expiry ...).
    rules: Mapping[str, ApprovalRule] = field(default_factory=dict)
    #: Race tests: the body of ``hold_tool`` journals "holding" and waits until the file
    #: ``hold`` exists, so a second process can be let in while the first is mid-tool.
    hold: str = ""
    hold_tool: str = ""
    #: Tools declared READ although their bodies still change the world: a manifest edited
    #: between a saved plan and its call. The journal still records every real effect.
    as_read: frozenset[str] = field(default_factory=frozenset)

    def tools(self) -> list[PythonTool]:
        return [
            PythonTool("get_inventory", self._get_inventory, SideEffect.READ),
            PythonTool(
                "place_order",
                self._place_order,
                self._declared("place_order", SideEffect.WRITE),
                requires_approval="place_order" in self.approval,
                approval=self.rules.get("place_order"),
            ),
            PythonTool(
                "notify",
                self._notify,
                self._declared("notify", SideEffect.PROPOSE),
                requires_approval="notify" in self.approval,
                approval=self.rules.get("notify"),
            ),
        ]

    def _declared(self, tool: str, side_effect: SideEffect) -> SideEffect:
        return SideEffect.READ if tool in self.as_read else side_effect

    # The tool bodies

    def _get_inventory(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        self._wait("get_inventory")
        failpoint("mid_tool")
        sku = str(args["sku"])
        return {"sku": sku, "count": _INVENTORY.get(sku, 0)}

    def _place_order(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        return self._change("place_order", args, idempotency_key, {"placed": args.get("sku")})

    def _notify(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        return self._change("notify", args, idempotency_key, {"sent": True})

    def _wait(self, tool: str) -> None:
        if not self.hold or tool != self.hold_tool:
            return
        self.journal.record("holding", tool=tool, pid=os.getpid())
        deadline = time.monotonic() + 60
        while not Path(self.hold).exists():
            assert time.monotonic() < deadline, "nobody released the held tool"
            time.sleep(0.02)

    def _change(self, tool: str, args: Mapping[str, Any], key: str | None, result: Any) -> Any:
        self._wait(tool)
        refused = tool == "place_order" and args.get("sku") == DISCONTINUED
        if self.effect == "before" and not refused:
            self.journal.record("effect", tool=tool, key=key, args=dict(args))
        failpoint("mid_tool")
        if refused:
            # A definite refusal by the system of record: nothing happened downstream.
            raise ToolError(f"{DISCONTINUED} can no longer be ordered")
        if self.effect == "after":
            self.journal.record("effect", tool=tool, key=key, args=dict(args))
        return result

    # What the system of record says

    def effects(self) -> Counter[str]:
        """How many times each idempotency key's side effect really happened."""
        return Counter(str(row["key"]) for row in self.journal.entries("effect"))

    def happened(self, key: str) -> int:
        return self.effects()[key]


class LedgerConfirmer:
    """Trusted harness code that asks the system of record, as the ADR's confirmer does."""

    def __init__(self, world: World, *, name: str = "ledger-confirmer") -> None:
        self.world = world
        self.name = name

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        count = self.world.happened(action.idempotency_key)
        assert count <= 1, f"{action.tool} {action.action} happened {count} times"
        return count == 1


class CountingModel:
    """A model that journals every call it receives before answering, so tests can prove the
    model was (not) asked again, across restarts and real process deaths."""

    def __init__(self, inner: Model, journal: Journal) -> None:
        self.inner = inner
        self.journal = journal
        self.name = inner.name

    def call(self, request: ModelRequest) -> ModelReply:
        self.journal.record(
            "model", phase=request.phase, call=request.call, iteration=request.iteration
        )
        return self.inner.call(request)

    @staticmethod
    def scripted(script: list[dict[str, Any]], journal: Journal) -> CountingModel:
        return CountingModel(ScriptedModel(script), journal)


def model_calls(journal: Journal, phase: str | None = None) -> list[dict[str, Any]]:
    return [row for row in journal.entries("model") if phase is None or row["phase"] == phase]
