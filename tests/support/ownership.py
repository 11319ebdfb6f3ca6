"""A holder driving one run through the store's ownership, as the operator and its step
processes do: take the run, claim each step's WRITE from the checkpoint it was planned at, send
it (one line in a fsynced journal: the downstream world's own book), record its result with the
next checkpoint, renew the lease. Crash windows around taking, renewing and losing ownership are
named here (``WINDOWS``); at one, a test makes the holder die (``SimulatedCrash``, or
``os._exit(137)`` when run as a process: ``python -m support.ownership``) or pause (a callback
that lets the lease lapse and another holder drive meanwhile).

It must never send a step whose key the store did not give it, never settle a key itself, and
never catch ``StaleEpoch``: a holder refused for its epoch stops there, as a real one must.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crashkit.world import Journal
from keelgate.core import fence
from keelgate.core.protocols import Completion, Ownership, Stores
from keelgate.core.types import KeyState
from keelgate.errors import SimulatedCrash
from keelgate.testing.deadlines import pass_deadlines

TENANT, RUN = "acme", "payouts"
STEPS = 3
LEASE = 30.0
#: A step's time limit: the holder's own deadline to start sending is this long after it
#: claimed (on its own clock, taken before the claim), the store's 5 s later.
CALL_SECONDS = 60.0
#: Where a holder may die or be held up, in the order one step passes them.
WINDOWS = ("after_take", "after_claim", "after_send", "after_commit", "after_renew")

Opener = Callable[[], Stores]


@dataclass
class Windows:
    """What happens at the ``occurrence``-th pass of ``window``: ``act`` (None: a crash)."""

    window: str = ""
    occurrence: int = 0
    act: Callable[[], None] | None = None
    seen: Counter[str] = field(default_factory=Counter)

    def hit(self, name: str) -> None:
        self.seen[name] += 1
        if name != self.window or self.seen[name] != self.occurrence:
            return
        if self.act is not None:
            self.act()
            return
        raise SimulatedCrash(name, self.occurrence)


def step_key(step: int, attempt: int) -> str:
    return f"{RUN}-step{step}-attempt{attempt}"


class Holder:
    """One life of a holder: its store, its ownership, its run of the steps."""

    def __init__(
        self, opener: Opener, name: str, journal: Journal, windows: Windows | None = None
    ) -> None:
        self.stores = opener()
        self.store: Any = self.stores.checkpoints
        self.name = name
        self.journal = journal
        self.windows = windows or Windows()
        self.ownership: Ownership | None = None
        self.takes = 0  # each drive takes the run again, under a new epoch
        # How long this holder's process has been frozen (a pause counts on its own clock,
        # CLOCK_BOOTTIME, as ``keelgate.core.fence`` reads it).
        self.frozen_for = 0.0

    def drive(self) -> str:
        """Take the run and drive it until it is done ("done") or meets an unknown outcome
        ("unknown"). ``RunBusy`` while another's lease is live; ``StaleEpoch`` once the run
        was taken from it."""
        self.ownership = self.store.take(TENANT, RUN, holder=self.name, lease=LEASE)
        self.takes += 1
        self.windows.hit("after_take")
        if self.store.load(TENANT, RUN) is None:
            self.store.save(TENANT, RUN, 1, {"done": 0, "attempt": 1})
        while True:
            checkpoint = self.store.load(TENANT, RUN)
            seq, done, attempt = (
                checkpoint.seq,
                checkpoint.state["done"],
                checkpoint.state["attempt"],
            )
            if done == STEPS:
                return "done"
            step, key = done + 1, step_key(done + 1, attempt)
            send_by = fence.now() + CALL_SECONDS  # taken before the claim, as the gateway does
            found = self.store.claim(
                TENANT,
                key,
                run=RUN,
                action=f"step{step}",
                tool="payout",
                after=seq,
                deadline_in=CALL_SECONDS + 5,
            )
            if found is None:
                self.windows.hit("after_claim")
                if fence.now() + self.frozen_for >= send_by:
                    # Held up past its own deadline: it never starts sending, and its key's
                    # end is recorded as unknown (refused, if the run was taken meanwhile).
                    self.store.release(TENANT, key)
                    return "unknown"
                self.journal.record("sent", key=key, step=step, holder=self.name)
                self.windows.hit("after_send")
                result = {"status": "ok", "output": {"step": step}}
                state = {"done": step, "attempt": 1}
                self.store.save_completing(
                    TENANT, RUN, seq + 1, state, [], [Completion(key, result)]
                )
            elif found.state is KeyState.COMPLETED:
                self.store.save(TENANT, RUN, seq + 1, {"done": step, "attempt": 1})
            elif found.state is KeyState.ABANDONED:  # truthfully not executed: a new attempt
                self.store.save(TENANT, RUN, seq + 1, {"done": done, "attempt": attempt + 1})
            else:
                assert found.state is KeyState.OUTCOME_UNKNOWN, found
                return "unknown"
            self.windows.hit("after_commit")
            self.ownership = self.store.renew(self.ownership, lease=LEASE)
            self.windows.hit("after_renew")

    def die(self) -> None:
        """A process death: the store closed, its lease left to lapse."""
        self.stores.close()


def settle_truthfully(store: Any, journal: Journal) -> int:
    """Settle every unknown step key as the journal says it went; how many were settled."""
    sent = {entry["key"] for entry in journal.entries("sent")}
    settled = 0
    for step in range(1, STEPS + 1):
        for attempt in range(1, 10):
            record = store.get(TENANT, step_key(step, attempt))
            if record is None or record.state is not KeyState.OUTCOME_UNKNOWN:
                continue
            executed = record.key in sent
            if not executed:
                pass_deadlines(store, TENANT)
            store.settle(TENANT, record.key, executed=executed, by="oncall", source="human")
            settled += 1
    return settled


def sends(journal: Journal) -> Counter[int]:
    """How many times each step was sent downstream."""
    return Counter(int(entry["step"]) for entry in journal.entries("sent"))


def assert_each_step_sent_once(journal: Journal, store: Any) -> None:
    """The promise: every step sent exactly once, and the run at its end."""
    assert sends(journal) == Counter(range(1, STEPS + 1)), journal.entries("sent")
    keys = Counter(entry["key"] for entry in journal.entries("sent"))
    assert all(count == 1 for count in keys.values()), keys
    checkpoint = store.load(TENANT, RUN)
    assert checkpoint is not None and checkpoint.state["done"] == STEPS


def main(argv: list[str]) -> int:
    """A holder as a process: ``URL NAME JOURNAL WINDOW OCCURRENCE``; it dies by
    ``os._exit(137)`` at that window's pass (nothing flushed, nothing closed)."""
    from keelgate.stores import open_stores

    url, name, journal, window, occurrence = argv
    windows = Windows(window, int(occurrence), act=lambda: os._exit(137))
    outcome = Holder(lambda: open_stores(url), name, Journal(journal), windows).drive()
    print(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
