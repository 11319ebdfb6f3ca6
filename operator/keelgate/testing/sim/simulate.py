"""One simulated run from a seed (or a replayed schedule), judged by the oracle; and the search
that runs many, shrinks a failing one and says how to replay it.

Why it exists: this is what ``make sim`` and the tests call. A run is: a scenario drawn from the
schedule, a store (memory, standing for a server store, or a real SQLite file), a chaotic first
part (deaths, pauses, lost nodes, drains, lost and late answers, people deciding at any moment,
wrongly now and then, and editing the spec) and then a calm end (no more faults, people truthful
and prompt, the tools as they were), after which every run must have finished. The oracle then
judges. Everything runs on the world's virtual time (``keelgate.core.clocks.simulated``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keelgate.core import clocks
from keelgate.core.types import canonical_json
from keelgate.testing.sim import stores as sim_stores
from keelgate.testing.sim.desk import Desk
from keelgate.testing.sim.downstream import Ledger
from keelgate.testing.sim.local import LocalDriver
from keelgate.testing.sim.model import Scenario
from keelgate.testing.sim.operator_mode import Cluster
from keelgate.testing.sim.oracle import Truth, Violation, judge
from keelgate.testing.sim.people import People
from keelgate.testing.sim.processes import Faults
from keelgate.testing.sim.world import Schedule, World

TENANT = "shop"
RUN = "restock"
#: Seconds of chaos, then of calm in which every run must finish.
CHAOS, LIMIT = 900.0, 6 * 3600.0
MODES = ("local", "operator")
STORES = ("memory", "sqlite")


@dataclass(frozen=True)
class Outcome:
    """One simulated run: what broke (nothing, one hopes), its trace's hash, its choices."""

    violations: tuple[Violation, ...]
    digest: str
    choices: tuple[int, ...]
    lines: tuple[str, ...]
    mode: str
    store: str

    @property
    def ok(self) -> bool:
        return not self.violations


def simulate(
    *,
    seed: int | None = None,
    replay: Sequence[int] | None = None,
    store: str = "memory",
    mode: str = "local",
) -> Outcome:
    """Run one simulation from ``seed`` (or the choices ``replay``) and judge it."""
    schedule = Schedule(seed=seed, replay=replay)
    world = World(schedule)
    with clocks.simulated(wall=world.wall, boot=world.boot, alarm=world.alarm):
        site = sim_stores.site(store, world.wall)
        try:
            return _simulate(world, site, mode=mode, store=store)
        finally:
            site.close()


def _simulate(world: World, site: sim_stores.StoreSite, *, mode: str, store: str) -> Outcome:
    schedule = world.schedule
    scenario = Scenario.drawn(schedule)
    ledger = Ledger()
    truth = Truth(ledger)
    faults = Faults(world)
    desk = Desk(scenario, world)
    people = People(world, site, ledger, desk, tenant=TENANT, run=RUN)
    truth.decisions = people.decisions
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    world.say(f"scenario {scenario}")
    if mode == "local":
        driver = LocalDriver(
            world, site, ledger, scenario, faults, desk, truth, tenant=TENANT, run=RUN
        )

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            people.calm = True
            desk.restore_tools()
            driver.check_later(0.0)

        driver.check_later(0.0)
        people.look_later()
        done: Callable[[], bool] = lambda: driver.finished  # noqa: E731
    else:
        cluster = Cluster(
            world, site, ledger, scenario, faults, desk, truth, tenant=TENANT, run=RUN
        )
        truth.decisions = []
        truth.human_from_audit = True

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            cluster.calm = True
            cluster.api.faulty = False
            desk.restore_tools()
            cluster.api.replace_spec("AgentRun", TENANT, RUN, desk.manifest)

        cluster.start()
        done = cluster.finished
    world.at(CHAOS, "calm", calm)
    world.run(until=LIMIT, done=done)
    if mode == "operator":
        cluster.shutdown()
    world.run(until=LIMIT, done=lambda: False)  # what is still under way ends (late answers)
    truth.max_iterations = desk.max_budget("maxIterations")
    truth.max_tokens = desk.max_budget("tokens")
    truth.call_tokens = scenario.input_tokens + scenario.output_tokens
    stores = site.open()
    try:
        violations = judge(stores, TENANT, RUN, truth)
        for event in stores.audit.events(TENANT, RUN):
            world.trace.add(
                0.0,
                f"audit {event.seq} {event.type} {event.actor} {event.at} "
                f"{canonical_json(dict(event.data))}",
            )
    finally:
        stores.close()
    for effect in ledger.effects:
        part = "" if effect.part == "request" else f" {effect.part}"
        world.trace.add(effect.at, f"ledger {effect.tool}{part} {effect.key} {effect.process}")
    return Outcome(
        tuple(violations),
        world.trace.digest(),
        tuple(schedule.made),
        tuple(world.trace.lines),
        mode,
        store,
    )


# The schedule as text: the positions of its non-zero choices, for the one replay command.


def encode(choices: Sequence[int]) -> str:
    return ",".join(f"{i}={v}" for i, v in enumerate(choices) if v) or "calm"


def decode(text: str) -> list[int]:
    if text.strip() in ("", "calm"):
        return []
    pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
    found = {int(i): int(v) for i, v in pairs}
    choices = [0] * (max(found) + 1)
    for i, v in found.items():
        choices[i] = v
    return choices


def seed_of(index: int, base: int = 0) -> int:
    """The ``index``-th seed of a search starting at ``base``, spread over 64 bits."""
    return int.from_bytes(hashlib.sha256(f"{base}:{index}".encode()).digest()[:8], "big")


def shrink(
    choices: Sequence[int],
    fails: Callable[[Sequence[int]], bool],
    *,
    budget: int = 400,
) -> list[int]:
    """A shorter, calmer schedule that still fails: cut the end, then set chunks of choices to
    0 (calm), halving the chunk size, while ``fails`` says it still breaks the same promise."""
    best = list(choices)
    tries = 0
    while best and best[-1] == 0:
        best.pop()
    # The shortest prefix that still fails (past its end every choice is calm).
    low, high = 0, len(best)
    while low < high and tries < budget:
        middle = (low + high) // 2
        tries += 1
        if fails(best[:middle]):
            high = middle
        else:
            low = middle + 1
    best = best[:high]
    size = max(1, len(best) // 2)
    while size >= 1 and tries < budget:
        start = 0
        while start < len(best) and tries < budget:
            if any(best[start : start + size]):
                candidate = (
                    best[:start] + [0] * len(best[start : start + size]) + best[start + size :]
                )
                tries += 1
                if fails(candidate):
                    best = candidate
            start += size
        size //= 2
    while best and best[-1] == 0:
        best.pop()
    return best
