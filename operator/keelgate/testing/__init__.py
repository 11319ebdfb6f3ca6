"""Helpers for testing code built on Keelgate, shipped with it so other packages can use them.

The test hooks: ``failpoint(name)`` marks a crash window in a tool's own body (``mid_tool``),
armed through ``KEELGATE_FAILPOINTS`` or ``armed(...)``; an armed failpoint ends the process
(``os._exit(137)``) or, in ``raise`` mode, raises ``SimulatedCrash``, an in-process stand-in for a
death. ``keelgate.testing.store_contract`` is the store contract suite: the checks every store
backend must pass, runnable against a third-party store; ``keelgate.testing.pgserver`` starts a
real, throw-away PostgreSQL server to run things against. Nothing here may import pytest or a
store backend: a third party's test file imports only what it uses.
"""

from keelgate.core.failpoints import NAMES, armed
from keelgate.core.failpoints import hit as failpoint
from keelgate.errors import SimulatedCrash

__all__ = ["NAMES", "SimulatedCrash", "armed", "failpoint"]
