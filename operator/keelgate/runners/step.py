"""The step runner: one step of a run in this process, from the spec its operator recorded.

A step pod runs exactly one step (one iteration: plan, act, observe, verify; less when the run
stops inside it) from the last checkpoint, writes the next checkpoint and exits. It needs the
store and nothing else: the operator records the spec of the generation being run in the store
(``SpecStore``) before it creates the pod, so the pod needs no Kubernetes API access, no
service-account token and no manifest in its arguments. Everything after the spec is read is what
``LocalRunner`` does: build the parts (a bad manifest fails before any state is touched), drive.

It must never import kopf or a Kubernetes client (a step pod's start-up pays for every import),
never keep state between steps, and never run more than one iteration per call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from keelgate.core.protocols import Confirmer, Stores
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.state import RunState
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.core.types import Outcome, RunPhase
from keelgate.errors import InputError
from keelgate.stores import StoreUrl, open_stores

if TYPE_CHECKING:
    from keelgate.core.loop import Loop
    from keelgate.runners.build import Parts


class StepRunner:
    """Runs one iteration of a run (the core ``LoopRunner`` protocol, one step at a time)."""

    def __init__(
        self,
        *,
        store: str | StoreUrl,
        confirmer: Confirmer | None = None,
        pricing: Mapping[str, Price] | None = None,
        tracer: Tracer = NO_TRACING,
        opener: Callable[[], Stores] | None = None,
        builder: Callable[[LoopSpec, Stores], Loop] | None = None,
        epoch: int | None = None,
    ) -> None:
        """``opener`` and ``builder`` replace how the stores are opened (from ``store``) and
        how the loop is built (from the spec's manifest), for a simulation that runs whole runs
        over its own store sessions, tools and clock (``keelgate.testing.sim``); a step pod
        leaves them unset. ``epoch``: the epoch the run's holder (the operator) took it under,
        carried on every write of the step (``RunOwners.carry``); refused once it is stale."""
        self.store = store
        self.epoch = epoch
        self.confirmer = confirmer
        self.pricing = dict(pricing or {})
        self.tracer = tracer
        self._opener = opener
        self._builder = builder

    def run(self, spec: LoopSpec) -> Outcome:
        """One step of ``spec``'s run; ``Running`` (no stop) when the run goes on."""
        from keelgate.runners.build import build_parts

        parts = build_parts(spec)
        stores = open_stores(self.store, pooled=False)
        try:
            return self._drive(spec, stores, parts)
        finally:
            stores.close()

    def step(
        self, tenant: str, run: str, *, asked_to_stop: Callable[[], bool] | None = None
    ) -> Outcome:
        """One step of the run whose spec the operator recorded in the store; with
        ``asked_to_stop`` (a drain's SIGTERM), left at the next checkpoint once it says so."""
        stores = open_stores(self.store, pooled=False) if self._opener is None else self._opener()
        try:
            if self.epoch is not None:
                _carry(stores, tenant, run, self.epoch)
            spec = recorded_spec(stores, tenant, run)
            ended = _ended(stores, tenant, run)
            if ended is not None:
                return ended  # nothing to do: no model, no tool is built
            if self._builder is not None:
                loop = self._builder(spec, stores)
                return loop.run_or_resume(spec, one_iteration=True, asked_to_stop=asked_to_stop)
            # Imported here, not at the top: the manifest, the adapters and the loop cost a
            # step's start-up much, and a finished run needs none of them.
            from keelgate.runners.build import build_parts

            return self._drive(spec, stores, build_parts(spec), asked_to_stop=asked_to_stop)
        finally:
            stores.close()

    def _drive(
        self,
        spec: LoopSpec,
        stores: Stores,
        parts: Parts,
        *,
        asked_to_stop: Callable[[], bool] | None = None,
    ) -> Outcome:
        from keelgate.runners.build import build_loop

        loop = build_loop(
            spec,
            stores,
            confirmer=self.confirmer,
            parts=parts,
            pricing=self.pricing,
            tracer=self.tracer,
        )
        return loop.run_or_resume(spec, one_iteration=True, asked_to_stop=asked_to_stop)


def _carry(stores: Stores, tenant: str, run: str, epoch: int) -> None:
    """Write the run under its holder's ``epoch`` from now on."""
    owners = stores.owners
    if owners is None:
        raise InputError("--epoch", "this store records no run ownership (a SQL store does)")
    owners.carry(tenant, run, epoch)


def _ended(stores: Stores, tenant: str, run: str) -> Outcome | None:
    """The outcome of a run that no step can change (its goal met, or failed for good)."""
    checkpoint = stores.checkpoints.load(tenant, run)
    if checkpoint is None:
        return None
    outcome = RunState.from_json(checkpoint.state).outcome()
    if outcome.phase is RunPhase.SUCCEEDED:
        return outcome
    return None


def recorded_spec(stores: Stores, tenant: str, run: str) -> LoopSpec:
    """The spec recorded for a run, or one line saying that none is (or the store keeps none)."""
    if stores.specs is None:
        raise InputError("--store", "this store keeps no recorded specs; use PostgreSQL")
    recorded = stores.specs.recorded_spec(tenant, run)
    if recorded is None:
        raise InputError(
            "--run",
            f"no spec is recorded for run {run!r} in namespace {tenant!r} "
            "(the operator records it before it starts a step)",
        )
    return LoopSpec.from_json(recorded.spec)
