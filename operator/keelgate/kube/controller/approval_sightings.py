"""What this operator has seen of Approvals it could not record yet: when each entry was first
seen, and since when each object's looks have found the store out of reach.

Why it exists: an entry's moment counts from the earliest it is known to have been there, and
the operator learns that moment before it can record the entry (the run between stops, the
store away); a decision it cannot record is shown so once the store has been away longer than
a blip. Both are memories of this process alone (lost with it: a new operator dates an entry
from its own first look, the object's last write and the moment the entry states). It must
never date an entry later than its first sight or the object's last write, and never forget a
first sight before the entry is on record.
"""

from __future__ import annotations

from collections.abc import Callable

from keelgate.core import clocks


class Sightings:
    """``clock``: the wall clock entries are dated on (POSIX seconds)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # Each entry's ref -> when it was first seen, at the latest (wall seconds).
        self._first: dict[str, float] = {}
        # Each object (namespace, name) -> since when its looks found the store away (boot).
        self._away: dict[tuple[str, str], float] = {}

    def seen(self, ref: str, written: float | None) -> float:
        """When the entry ``ref`` was made, at the latest: first seen, and no later than the
        object's last write as of that first look (an entry seen late, the operator down or
        behind, counts from the write, not the look). Kept from the first look: a later write
        of the object (another entry added while this one was refused) never dates it afresh."""
        seen = self._clock()
        if written is not None:
            seen = min(seen, written)
        first = self._first.setdefault(ref, seen)
        return first if written is None else min(first, written)

    def recorded(self, ref: str) -> None:
        """The entry is on record: its moment is the store's from now on."""
        self._first.pop(ref, None)

    def store_away(self, namespace: str, name: str) -> float:
        """A look at the object found the store away: since when its looks have (boot)."""
        return self._away.setdefault((namespace, name), clocks.boot())

    def store_reached(self, namespace: str, name: str) -> None:
        """A look at the object reached the store (or the object is gone)."""
        self._away.pop((namespace, name), None)
