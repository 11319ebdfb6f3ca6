"""Runners: drive a serialisable LoopSpec to its next stop (the core ``LoopRunner`` protocol).

``local`` runs in this process; the step runner (one step in a pod) and a Temporal runner build
their loops the same way, through ``build``. Runners sit above stores and adapters and below the
CLI: nothing under ``keelgate.core`` may import them.
"""

from keelgate.runners.build import MODEL_BUILDERS, TOOL_BUILDERS, Parts, build_loop, build_parts
from keelgate.runners.local import LocalRunner
from keelgate.runners.step import StepRunner

__all__ = [
    "MODEL_BUILDERS",
    "TOOL_BUILDERS",
    "LocalRunner",
    "Parts",
    "StepRunner",
    "build_loop",
    "build_parts",
]
