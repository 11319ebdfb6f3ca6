"""The ``python`` tool: a user's function ``fn(args: dict, *, idempotency_key: str | None)``.

A WRITE or PROPOSE gets its idempotency key as a keyword argument so the function can pass it to
the system it changes. A timeout, when set, is enforced from a watcher thread: the call's outcome
is then unknown (the function may still be running), never retried. The function signals a
definite failure by raising ``keelgate.ToolError``.
"""

from __future__ import annotations

import threading
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
        # A daemon thread, not an executor: a hung tool must not hold the process open at exit.
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["result"] = self.function(dict(args), idempotency_key=idempotency_key)
            except BaseException as error:
                box["error"] = error

        worker = threading.Thread(target=call, name=f"tool-{self.name}", daemon=True)
        worker.start()
        worker.join(self.timeout_seconds)
        if worker.is_alive():
            raise OutcomeUncertain(f"{self.name} did not return within {self.timeout_seconds}s")
        if "error" in box:
            raise box["error"]
        return box.get("result")
