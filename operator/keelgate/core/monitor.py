"""Monitor loops: the pure helpers behind "each tick is its own run ``<name>.tick-<n>``".

A monitor is a scheduled, READ-only-by-default loop. Every tick is a separate run with its own
checkpoint, idempotency keys and audit chain, so one tick's state can never leak into the next.
This module only names ticks, reads tick numbers back from run names and computes when the next
tick is due from a cron ``schedule``; it never runs anything, sleeps or touches a store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from keelgate.errors import InputError

TICK_SEPARATOR = ".tick-"

# Kubernetes CronJob's dialect: five fields, or one of the @-macros. croniter also takes seconds
# and year fields, but a schedule the operator would read differently must be refused here.
_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_TICK = re.compile(r"^(?P<base>.+)\.tick-(?P<n>[1-9][0-9]*)$")


def tick_run_name(base: str, number: int) -> str:
    """The run name of tick ``number`` (1-based) of the monitor ``base``."""
    if number < 1:
        raise ValueError(f"tick numbers start at 1, not {number}")
    return f"{base}{TICK_SEPARATOR}{number}"


def tick_number(base: str, run: str) -> int | None:
    """The tick number if ``run`` is a tick of the monitor ``base``, else None.

    Ticks of another monitor whose name merely starts with ``base`` are not ticks of ``base``:
    ``shop.tick-1`` is not a tick of ``sho``, and ``a.tick-1.tick-2`` is a tick of
    ``a.tick-1`` only.
    """
    match = _TICK.match(run)
    if match is None or match.group("base") != base:
        return None
    return int(match.group("n"))


def is_tick(run: str) -> bool:
    """Whether ``run`` is named like a tick of some monitor."""
    return _TICK.match(run) is not None


def latest_tick(base: str, runs: Iterable[str]) -> int:
    """The highest tick number of ``base`` among ``runs``; 0 when it has none yet."""
    return max((n for n in (tick_number(base, r) for r in runs) if n is not None), default=0)


def validate_schedule(schedule: str, *, field: str = "spec.schedule") -> str:
    """Return ``schedule`` stripped if it is a cron expression the operator accepts.

    Five fields (minute hour day-of-month month day-of-week) or an @-macro such as ``@hourly``;
    times are UTC. Anything else is an ``InputError`` naming ``field``.
    """
    text = " ".join(schedule.split())
    if not text:
        raise InputError(field, "a cron schedule is required, e.g. '*/15 * * * *'")
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            known = ", ".join(sorted(_MACROS))
            raise InputError(field, f"unknown cron macro {text!r} (known: {known})")
        return text
    parts = text.split(" ")
    if len(parts) != 5:
        raise InputError(
            field,
            f"{text!r} has {len(parts)} field(s); a cron schedule has 5 "
            "(minute hour day-of-month month day-of-week)",
        )
    from croniter import CroniterError, croniter  # only schedules need it: keep runs' start fast

    if not croniter.is_valid(text):
        raise InputError(field, f"{text!r} is not a valid cron expression")
    try:
        # A valid expression may still name a day that never comes (30 February).
        croniter(text, _EPOCH).get_next(datetime)
    except CroniterError:
        raise InputError(field, f"{text!r} never fires") from None
    return text


def next_due(schedule: str, *, after: datetime, field: str = "spec.schedule") -> datetime:
    """The first time strictly after ``after`` at which ``schedule`` fires, in UTC.

    A naive ``after`` is read as UTC, so the answer never depends on the machine's time zone.
    """
    from croniter import croniter

    text = validate_schedule(schedule, field=field)
    start = _utc(after)
    due: datetime = croniter(text.lower() if text.startswith("@") else text, start).get_next(
        datetime
    )
    return due.astimezone(UTC)


def is_due(schedule: str, *, since: datetime, now: datetime, field: str = "spec.schedule") -> bool:
    """Whether a tick is due at ``now``: a slot of ``schedule`` fell after ``since`` (the last
    tick's start, or the monitor's creation for its first tick) and at or before ``now``."""
    return next_due(schedule, after=since, field=field) <= _utc(now)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
