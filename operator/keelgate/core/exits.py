"""The exit codes of Keelgate's processes: what ``keelgate`` and a step pod (``keelgate step``)
exit with, and so what the operator, the simulator and people's scripts read.

Why it exists: a step pod's exit code is the one word about its step the operator is sure to
get (a pod killed before it printed anything still has one), so the program that writes it
(``keelgate.cli.step``) and those that read it (``keelgate.kube.controller.pod_ends``, the
simulator's step processes, ``kubectl keelgate status``) must read one definition, and so must
``keelgate`` and the scripts around it. An error's code is its class's (the one table in
``keelgate.errors``): the names below read it from there; the codes of an outcome, and of a
process stopped by a signal, are written here. This module must never import anything heavier
than ``keelgate.errors`` at its top: a step pod imports it on its start-up path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keelgate.errors import (
    InputError,
    KeelgateError,
    ModelUnavailable,
    Preempted,
    RunBusy,
    StaleEpoch,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from keelgate.core.types import Outcome

#: A run met its goal; a step ended and its run goes on (or met its goal).
EXIT_OK = 0
#: The run failed (or an error of no more particular kind).
EXIT_FAILED = KeelgateError.exit_code
#: Bad input: one line naming the field or flag.
EXIT_BAD_INPUT = InputError.exit_code
#: A resumable stop (a budget, an outcome unknown, an approval), or a model server that could
#: not be reached: running again is the fix.
EXIT_RESUMABLE = ModelUnavailable.exit_code
#: Another live process drives the run.
EXIT_BUSY = RunBusy.exit_code
#: The store cannot be opened or reached: nothing was read or written.
EXIT_STORE = StoreUnavailable.exit_code
#: The run's ownership moved to another holder (its lease lapsed): this process's writes are
#: refused, and whatever WRITE it left in flight is the new holder's unknown outcome.
EXIT_FENCED = StaleEpoch.exit_code
#: A step asked to stop (SIGTERM: a drain, an eviction) stopped at its next checkpoint.
EXIT_PREEMPTED = Preempted.exit_code
#: Ctrl-C; and SIGTERM while ``keelgate`` drives a run (128 + the signal, as a shell says).
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

#: A step that exits with one of these recorded where its run stands before it exited.
RECORDED = frozenset({EXIT_OK, EXIT_FAILED, EXIT_RESUMABLE})

#: What each code of a step pod means, for a person reading its end (``kubectl keelgate``).
STEP_MEANINGS = {
    EXIT_OK: "the step ended; the run goes on, or met its goal",
    EXIT_FAILED: "the run failed",
    EXIT_BAD_INPUT: "the step refused its input",
    EXIT_RESUMABLE: "a resumable stop",
    EXIT_BUSY: "another process was driving the run",
    EXIT_STORE: "the store could not be reached",
    EXIT_FENCED: "another holder took the run over; this step's writes were refused",
}


def stop_code(outcome: Outcome) -> int:
    """The code of a run that stopped: resumable, or failed."""
    return EXIT_RESUMABLE if outcome.resumable else EXIT_FAILED


def run_exit_code(outcome: Outcome) -> int:
    """The code ``keelgate`` exits with for a run that came to ``outcome``."""
    from keelgate.core.types import RunPhase

    return EXIT_OK if outcome.phase is RunPhase.SUCCEEDED else stop_code(outcome)


def exit_code(outcome: Outcome, *, asked: bool) -> int:
    """The code a step that came to ``outcome`` exits with (``asked``: it was asked to stop),
    which the operator reads (``keelgate.kube.controller.pod_ends``)."""
    from keelgate.core.types import RunPhase

    if outcome.phase is RunPhase.RUNNING and asked:
        return EXIT_PREEMPTED
    if outcome.phase in (RunPhase.RUNNING, RunPhase.SUCCEEDED):
        return EXIT_OK
    return stop_code(outcome)
