"""One simulated run from a seed (or a replayed schedule), judged by the oracle; and the search
that runs many, shrinks a failing one and says how to replay it.

Why it exists: this is what ``make sim`` and the tests call. A run is: a scenario drawn from the
schedule, a store (memory, standing for a server store, or a real SQLite file), a network with
the shop and the model on it (every adapter's requests routed there through
``keelgate.adapters.network``), a chaotic first part (deaths, pauses, lost nodes, drains, lost
requests and answers, people deciding at any moment, wrongly now and then, editing the spec, and
the moves ``Options`` switches on) and then a calm end (no more faults, people truthful and
prompt, the tools as they were), after which every run must have finished. The checkers then
judge from the world's books, and compare the product's records with them. Everything runs on
the world's virtual time (``World.drives_the_clocks``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from keelgate.adapters import network as adapters_network
from keelgate.core.loop import Loop
from keelgate.core.protocols import Stores
from keelgate.core.types import canonical_json
from keelgate.errors import KeelgateError
from keelgate.testing.sim import records as sim_records
from keelgate.testing.sim import stores as sim_stores
from keelgate.testing.sim.books import Books
from keelgate.testing.sim.checkers import Violation, judge, judge_ticks
from keelgate.testing.sim.desk import Desk
from keelgate.testing.sim.downstream import (
    CALL_SECONDS,
    MCP_TOOLS,
    STATUS_PATH,
    Shop,
    StatusTransport,
)
from keelgate.testing.sim.local import LocalDriver
from keelgate.testing.sim.model import Planner, Scenario
from keelgate.testing.sim.modelserver import HOST as MODEL_HOST
from keelgate.testing.sim.modelserver import KEY_ENV, ModelServer
from keelgate.testing.sim.monitor import MonitorDriver, tick_is_over
from keelgate.testing.sim.network import McpTransport, Network, SdkTransport, Transport
from keelgate.testing.sim.operator_mode import Cluster
from keelgate.testing.sim.options import Options
from keelgate.testing.sim.pay import THREAD_SAID, THREADS, paying
from keelgate.testing.sim.people import CALM_PROMPT, CALM_START, People
from keelgate.testing.sim.processes import Faults, Setting
from keelgate.testing.sim.two_clusters import TwoClusters
from keelgate.testing.sim.world import Clocks, Schedule, World

TENANT = "shop"
RUN = "restock"
#: Seconds of chaos, then of calm in which every run must finish (runs finish within minutes
#: of the calm end; two hours leave room for the longest waits the rules allow).
CHAOS, LIMIT = CALM_START, CALM_START + 2 * 3600.0
MODES = ("local", "operator", "monitor")
#: Virtual seconds a calm world must stand still (the books and every record of the store
#: unchanged) before it is judged as it would be at ``LIMIT``: longer than every wait left in
#: the calm (the work queue's backoff tops at a minute, a key's deadline at its call's limit
#: and margin, people look every minute and come back within ten), so nothing the world does
#: could still move it. Looked for once the calm has lasted ``CALM_PROMPT``.
STILL = 900.0
#: Seconds a world judged still is run on, for what is under way to end (late answers within
#: a deadline's margin, a step's grace): the events due after are dropped.
SETTLING = 120.0
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
    options: Options = Options()

    @property
    def ok(self) -> bool:
        return not self.violations


def simulate(
    *,
    seed: int | None = None,
    replay: Sequence[int] | None = None,
    store: str = "memory",
    mode: str = "local",
    options: Options = Options(),
) -> Outcome:
    """Run one simulation from ``seed`` (or the choices ``replay``) and judge it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    schedule = Schedule(seed=seed, replay=replay)
    world = World(schedule, clocks=Clocks.drawn(schedule))
    books = Books(clocks=world.clocks, call_seconds=CALL_SECONDS)
    network = Network(world, books, late_shop=options.late_shop)
    with (
        world.drives_the_clocks(),
        _routed(network),
        _model_key(),
        ExitStack() as stack,
    ):
        site = sim_stores.site(store, world.store_clock)
        try:
            return _simulate(
                world, site, books, network, stack, mode=mode, store=store, options=options
            )
        finally:
            site.close()


def _paying(
    world: World, network: Network, scenario: Scenario, *, options: Options
) -> tuple[AbstractContextManager[None], str]:
    """Where the product's Python tool runs ``pay`` (``Options.python_tool``): the world's
    function, on its time, reporting its sends or not (drawn), and what to say of it; else
    nothing to set."""
    if not options.python_tool:
        return nullcontext(), ""
    unreported, rest = world.schedule.chance_and_rest(500)
    said = f"pay {'sends without reporting them' if unreported else 'reports its sends'}"
    reports = not unreported  # threads: the rest of the same draw (every later one as before)
    threads = THREADS[rest % len(THREADS)] if options.pay_threads and reports else ""
    if threads:
        said += f", each from {THREAD_SAID[threads]}"
    return paying(world, network, quote=scenario.quote, reports=reports, threads=threads), said


