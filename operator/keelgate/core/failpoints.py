"""Named crash windows: where tests (and chaos drills) make the process die.

Armed in-process by tests (``armed(...)``) or from outside by ``KEELGATE_FAILPOINTS`` (read once,
at import), e.g. ``after_gateway_call@1,after_observe@2``. An armed failpoint ends the process
with ``os._exit(137)`` (nothing flushed), or, in ``raise`` mode, raises ``SimulatedCrash`` for
in-process restarts. A simulation (``keelgate.testing.sim``) may instead be told of every window
passed (``observed``): it decides there, from its seed, whether the process dies or is held up.
When nothing is armed or observed, ``hit`` is one dict lookup and one test: it must stay that
cheap, and it must never do anything but count, crash, or tell the observer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Literal

from keelgate.errors import InputError, SimulatedCrash

NAMES = (
    "after_plan",
    "before_action",
    "after_gateway_call",
    "after_action_checkpoint",
    "after_observe",
    "after_verify",
    "mid_tool",
    # A person's reconcile or the confirmer settled an unknown outcome's key; the confirmer's
    # loop.reconciled event is not written yet (the next resume writes it from the key), nor a
    # person's where the stores cannot settle with the event (``settle_with_event``).
    "after_settle",
)

ENV = "KEELGATE_FAILPOINTS"
Mode = Literal["exit", "raise"]

_lock = threading.Lock()
_armed: dict[str, int] = {}
_seen: dict[str, int] = {}
_mode: Mode = "exit"
#: Told of every window passed, before any armed crash (``observed``).
_observer: Callable[[str], None] | None = None


def parse(text: str) -> dict[str, int]:
    """Parse ``NAME@N,NAME`` into {name: occurrence}; a bad entry is an InputError."""
    armed: dict[str, int] = {}
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, _, count = entry.partition("@")
        name = name.strip()
        if name not in NAMES:
            raise InputError(ENV, f"unknown failpoint {name!r} (known: {', '.join(NAMES)})")
        try:
            occurrence = int(count) if count else 1
        except ValueError:
            raise InputError(ENV, f"{entry!r}: occurrence must be a whole number") from None
        if occurrence < 1:
            raise InputError(ENV, f"{entry!r}: occurrence must be 1 or more")
        armed[name] = occurrence
    return armed


def arm(points: Mapping[str, int], *, mode: Mode = "exit") -> None:
    """Arm failpoints for this process, resetting all counters."""
    global _mode
    for name in points:
        if name not in NAMES:
            raise InputError("failpoint", f"unknown failpoint {name!r}")
    with _lock:
        _armed.clear()
        _armed.update(points)
        _seen.clear()
        _mode = mode


def disarm() -> None:
    arm({})


@contextmanager
def armed(points: Mapping[str, int], *, mode: Mode = "raise") -> Iterator[None]:
    """Arm failpoints for the duration of a block (tests use ``raise`` mode)."""
    arm(points, mode=mode)
    try:
        yield
    finally:
        disarm()


@contextmanager
def observed(observer: Callable[[str], None]) -> Iterator[None]:
    """Tell ``observer`` the name of every window passed during the block. It may raise
    ``SimulatedCrash`` (the process dies there) or return (after holding the process up, on a
    simulation's virtual time); nothing else is done for it."""
    global _observer
    saved, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = saved


def hit(name: str) -> None:
    """Pass a crash window: die here if this is the armed occurrence."""
    if _observer is not None:
        _observer(name)
    if name not in _armed:
        return
    with _lock:
        count = _seen.get(name, 0) + 1
        _seen[name] = count
        fire = count == _armed.get(name)
        mode = _mode
    if fire:
        if mode == "exit":
            os._exit(137)
        raise SimulatedCrash(name, count)


def _arm_from_environment() -> InputError | None:
    """Arm from the environment; a bad value is kept for the CLI to report, not raised at import."""
    text = os.environ.get(ENV, "")
    if not text.strip():
        return None
    try:
        arm(parse(text), mode="exit")
    except InputError as error:
        return error
    return None


environment_error = _arm_from_environment()
