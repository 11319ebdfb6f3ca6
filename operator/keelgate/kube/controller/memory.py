"""What the controller remembers of runs between reconciles: in memory only, under one lock.

Why it exists: a few small facts save work or words, and none decides anything. When a run's last
step pod ended (the hand-off time of ``keelgate_step_handoff_seconds``); a clean end not yet told in
an Event (told with what comes next: one Event, one API write, for both); and the spec each run's
step pods were last given, as recorded in the store (so it is not recorded again at every step); and
how many times in a row the API server refused its step pod, with the last refusal (the back-off and
the Stalled condition grow from it); and how far each run's audit chain is known to be signed (so a
stopped run's chain is not read again). Losing all of it (a restart) costs a sample, an Event's
detail, one more spec record and a refusal count started again: the pod and ``status.step.lastExit``
keep every fact. Reconciles of different runs run in different threads at once; this object owns
these facts, under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from keelgate.kube.controller.ports import Key

#: The spec a run's pods were given: (the run's uid, its generation, the spec document).
RecordedSpec = tuple[str, int, Mapping[str, Any]]


class RunMemory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended_at: dict[Key, float] = {}
        self._untold: dict[Key, str] = {}
        self._specs: dict[Key, RecordedSpec] = {}
        self._refusals: dict[Key, tuple[int, str]] = {}
        self._signed: dict[Key, int] = {}
        self._collected: dict[Key, set[str]] = {}

    def step_ended(self, key: Key, *, at: float, untold: str | None) -> None:
        """``key``'s step pod was seen ended at ``at``; ``untold`` is its clean end in words,
        to tell with what comes next (None: it was told already, or the end was not clean, and
        then the spec is recorded again for the next pod: the pod may have found none)."""
        with self._lock:
            self._ended_at[key] = at
            if untold is not None:
                self._untold[key] = untold
            else:
                self._specs.pop(key, None)

    def take_ended_at(self, key: Key) -> float | None:
        with self._lock:
            return self._ended_at.pop(key, None)

    def take_untold(self, key: Key) -> str | None:
        with self._lock:
            return self._untold.pop(key, None)

    def spec_recorded(self, key: Key, spec: RecordedSpec) -> bool:
        with self._lock:
            return self._specs.get(key) == spec

    def remember_spec(self, key: Key, spec: RecordedSpec) -> None:
        with self._lock:
            self._specs[key] = spec

    def create_refused(self, key: Key, message: str) -> tuple[int, bool]:
        """The API server refused ``key``'s step pod: the refusals in a row so far, and whether
        this refusal says something the last one did not."""
        with self._lock:
            count, last = self._refusals.get(key, (0, ""))
            self._refusals[key] = (count + 1, message)
            return count + 1, message != last

    def create_succeeded(self, key: Key) -> bool:
        """``key``'s step pod was created: whether refusals came before it."""
        with self._lock:
            return self._refusals.pop(key, None) is not None

    def signed_up_to(self, key: Key) -> int:
        """The last event of ``key``'s chain this operator saw signed (0: none yet)."""
        with self._lock:
            return self._signed.get(key, 0)

    def signed(self, key: Key, seq: int) -> None:
        with self._lock:
            self._signed[key] = max(seq, self._signed.get(key, 0))

    def collecting(self, key: Key, pod_uid: str) -> bool:
        """Whether to ask for ``key``'s finished pod ``pod_uid`` to be deleted: once per pod
        (the watch may not yet show it going). The run keeps the last few uids asked."""
        with self._lock:
            asked = self._collected.setdefault(key, set())
            if pod_uid in asked:
                return False
            if len(asked) >= 64:
                asked.clear()  # old pods long gone; a repeat ask is harmless (404)
            asked.add(pod_uid)
            return True

    def forget(self, key: Key) -> None:
        """The run is gone."""
        with self._lock:
            self._ended_at.pop(key, None)
            self._untold.pop(key, None)
            self._specs.pop(key, None)
            self._refusals.pop(key, None)
            self._signed.pop(key, None)
            self._collected.pop(key, None)