@contextmanager
def _routed(network: Network) -> Iterator[None]:
    """Every adapter's requests go to the simulated network."""

    def route(url: str, library: str) -> Any:
        shop = network.servers.get("shop.sim")
        if urlsplit(url).path.startswith(STATUS_PATH) and isinstance(shop, Shop):
            return StatusTransport(network, shop)  # the confirmer's question, not a call's
        if library == adapters_network.HTTPX2_ASYNC:
            return McpTransport(network, MCP_TOOLS)
        if library == adapters_network.HTTPX2:
            return SdkTransport(network, book=urlsplit(url).netloc != MODEL_HOST)
        return Transport(network, book=urlsplit(url).netloc != MODEL_HOST)

    with adapters_network.simulated(route):
        yield


@contextmanager
def _model_key() -> Iterator[None]:
    """The API key the manifest's model names (never sent anywhere real)."""
    saved = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = "sim-key"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = saved


def _simulate(
    world: World,
    site: sim_stores.StoreSite,
    books: Books,
    network: Network,
    stack: ExitStack,
    *,
    mode: str,
    store: str,
    options: Options,
) -> Outcome:
    """One run in ``world``; what it sets for the product to meet goes on ``stack``."""
    schedule = world.schedule
    # With a limit named, the verifier rejects twice as often, so that runs meet it.
    scenario = Scenario.drawn(
        schedule,
        rejections=300 if options.rejection_limit else 150,
        dollar_budgets=options.dollars,
    )
    planner = Planner(world, scenario, books, reordered=options.reordered_args)
    network.servers["shop.sim"] = Shop(world, books)
    network.servers[MODEL_HOST] = ModelServer(world, planner, cached_input=options.cached_input)
    faults = Faults(world, slow_store=options.slow_store, suspends=options.suspends)
    pays, paid = _paying(world, network, scenario, options=options)
    stack.enter_context(pays)

    def lose_answer() -> bool:
        lost = faults.lose_answer()
        if lost:
            books.answer_lost(world.actor)
        return lost

    site.lose_answer = lose_answer
    desk = Desk(
        scenario,
        world,
        books,
        moves="definition" in options.moves,
        monitor=mode == "monitor",
        rejection_limit=options.rejection_limit,
        mcp_often=options.mcp_often,
        mcp_remote=options.mcp_remote,
        time_budget=options.time_budget,
        service_account_rules=options.service_account_rules,
    )
    if options.no_creator and mode != "operator" and schedule.chance(500):
        desk.name_no_creator()
    books.call_tokens = scenario.call_tokens
    _say_setting(world, scenario, desk, paid)
    setting = Setting(
        world,
        site,
        network,
        planner,
        desk,
        faults,
        TENANT,
        RUN,
        http_confirmer=options.http_confirmer,
        python_tool=options.python_tool,
    )
    done, calm, monitor, cluster = _set_going(setting, mode=mode, options=options)
    world.at(CHAOS, "calm", calm)
    still = Stillness(world, site, books)
    world.at(CHAOS + CALM_PROMPT, "the world is looked at", still.look)
    world.run(until=LIMIT, done=lambda: done() or still.still)
    still.watching = False  # judged now or soon: what runs on is not looked at any more
    if still.still:
        # Stuck for good: what is under way ends, and the run is judged as at the limit.
        world.say(f"nothing has moved for {STILL:.0f}s: judged as at the end")
        world.horizon = world.now + SETTLING
    if cluster is not None:
        cluster.shutdown()
    world.run(until=LIMIT, done=lambda: False)  # what is still under way ends (late answers)
    books.spun = world.spun
    books.max_iterations = desk.max_budget("maxIterations")
    books.max_tokens = desk.max_budget("tokens")
    stores = site.open()
    try:
        if monitor is None:
            records = sim_records.read(stores, TENANT, RUN, books)
            violations = judge(books, records)
        else:
            records, violations = _judge_monitor(stores, books, monitor)
    finally:
        stores.close()
    _trace_records(world, records, books)
    return Outcome(
        tuple(violations),
        world.trace.digest(),
        tuple(schedule.made),
        tuple(world.trace.lines),
        mode,
        store,
        options,
    )


def _say_setting(world: World, scenario: Scenario, desk: Desk, paid: str) -> None:
    """The run's setting, at the head of its trace: the story, the model and the clocks, how
    ``pay`` sends, a spec naming no creator, a dollar budget."""
    world.say(f"scenario {scenario}")
    world.say(f"model {desk.model_face}, clocks {world.clocks}")
    for said in (paid, "" if desk.creator else "the run's spec names no creator"):
        if said:
            world.say(said)
    if scenario.pricing is not None:
        per_input, per_output = scenario.pricing
        world.say(
            f"dollar budget ${scenario.dollars}, the model's prices ${per_input} and "
            f"${per_output} per million input and output tokens"
        )


