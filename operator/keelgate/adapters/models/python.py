"""The ``python`` provider: a user's function ``fn(request: dict) -> dict`` is the model.

The request holds ``phase`` (plan or verify), ``goal``, ``iteration``, ``call``, ``history`` and
``tools``; the reply has the shape of a script entry, or ``{"verdict", "reason"}`` when verifying.
The function may answer differently each time: the loop never lets a second answer replace a
saved plan. This adapter must never catch a ``SimulatedCrash`` or retry the function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from keelgate.core.model import ModelReply, ModelRequest, reply_from_mapping

ModelFunction = Callable[[dict[str, Any]], Mapping[str, Any]]


class PythonModel:
    provider = "keelgate.python"  # gen_ai.provider.name

    def __init__(self, function: ModelFunction, *, name: str = "python") -> None:
        self.function = function
        self.name = name

    def call(self, request: ModelRequest) -> ModelReply:
        return reply_from_mapping(self.function(request.to_json()), phase=request.phase)
