"""Times as the Kubernetes API writes them (metav1.Time: ``2026-12-04T10:00:00Z``), both ways.

Why it exists: status, step records, schedules and pod ends all read and write these, and one
format everywhere keeps a status patch from differing only in how a time is spelled. Pure: it
never reads anything but the clock it is given.
"""

from __future__ import annotations

import datetime as dt

from keelgate.core import clocks


def iso(moment: dt.datetime) -> str:
    """``moment`` as a metav1.Time (UTC, whole seconds)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp(seconds: float) -> str:
    """A POSIX time (``time.time()``) as a metav1.Time."""
    return iso(dt.datetime.fromtimestamp(seconds, dt.UTC))


def now() -> str:
    """The current time as a metav1.Time (``keelgate.core.clocks``' wall clock)."""
    return stamp(clocks.wall())


def parse_time(text: str | None) -> dt.datetime | None:
    """A metav1.Time (or any ISO 8601 time) read back; None when absent or unreadable."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
