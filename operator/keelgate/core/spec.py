"""LoopSpec: everything needed to start or resume a run, as plain serialisable data.

A runner can ship a LoopSpec to another process (a step pod, a Temporal worker) and rebuild the
same loop there. It must never hold live objects (connections, callables, clients): those are
built from it by the runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any

from pydantic import Field, PlainSerializer

from keelgate.core.json_codec import OMIT_EMPTY, JsonValue
from keelgate.core.types import LoopKind, SideEffect, Usage
from keelgate.core.values import INT64_MAX as INT64_MAX  # where CLI flags have read it from


@dataclass(frozen=True)
class Budget(JsonValue):
    """Limits of a run. ``None`` means unlimited. Raising a limit and resuming continues the run."""

    max_iterations: int | None = None
    tokens: int | None = None
    dollars: Decimal | None = None
    # A number as given: 60 stays 60 in the checkpoint, 60.0 stays 60.0.
    timeout_seconds: int | float | None = None
    max_verifier_rejections: int | None = 3

    def raised(self, **totals: Any) -> Budget:
        """A copy with the named limits set to new totals (unset names are kept)."""
        return replace(self, **{k: v for k, v in totals.items() if v is not None})


@dataclass(frozen=True)
class Price(JsonValue):
    """Dollars per million tokens. Keelgate ships no prices: a user states them."""

    input_per_million: Annotated[Decimal, Field(alias="inputPerMillionTokens")]
    output_per_million: Annotated[Decimal, Field(alias="outputPerMillionTokens")]

    def cost(self, usage: Usage) -> Decimal:
        return (
            self.input_per_million * usage.input_tokens
            + self.output_per_million * usage.output_tokens
        ) / Decimal(1_000_000)


def _sorted_side_effects(allowed: frozenset[SideEffect] | None) -> list[str] | None:
    # A set has no order; its JSON does, so the same spec is always the same text.
    return None if allowed is None else sorted(effect.value for effect in allowed)


@dataclass(frozen=True)
class LoopSpec(JsonValue):
    """One run: who (tenant), which (run), what for (goal), how far (budget).

    ``manifest`` is the AgentRun ``spec`` a runner builds the model and tools from; it is opaque to
    the loop. Where it runs (the store URL, which may hold a password) is the runner's setting,
    never part of the spec: every checkpoint carries the spec.
    """

    tenant: str
    run: str
    goal: str
    kind: LoopKind = LoopKind.TASK
    budget: Budget = field(default_factory=Budget)
    allowed_side_effects: Annotated[
        frozenset[SideEffect] | None, PlainSerializer(_sorted_side_effects)
    ] = None
    manifest: Mapping[str, Any] | None = None
    # Where a manifest's Python code imports from (the CLI's `run -f`); only written when set.
    source_dir: Annotated[str, OMIT_EMPTY] = ""
    # Who created the run, as its manifest's annotation keelgate.dev/created-by says (in a
    # cluster, the admission policy makes it the creating user's own name and keeps it): an
    # approval rule with notCreator does not count their yes. Only written when known.
    creator: Annotated[str, OMIT_EMPTY] = ""

    @property
    def side_effects(self) -> frozenset[SideEffect]:
        """What the gateway lets through: verification loops can never get more than READ."""
        if self.kind is LoopKind.VERIFICATION:
            return frozenset({SideEffect.READ})
        if self.allowed_side_effects is None:
            return self.kind.default_side_effects
        return self.allowed_side_effects

    def with_budget(self, budget: Budget) -> LoopSpec:
        return replace(self, budget=budget)

    @cached_property
    def json_form(self) -> Mapping[str, Any]:
        """``to_json()`` computed once: every checkpoint carries the spec. Do not change it."""
        return self.to_json()
