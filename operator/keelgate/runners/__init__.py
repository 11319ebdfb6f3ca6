"""Runners: drive a serialisable LoopSpec to its next stop (the core ``LoopRunner`` protocol).

``local`` runs in this process; the step runner (one step in a pod) and a Temporal runner build
their loops the same way, through ``build``. Runners sit above stores and adapters and below the
CLI: nothing under ``keelgate.core`` may import them.

The names below are re-exported lazily: a step pod imports ``keelgate.runners.step`` and must
not pay here for the manifest, the adapters and the loop before it has read its checkpoint (the
step runner imports them when it builds a loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keelgate._lazy import lazy_exports

if TYPE_CHECKING:
    from keelgate.runners.build import (
        MODEL_BUILDERS,
        TOOL_BUILDERS,
        Parts,
        build_loop,
        build_parts,
    )
    from keelgate.runners.local import LocalRunner
    from keelgate.runners.step import StepRunner

_WHERE = {
    "MODEL_BUILDERS": ("keelgate.runners.build", "MODEL_BUILDERS"),
    "TOOL_BUILDERS": ("keelgate.runners.build", "TOOL_BUILDERS"),
    "Parts": ("keelgate.runners.build", "Parts"),
    "build_loop": ("keelgate.runners.build", "build_loop"),
    "build_parts": ("keelgate.runners.build", "build_parts"),
    "LocalRunner": ("keelgate.runners.local", "LocalRunner"),
    "StepRunner": ("keelgate.runners.step", "StepRunner"),
}

__all__ = [
    "MODEL_BUILDERS",
    "TOOL_BUILDERS",
    "LocalRunner",
    "Parts",
    "StepRunner",
    "build_loop",
    "build_parts",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _WHERE, __all__)
