"""The ``python`` tool: a user's function ``fn(args: dict, *, idempotency_key: str | None)``.

A WRITE or PROPOSE gets its idempotency key as a keyword argument so the function can pass it to
the system it changes. A timeout, when set, is enforced from a watcher thread: the call's outcome
is then unknown (the function may still be running), never retried. The function signals a
definite failure by raising ``keelgate.ToolError``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keelgate.core.types import SideEffect
from keelgate.errors import OutcomeUncertain

ToolFunction = Callable[..., Any]


@dataclass
class PythonTool:
    name: str
    function: ToolFunction
    side_effect: SideEffect = SideEffect.READ
    requires_approval: bool = False
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    timeout_seconds: float | None = None

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        if self.timeout_seconds is None:
            return self.function(dict(args), idempotency_key=idempotency_key)
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tool-{self.name}"
        )
        future = pool.submit(self.function, dict(args), idempotency_key=idempotency_key)
        try:
            return future.result(timeout=self.timeout_seconds)
        except concurrent.futures.TimeoutError:
            raise OutcomeUncertain(
                f"{self.name} did not return within {self.timeout_seconds}s"
            ) from None
        finally:
            pool.shutdown(wait=False)
