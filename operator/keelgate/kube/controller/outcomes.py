"""What a reconcile decides, as values: what a run needs next, and when to look at a key again.

Why it exists: a decision that travels as a string (``"stalled: why"``) or a sentinel (``-1.0``
for a lost race) can be misread without any tool noticing; these types cannot. ``Step``,
``Stall`` and ``Rest`` answer "what does this run need next?"; ``Requeue`` and ``Rest`` answer
the work queue's "when do I bring this key back?". This module must never hold logic: values
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Step:
    """A step pod should run next."""


@dataclass(frozen=True)
class Stall:
    """No step pod may run until the spec changes; ``reason`` says why (status, Events)."""

    reason: str


@dataclass(frozen=True)
class Rest:
    """Nothing to do until something changes: a watch event or a resync brings the key back
    (for a run: finished, or waiting for a person)."""


@dataclass(frozen=True)
class Requeue:
    """Look at the key again after ``after`` seconds (0: at once, e.g. after a lost race)."""

    after: float = 0.0


#: What a run needs next.
NextStep: TypeAlias = Step | Stall | Rest
#: What a reconcile tells the work queue.
Result: TypeAlias = Requeue | Rest

REST = Rest()
STEP = Step()
#: A status patch lost a race with another writer (409, or the object is gone): look again.
LOST_RACE = Requeue(0.0)
