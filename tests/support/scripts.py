"""The repository's scripts (deploy/argocd/argocd_cm.py, deploy/krew/package.py) as modules.

Why it exists: those are programs run by path, not parts of a package, yet their tests call
their functions; this loads one by its path, once per test session. It must never run a
script's main.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The script at ``ROOT/relative`` imported as a module (kept in sys.modules, where its
    dataclasses look themselves up)."""
    name = "script_" + relative.replace("/", "_").removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
