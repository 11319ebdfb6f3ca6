"""The product's records of one simulated run, as a person can read them: its audit chain
(verified), its checkpoint, the keys its chain names.

Why it exists: the oracle judges from the world's books (``keelgate.testing.sim.books``) and
then checks the product's records against them, both ways (nothing missing, nothing invented).
Reading the records once, into plain values, keeps the checkers free of stores, so each can be
fed a hand-made record in a unit test. Stamps are turned into world moments here
(``Books.true_of_stamp``), once.

This module must never decide whether a promise held: it only reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.types import RunPhase
from keelgate.errors import KeelgateError
from keelgate.testing.sim.books import Books


@dataclass(frozen=True)
class Event:
    """One event of the chain: its moment (a world moment, read back from its stamp) and its
    stamp (seconds since the epoch, to the millisecond)."""

    seq: int
    type: str
    actor: str
    at: float
    stamp: float
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KeyView:
    """A key as the store holds it at the end."""

    state: str
    settled_by: str = ""
    source: str = ""


@dataclass(frozen=True)
class PlannedAction:
    """An action of a plan the run kept (its checkpoint's plan, or its history window)."""

    action: str
    tool: str
    args: Mapping[str, Any]


@dataclass
class Records:
    events: list[Event] = field(default_factory=list)
    chain_problems: list[str] = field(default_factory=list)
    finished: bool = True
    shown: str = ""  # how the run stands at the end, in words
    iteration: int = 0
    tokens: int = 0
    keys: dict[str, KeyView] = field(default_factory=dict)
    planned: list[PlannedAction] = field(default_factory=list)

    def of_type(self, *types: str) -> list[Event]:
        return [e for e in self.events if e.type in types]


def stamp_seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def read(stores: Stores, tenant: str, run: str, books: Books) -> Records:
    """The run's records at the end, as ``keelgate status`` and ``keelgate audit`` read them."""
    loop = Loop(stores=stores, busy_wait=0.0)
    records = Records()
    for event in stores.audit.events(tenant, run):
        stamp = stamp_seconds(event.at)
        records.events.append(
            Event(
                event.seq,
                event.type,
                event.actor,
                books.true_of_stamp(stamp),
                stamp,
                dict(event.data),
            )
        )
    report = loop.verify_audit(tenant, run)
    records.chain_problems = list(report.problems)
    try:
        state = loop.state(tenant, run)
    except KeelgateError:
        state = None
    if state is None:
        records.finished, records.shown = False, "never started"
    else:
        outcome = state.outcome()
        records.finished = outcome.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED)
        records.shown = f"{outcome.phase.value} {outcome.stop.reason.value}: {outcome.stop.message}"
        records.iteration = outcome.iteration
        records.tokens = outcome.usage.tokens
        if state.plan is not None:
            records.planned.extend(
                PlannedAction(a.id, a.tool, dict(a.args)) for a in state.plan.actions
            )
        for entry in state.history:
            for action in entry.get("actions") or ():
                if isinstance(action, Mapping) and isinstance(action.get("args"), Mapping):
                    records.planned.append(
                        PlannedAction(
                            str(action.get("id")), str(action.get("tool")), dict(action["args"])
                        )
                    )
    for saved in records.of_type("loop.plan_saved"):
        for action in saved.data.get("actions") or ():
            key = str(action.get("idempotencyKey"))
            if key in records.keys:
                continue
            record = stores.idempotency.get(tenant, key)
            if record is not None:
                records.keys[key] = KeyView(record.state.value, record.settled_by, record.source)
    return records
