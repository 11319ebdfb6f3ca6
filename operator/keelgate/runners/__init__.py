"""Runners: drive a serialisable LoopSpec to its next stop (the core ``LoopRunner`` protocol).

``local`` runs in this process; the step runner (one step in a pod) and a Temporal runner build
their loops the same way, through ``build``. Runners sit above stores and adapters and below the
CLI: nothing under ``keelgate.core`` may import them.

The names below are re-exported lazily: a step pod imports ``keelgate.runners.step`` and must
not pay here for the manifest, the adapters and the loop before it has read its checkpoint (the
step runner imports them when it builds a loop).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

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
    "MODEL_BUILDERS": "keelgate.runners.build",
    "TOOL_BUILDERS": "keelgate.runners.build",
    "Parts": "keelgate.runners.build",
    "build_loop": "keelgate.runners.build",
    "build_parts": "keelgate.runners.build",
    "LocalRunner": "keelgate.runners.local",
    "StepRunner": "keelgate.runners.step",
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


def __getattr__(name: str) -> Any:
    """Import a name's module on first use, and keep the name here from then on."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'keelgate.runners' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
