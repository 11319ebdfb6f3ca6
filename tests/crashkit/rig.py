"""Restart helpers: build everything a process builds, let it "die", build it all again.

An in-process restart must be as forgetful as a real death: the old stores are closed (which is
what the kernel does to a dead process's descriptors and sessions, so its in-flight keys read as
unknown) and every object is rebuilt over the same files. Nothing may be carried across a
restart except what lives in files or databases. Settlements made here are always truthful:
they look downstream, never guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crashkit.scripts import MARK, Call, Script
from crashkit.world import CountingModel, LedgerConfirmer, World, model_calls
from keelgate.core import failpoints
from keelgate.core.loop import Loop
from keelgate.core.model import Model
from keelgate.core.protocols import Confirmer, Stores
from keelgate.core.spec import LoopSpec
from keelgate.core.types import KeyState, Outcome, StopReason
from keelgate.errors import SettleTooEarly, SimulatedCrash
from keelgate.stores import open_stores
from keelgate.stores.memory import MemoryBackend, MemoryStore
from keelgate.stores.sqlite import SQLiteStore
from keelgate.testing.deadlines import pass_deadlines

StoreOpener = Callable[[], Stores]

#: Who settles unknown outcomes in these tests.
OPERATOR = "oncall@shop.example"


def url_opener(url: str) -> StoreOpener:
    """Open the stores a URL names, afresh each time (``sqlite:///...``, ``postgresql://...``)."""
    return lambda: open_stores(url)


def memory_opener() -> StoreOpener:
    """Memory stores over one backend that outlives every "process" of a test."""
    backend = MemoryBackend()

    def opener() -> Stores:
        store = MemoryStore(backend)
        return Stores.of(store)

    return opener


def sqlite_opener(path: Path, *, synchronous: str = "FULL") -> StoreOpener:
    """SQLite stores over one file. ``synchronous="NORMAL"`` keeps every commit through a process
    death (WAL) but not through power loss: enough for in-process deaths, and much faster on a
    busy disk."""

    def opener() -> Stores:
        store = SQLiteStore(path, synchronous=synchronous)
        return Stores.of(store)

    return opener


def opener_for(
    kind: str, directory: Path, pg_url: Callable[[], str], *, synchronous: str = "FULL"
) -> StoreOpener:
    """An opener for one store kind, its files under ``directory``."""
    if kind == "memory":
        return memory_opener()
    if kind == "sqlite":
        return sqlite_opener(directory / "keelgate.db", synchronous=synchronous)
    if kind == "postgres":
        return url_opener(pg_url())
    raise ValueError(f"unknown store kind {kind!r}")


class Rig:
    """Stores, tools, model and loop of one process; ``restart`` kills and rebuilds them all.

    ``model`` builds the model each "process" uses; by default the script, with every call
    counted in the world's journal."""

    def __init__(
        self,
        opener: StoreOpener,
        world: World,
        script: Script,
        *,
        confirm: bool = False,
        model: Callable[[], Model] | None = None,
        loop_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.opener = opener
        self.world = world
        self.script = script
        self.confirm = confirm
        self.model = model
        self.loop_options = dict(loop_options or {})
        self.stores = opener()
        self.loop = self._build()

    def _build(self) -> Loop:
        confirmer: Confirmer | None = LedgerConfirmer(self.world) if self.confirm else None
        model = self.model() if self.model is not None else None
        return Loop(
            stores=self.stores,
            model=model or CountingModel.scripted(self.script, self.world.journal),
            tools=self.world.tools(),
            confirmer=confirmer,
            busy_wait=0.5,
            **self.loop_options,
        )

    def die(self) -> None:
        self.stores.close()

    def restart(self) -> None:
        self.die()
        self.stores = self.opener()
        self.loop = self._build()

    def attempt(
        self, spec: LoopSpec, crash: tuple[str, int] | None = None
    ) -> Outcome | SimulatedCrash:
        """Run to the next stop, or die at ``crash`` (window, occurrence) and come back."""
        if crash is None:
            return self.loop.run_or_resume(spec)
        with failpoints.armed({crash[0]: crash[1]}, mode="raise"):
            try:
                return self.loop.run_or_resume(spec)
            except SimulatedCrash as death:
                self.restart()
                return death


def settle_truthfully(
    loop: Loop, outcome: Outcome, world: World, *, by: str = OPERATOR
) -> list[tuple[str, bool]]:
    """Settle each unknown outcome by looking downstream: it happened once, or not at all."""
    assert outcome.stop.reason is StopReason.OUTCOME_UNKNOWN, outcome.to_json()
    assert outcome.unknown_actions, "an outcome_unknown stop must name its actions"
    settled = []
    for unknown in outcome.unknown_actions:
        count = world.happened(unknown.idempotency_key)
        assert count <= 1, f"{unknown.tool} {unknown.action} happened {count} times"
        if count == 0:
            wait_for_the_deadline(loop, outcome.tenant, outcome.run, unknown.action, by=by)
        loop.reconcile(outcome.tenant, outcome.run, unknown.action, executed=count == 1, by=by)
        settled.append((unknown.action, count == 1))
    return settled


def wait_for_the_deadline(loop: Loop, tenant: str, run: str, action: str, *, by: str) -> None:
    """What a person must do before settling "not executed": wait until the call's write
    deadline has passed (until then a held-up process could still send it). "Not executed" is
    refused before it; then the store's clock is moved past it (``pass_deadlines``) instead of
    the test sleeping through it. A key claimed before deadlines existed has none to wait for."""
    key = next(
        u.idempotency_key for u in loop.outcome(tenant, run).unknown_actions if u.action == action
    )
    record = loop.stores.idempotency.get(tenant, key)
    if record is None or not record.sendable:
        return
    try:
        loop.reconcile(tenant, run, action, executed=False, by=by)
    except SettleTooEarly as early:
        assert early.retry_after > 0 and early.not_before == record.not_executed_after
    else:
        raise AssertionError(f"{action} was settled as not executed before its deadline")
    pass_deadlines(loop.stores, tenant)


def drive(
    rig: Rig, spec: LoopSpec, *, rounds: int = 10, settler: Loop | None = None
) -> tuple[list[Outcome], list[tuple[str, bool]]]:
    """Resume until the run stops for good, settling every unknown outcome truthfully (with
    ``settler``'s stores, as the operator settles a tenant's, if given; else the run's own)."""
    outcomes: list[Outcome] = []
    settled: list[tuple[str, bool]] = []
    for _ in range(rounds):
        outcome = rig.loop.run_or_resume(spec)
        outcomes.append(outcome)
        if outcome.stop.reason is not StopReason.OUTCOME_UNKNOWN:
            return outcomes, settled
        settled += settle_truthfully(settler or rig.loop, outcome, rig.world)
    raise AssertionError(f"the run did not settle in {rounds} rounds: {outcomes[-1].to_json()}")


def assert_no_arguments_in_audit(stores: Stores, spec: LoopSpec, *secrets: str) -> None:
    """No tool argument value may appear anywhere in the audit chain."""
    for event in stores.audit.events(spec.tenant, spec.run):
        text = json.dumps(event.to_json())
        for secret in secrets:
            assert secret not in text, f"argument value leaked into audit event {event.type}"


def assert_promise(
    rig: Rig,
    spec: LoopSpec,
    calls: Sequence[Call],
    *,
    abandoned: Iterable[str] = (),
    model_asked_once: bool = True,
) -> None:
    """The promise after a run stopped for good: every WRITE or PROPOSE happened exactly once
    (never, if abandoned), its key agrees with the world, the audit chain verifies and holds no
    argument, and (write-ahead) the model was asked once per planning step and per verdict."""
    gone = set(abandoned)
    expected = {c.key: 1 for c in calls if c.changes_world and c.key not in gone}
    assert dict(rig.world.effects()) == expected, "side-effect counts downstream"
    for call in calls:
        if not call.changes_world:
            continue
        record = rig.stores.idempotency.get(spec.tenant, call.key)
        assert record is not None, f"{call.action} {call.tool} has no idempotency record"
        want = KeyState.ABANDONED if call.key in gone else KeyState.COMPLETED
        assert record.state is want, f"{call.action} {call.tool}: {record.state} != {want}"
    report = rig.loop.verify_audit(spec.tenant, spec.run)
    assert report.ok, report.problems
    assert_no_arguments_in_audit(rig.stores, spec, MARK)
    if model_asked_once:
        for phase in ("plan", "verify"):
            asked = sorted(row["call"] for row in model_calls(rig.world.journal, phase))
            assert asked == list(range(len(rig.script))), f"{phase} calls: {asked}"
