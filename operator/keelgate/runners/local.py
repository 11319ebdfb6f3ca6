"""The in-process runner: open the stores a LoopSpec names, build its loop, drive it to a stop.

It is what ``keelgate run`` and ``keelgate resume`` use, and the model for every other runner: a
step pod or a Temporal activity does the same with its own process around it. Everything that can
be wrong with the manifest is found before a store is opened, so bad input never touches saved
state. It must never keep state between calls: each call rebuilds everything from the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from keelgate.adapters.loading import FROM_SYS_PATH, CallableLoader
from keelgate.core.loop import Loop
from keelgate.core.model import Model, ModelReply, ModelRequest
from keelgate.core.monitor import is_tick, latest_tick, tick_run_name
from keelgate.core.protocols import Confirmer, Stores
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.state import RunState
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.core.types import LoopKind, Outcome, StopReason
from keelgate.errors import InputError
from keelgate.manifest import AgentRunSpec, spec_from_manifest
from keelgate.runners.build import Parts, build_loop, build_parts
from keelgate.stores import DEFAULT_URL, StoreUrl, open_stores

# A tick stopped here waits for a person; a new tick could repeat a WRITE whose outcome is
# still unknown, so the same tick is driven again instead.
_WAITING = frozenset({StopReason.OUTCOME_UNKNOWN, StopReason.AWAITING_APPROVAL})


class LocalRunner:
    """Runs a LoopSpec in this process (the core ``LoopRunner`` protocol)."""

    def __init__(
        self,
        *,
        store: str | StoreUrl = DEFAULT_URL,
        confirmer: Confirmer | None = None,
        pricing: Mapping[str, Price] | None = None,
        callables: CallableLoader | None = None,
        tracer: Tracer = NO_TRACING,
        busy_wait: float = 5.0,
        model_calls: Callable[[ModelRequest], None] | None = None,
    ) -> None:
        self.store = store
        #: Told of every model call before it is made (its iteration and phase): a command's
        #: progress line. It must not raise, and it sees no tool argument.
        self.model_calls = model_calls
        #: How long a run another driver holds is waited for before it is busy (see Loop).
        self.busy_wait = busy_wait
        self.confirmer = confirmer
        self.pricing = dict(pricing or {})
        self.tracer = tracer
        #: Where a manifest's python models and tools are imported from (default: sys.path).
        self.callables = callables or FROM_SYS_PATH

    def run(self, spec: LoopSpec, *, asked_to_stop: Callable[[], bool] | None = None) -> Outcome:
        """Start or resume ``spec``'s run to its next stop.

        For a monitor named by its base name this runs a tick (see ``tick``); a monitor spec
        already naming a tick (``<name>.tick-<n>``) resumes that tick. ``asked_to_stop`` is the
        loop's: once it says so, the call under way ends and is recorded, and the run is left at
        its next checkpoint (no stop recorded) for a resume to go on from.
        """
        manifest = self._checked(spec)
        if spec.kind is LoopKind.MONITOR and not is_tick(spec.run):
            return self._tick(spec, self._parts(spec, manifest), asked_to_stop)
        parts = self._parts(spec, manifest)
        stores = self._open(spec)
        try:
            loop = self._loop(spec, stores, parts)
            return loop.run_or_resume(spec, asked_to_stop=asked_to_stop)
        finally:
            stores.close()

    def tick(self, spec: LoopSpec, *, asked_to_stop: Callable[[], bool] | None = None) -> Outcome:
        """Run the monitor's next tick, ``<name>.tick-<n>`` with n one past the highest stored.

        Each tick is a run of its own (checkpoint, keys, audit chain). A latest tick that never
        reached a stop (its process died) or that waits for a person (``outcome_unknown``,
        ``awaiting_approval``) is driven again instead of starting a new one: a fresh tick must
        not repeat a WRITE that may already have happened.
        """
        if spec.kind is not LoopKind.MONITOR:
            raise InputError("spec.loop", f"only a monitor loop has ticks, not {spec.kind.value}")
        if is_tick(spec.run):
            raise InputError("run", f"{spec.run!r} is a tick; name the monitor itself")
        manifest = self._checked(spec)
        return self._tick(spec, self._parts(spec, manifest), asked_to_stop)

    def _parts(self, spec: LoopSpec, manifest: AgentRunSpec) -> Parts:
        parts = build_parts(spec, manifest=manifest, callables=self.callables)
        if self.model_calls is None:
            return parts
        return replace(parts, model=_Watched(parts.model, self.model_calls))

    def _tick(
        self, spec: LoopSpec, parts: Parts, asked_to_stop: Callable[[], bool] | None = None
    ) -> Outcome:
        stores = self._open(spec)
        try:
            loop = self._loop(spec, stores, parts)
            runs = [ref.run for ref in stores.checkpoints.runs(spec.tenant)]
            latest = latest_tick(spec.run, runs)
            if latest:
                name = tick_run_name(spec.run, latest)
                stop = loop.state(spec.tenant, name).stop
                if stop is None or stop.reason in _WAITING:
                    return loop.run_or_resume(replace(spec, run=name), asked_to_stop=asked_to_stop)
            following = replace(spec, run=tick_run_name(spec.run, latest + 1))
            return loop.run_or_resume(following, asked_to_stop=asked_to_stop)
        finally:
            stores.close()

    def _checked(self, spec: LoopSpec) -> AgentRunSpec:
        manifest = spec_from_manifest(spec.manifest)
        if manifest.suspend:
            raise InputError("spec.suspend", "the run is suspended; set suspend: false to run it")
        return manifest

    def _open(self, spec: LoopSpec) -> Stores:
        return open_stores(self.store)

    def _loop(self, spec: LoopSpec, stores: Stores, parts: Parts) -> Loop:
        return build_loop(
            spec,
            stores,
            confirmer=self.confirmer,
            parts=parts,
            pricing=self.pricing,
            tracer=self.tracer,
            busy_wait=self.busy_wait,
        )


class _Watched:
    """A model whose every call is first told to ``seen`` (a progress line); the rest of it is
    the model's own."""

    def __init__(self, model: Model, seen: Callable[[ModelRequest], None]) -> None:
        self._model = model
        self._seen = seen
        self.name = model.name

    def call(self, request: ModelRequest) -> ModelReply:
        self._seen(request)
        return self._model.call(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@dataclass(frozen=True)
class Resumed:
    """The spec a resume drives a run with, and what its caller should be warned about."""

    spec: LoopSpec
    warnings: tuple[str, ...] = ()


def resumed_spec(
    state: RunState,
    *,
    tokens: int | None = None,
    dollars: Decimal | None = None,
    max_iterations: int | None = None,
    timeout_seconds: float | None = None,
    max_verifier_rejections: int | None = None,
) -> Resumed:
    """The saved spec with the named budgets raised to new totals (``keelgate resume`` and the
    Temporal workflow's ``resume`` both make it here, so a raise means the same everywhere).

    A total at or under what is already used is kept but warned about (it is a total, not an
    increment), and so is a run that no raise can continue.
    """
    saved, used = state.spec, state.usage
    warnings: list[str] = []
    for flag, total, spent in (
        ("--tokens", tokens, used.tokens),
        ("--dollars", dollars, used.dollars),
        ("--max-iterations", max_iterations, state.iteration),
        ("--timeout", timeout_seconds, used.active_seconds),
    ):
        if total is not None and total <= spent:
            warnings.append(f"{flag} {total} is a new total, not more: {spent} is already used")
    budget = saved.budget.raised(
        tokens=tokens,
        dollars=dollars,
        max_iterations=max_iterations,
        timeout_seconds=timeout_seconds,
        max_verifier_rejections=max_verifier_rejections,
    )
    if state.stop is not None and not state.continues_under(budget):
        reason = state.stop.reason
        if reason is StopReason.GOAL_MET:
            why = "it met its goal"
        elif reason is StopReason.VERIFIER_REJECTIONS:
            why = "the verifier rejected it (raise --max-verifier-rejections to go on)"
        else:
            why = f"it stopped for good ({reason.value})"
        warnings.append(f"{state.run} has finished: {why}; a finished run has nothing to resume")
    return Resumed(saved.with_budget(budget), tuple(warnings))
