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
from typing import Any

from keelgate.core.types import LoopKind, SideEffect, Usage

# The largest integer an API server field holds (int64): manifests and CLI flags stop there.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Budget:
    """Limits of a run. ``None`` means unlimited. Raising a limit and resuming continues the run."""

    max_iterations: int | None = None
    tokens: int | None = None
    dollars: Decimal | None = None
    timeout_seconds: float | None = None
    max_verifier_rejections: int | None = 3

    def raised(self, **totals: Any) -> Budget:
        """A copy with the named limits set to new totals (unset names are kept)."""
        return replace(self, **{k: v for k, v in totals.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        return {
            "maxIterations": self.max_iterations,
            "tokens": self.tokens,
            "dollars": None if self.dollars is None else str(self.dollars),
            "timeoutSeconds": self.timeout_seconds,
            "maxVerifierRejections": self.max_verifier_rejections,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Budget:
        dollars = data.get("dollars")
        return cls(
            max_iterations=data.get("maxIterations"),
            tokens=data.get("tokens"),
            dollars=None if dollars is None else Decimal(str(dollars)),
            timeout_seconds=data.get("timeoutSeconds"),
            max_verifier_rejections=data.get("maxVerifierRejections"),
        )


@dataclass(frozen=True)
class Price:
    """Dollars per million tokens. Keelgate ships no prices: a user states them."""

    input_per_million: Decimal
    output_per_million: Decimal

    def cost(self, usage: Usage) -> Decimal:
        return (
            self.input_per_million * usage.input_tokens
            + self.output_per_million * usage.output_tokens
        ) / Decimal(1_000_000)

    def to_json(self) -> dict[str, str]:
        return {
            "inputPerMillionTokens": str(self.input_per_million),
            "outputPerMillionTokens": str(self.output_per_million),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Price:
        return cls(
            Decimal(str(data["inputPerMillionTokens"])),
            Decimal(str(data["outputPerMillionTokens"])),
        )


@dataclass(frozen=True)
class LoopSpec:
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
    allowed_side_effects: frozenset[SideEffect] | None = None
    manifest: Mapping[str, Any] | None = None
    source_dir: str = ""  # where a manifest's Python code imports from (the CLI's `run -f`)

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

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "run": self.run,
            "goal": self.goal,
            "kind": self.kind.value,
            "budget": self.budget.to_json(),
            "allowedSideEffects": None
            if self.allowed_side_effects is None
            else sorted(s.value for s in self.allowed_side_effects),
            "manifest": None if self.manifest is None else dict(self.manifest),
            **({"sourceDir": self.source_dir} if self.source_dir else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoopSpec:
        allowed = data.get("allowedSideEffects")
        manifest = data.get("manifest")
        return cls(
            tenant=str(data["tenant"]),
            run=str(data["run"]),
            goal=str(data["goal"]),
            kind=LoopKind(data.get("kind", "task")),
            budget=Budget.from_json(data.get("budget") or {}),
            allowed_side_effects=None
            if allowed is None
            else frozenset(SideEffect(s) for s in allowed),
            manifest=None if manifest is None else dict(manifest),
            source_dir=str(data.get("sourceDir", "")),
        )
