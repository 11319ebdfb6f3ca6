"""What a run may still spend: limits already crossed, calls refused before they are made, and
the price of each model call.

Why it exists: every budget is checked at the same few moments (before each model call, before
each action), and a stop for one must leave the run resumable with a larger budget. This module
only judges; the loop stops. It must never let an action run once a limit is crossed, nor make a
model call whose input alone would cross the token or dollar budget.
"""

from __future__ import annotations

from collections.abc import Callable

from keelgate.core.model import Model, ModelRequest, estimate_input_tokens
from keelgate.core.spec import Budget, Price
from keelgate.core.state import RunState
from keelgate.core.types import StopReason, Usage


class Budgets:
    """One session's budget judge. ``active`` gives a state's active seconds as of now."""

    def __init__(
        self,
        budget: Budget,
        *,
        active: Callable[[RunState], float],
        model: Model | None = None,
        price: Price | None = None,
        price_model: str | None = None,
    ) -> None:
        self.budget = budget
        self.active = active
        self.model = model
        self.price = price
        self.price_model = price_model

    def spent(self, state: RunState) -> tuple[StopReason, str] | None:
        """A limit already crossed: nothing further may be acted on."""
        budget = self.budget
        if budget.timeout_seconds is not None and self.active(state) > budget.timeout_seconds:
            return StopReason.TIMEOUT, f"active time passed {budget.timeout_seconds}s"
        if budget.tokens is not None and state.usage.tokens > budget.tokens:
            return StopReason.TOKEN_BUDGET, (f"used {state.usage.tokens} of {budget.tokens} tokens")
        if budget.dollars is not None and state.usage.dollars > budget.dollars:
            return StopReason.DOLLAR_BUDGET, (f"spent ${state.usage.dollars} of ${budget.dollars}")
        return None

    def refusal(self, state: RunState, request: ModelRequest) -> tuple[StopReason, str] | None:
        """Before a model call: a spent budget, an unknown price, or an input that would cross."""
        budget = self.budget
        if budget.dollars is not None and self.price is None:
            name = self.price_model or getattr(self.model, "name", "?")
            return StopReason.COST_UNKNOWN, (
                f"a dollar budget is set but the price of model {name!r} is unknown"
            )
        spent = self.spent(state)
        if spent is not None:
            return spent
        if budget.tokens is None and budget.dollars is None:
            return None  # no budget to hold an estimate against: skip serialising the request
        # A provider that knows its own wire format may estimate better than the neutral guess.
        estimator = getattr(self.model, "estimate_input_tokens", estimate_input_tokens)
        try:
            estimate = int(estimator(request))
        except Exception:  # a provider's own estimate failing must not stop the run
            estimate = estimate_input_tokens(request)
        if budget.tokens is not None and state.usage.tokens + estimate > budget.tokens:
            return StopReason.TOKEN_BUDGET, (
                f"the next call's input alone (~{estimate} tokens) would pass the budget "
                f"({state.usage.tokens} of {budget.tokens} used)"
            )
        if budget.dollars is not None and self.price is not None:
            cost = self.price.cost(Usage(input_tokens=estimate))
            if state.usage.dollars + cost > budget.dollars:
                return StopReason.DOLLAR_BUDGET, (
                    f"the next call's input alone (~${cost:.6f}) would pass the budget "
                    f"(${state.usage.dollars} of ${budget.dollars} spent)"
                )
        return None

    def charge(self, usage: Usage) -> Usage:
        if self.price is None:
            return usage
        return Usage(usage.input_tokens, usage.output_tokens, self.price.cost(usage))