def _set_going(
    setting: Setting, *, mode: str, options: Options
) -> tuple[
    Callable[[], bool], Callable[[], None], MonitorDriver | None, Cluster | TwoClusters | None
]:
    """The world of ``mode`` started: what says the run is over, what makes the world calm,
    and the monitor's driver or the cluster (or two), where the mode has one."""
    world, faults, desk = setting.world, setting.faults, setting.desk
    monitor: MonitorDriver | None = None
    cluster: Cluster | TwoClusters | None = None
    if mode == "monitor":
        monitor = MonitorDriver(setting, ticks=2 + world.schedule.pick(2))
        people = People(
            setting,
            moves=options.moves,
            ticks=monitor.tick_names,
            over=monitor.over,
            resume=monitor.resume,
        )

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            people.calm = True
            desk.restore_tools()
            desk.record_creator()

        monitor.start()
        people.look_later()
        done: Callable[[], bool] = monitor.over
    elif mode == "local":
        people = People(setting, moves=options.moves)
        driver = LocalDriver(setting, paged=people.paged if options.paged else None)

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            people.calm = True
            desk.restore_tools()
            desk.record_creator()
            driver.check_later(0.0)

        driver.check_later(0.0)
        people.look_later()
        done = lambda: driver.finished  # noqa: E731
    elif options.two_clusters and setting.site.kind == "memory":
        # Two clusters share a server store (PostgreSQL, the memory store stands for it); a
        # SQLite file has one host, and its runs keep one cluster.
        clusters = cluster = TwoClusters(setting, moves=options.moves)

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            clusters.quiet()
            desk.restore_tools()
            clusters.clusters[0].apply_spec()

        clusters.start()
        done = clusters.finished
    else:
        cluster = Cluster(setting, moves=options.moves)

        def calm() -> None:
            world.say("calm")
            faults.calm = True
            desk.restore_tools()
            cluster.quiet()

        cluster.start()
        done = cluster.finished
    return done, calm, monitor, cluster


def _trace_records(world: World, records: sim_records.Records, books: Books) -> None:
    """The product's audit chain and the world's effects, written at the end of the trace."""
    for event in records.events:
        world.trace.add(
            0.0,
            f"audit {event.seq} {event.type} {event.actor} {event.stamp:.3f} "
            f"{canonical_json(dict(event.data))}",
        )
    for effect in books.effects:
        part = "" if effect.part == "request" else f" {effect.part}"
        sent = books.sent[effect.sent]
        world.trace.add(effect.at, f"effect {effect.ref}{part} {sent.key[:12]} {sent.process}")


def _judge_monitor(
    stores: Stores, books: Books, monitor: MonitorDriver
) -> tuple[sim_records.Records, list[Violation]]:
    """A monitor's records (every tick's chain, in order) and its verdict: each tick judged as
    a run of its own, finished once it stopped for good, and the ticks together."""
    ticks: dict[int, sim_records.Records] = {}
    shown = "never started"
    for name in monitor.tick_names(stores):
        number = int(name.rsplit("-", 1)[1])
        read = sim_records.read(stores, TENANT, name, books.of_tick(number))
        state = Loop(stores=stores, busy_wait=0.0).state(TENANT, name)
        read.finished = tick_is_over(None if state.stop is None else state.stop.reason)
        ticks[number], shown = read, f"{name}, {read.shown}"
    every = sim_records.Records(events=[e for t in ticks.values() for e in t.events])
    return every, judge_ticks(books, ticks, over=monitor.over(), shown=shown)


class Stillness:
    """Whether a calm world stands still: the books and the store's records of every run the
    same, look after look, for ``STILL`` seconds. A run left waiting (a person never able to
    unblock it, a step pod started and stopped again and again on the same checkpoint) would
    otherwise be run on, on virtual time, to ``LIMIT``: two virtual hours of looks and
    restarts that change nothing, minutes of real time for one run.

    It never draws from the schedule, never writes, and tells nobody anything: a run that
    moves is run exactly as without it."""

    def __init__(self, world: World, site: sim_stores.StoreSite, books: Books) -> None:
        self.world = world
        self.site = site
        self.books = books
        self.still = False
        self.watching = True
        self._seen = ""
        self._since = 0.0

    def look(self) -> None:
        if not self.watching:
            return
        seen = self._fingerprint()
        if seen != self._seen:
            self._seen, self._since = seen, self.world.now
        elif self.world.now - self._since >= STILL:
            self.still = True
            return
        self.world.at(60.0, "the world is looked at", self.look)

    def _fingerprint(self) -> str:
        books = self.books
        sha = hashlib.sha256()
        counts = (books.asks, books.sent, books.effects, books.decisions, books.questions)
        sha.update(repr((*(len(c) for c in counts), len(books.specs))).encode())
        sha.update(repr([(s.known_at, s.refused) for s in books.sent]).encode())
        stores = self.site.open()
        try:
            for ref in stores.checkpoints.runs(TENANT):
                read = sim_records.read(stores, TENANT, ref.run, books)
                # The chain as the set of what it says: a step started and stopped again on
                # the same checkpoint adds the same two entries each time, and moves nothing.
                said = sorted({f"{e.type} {e.actor} {canonical_json(e.data)}" for e in read.events})
                where = (ref.run, read.shown, read.iteration, read.tokens, read.keys)
                sha.update(repr((*where, read.planned, read.chain_problems, said)).encode())
        except KeelgateError as error:  # never in the calm; if so, it moved
            sha.update(repr(error).encode())
        finally:
            stores.close()
        return sha.hexdigest()


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
