"""Monitor helpers: tick run names, reading tick numbers back, and when the next tick is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from keelgate.core.monitor import (
    is_due,
    is_tick,
    latest_tick,
    next_due,
    tick_number,
    tick_run_name,
    validate_schedule,
)
from keelgate.errors import InputError


def test_a_tick_is_named_after_its_monitor_and_read_back() -> None:
    """Tick n of ``restock`` is the run ``restock.tick-n``, and that name reads back as n."""
    for number in (1, 2, 10, 12345):
        name = tick_run_name("restock", number)
        assert name == f"restock.tick-{number}"
        assert tick_number("restock", name) == number
        assert is_tick(name)
    with pytest.raises(ValueError):
        tick_run_name("restock", 0)


@pytest.mark.parametrize(
    ("base", "run"),
    [
        ("sho", "shop.tick-1"),  # another monitor whose name starts the same
        ("restock", "restock"),  # the monitor itself
        ("restock", "restock.tick-0"),  # ticks start at 1
        ("restock", "restock.tick-01"),  # never written with a leading zero
        ("restock", "restock.tick-x"),
        ("restock", "restock.tick-1.tick-2"),  # a tick of the monitor "restock.tick-1"
        ("restock", "other.tick-3"),
    ],
)
def test_runs_that_are_not_ticks_of_a_monitor_are_not_counted(base: str, run: str) -> None:
    """Only ``<base>.tick-<n>`` with n >= 1 is a tick of ``base``; look-alikes are not."""
    assert tick_number(base, run) is None


def test_the_latest_tick_is_the_highest_number_even_with_gaps() -> None:
    """The next tick is one past the highest stored tick, whatever else the store holds."""
    runs = ["restock.tick-1", "restock.tick-3", "restock", "shop.tick-9", "restock.tick-2"]
    assert latest_tick("restock", runs) == 3
    assert latest_tick("restock", ["restock.tick-10", "restock.tick-9"]) == 10
    assert latest_tick("restock", []) == 0
    assert latest_tick("shop", runs) == 9


def test_next_due_is_the_next_slot_strictly_after_the_given_time() -> None:
    """Every 15 minutes: after 12:07 comes 12:15; after exactly 12:15 comes 12:30 (UTC)."""
    every = "*/15 * * * *"
    assert next_due(every, after=datetime(2026, 3, 1, 12, 7, tzinfo=UTC)) == datetime(
        2026, 3, 1, 12, 15, tzinfo=UTC
    )
    assert next_due(every, after=datetime(2026, 3, 1, 12, 15, tzinfo=UTC)) == datetime(
        2026, 3, 1, 12, 30, tzinfo=UTC
    )
    assert next_due("@daily", after=datetime(2026, 3, 1, 12, 0, tzinfo=UTC)) == datetime(
        2026, 3, 2, 0, 0, tzinfo=UTC
    )


def test_schedules_are_read_in_utc_whatever_the_input_zone() -> None:
    """A naive time is UTC; a time in another zone is converted, so 14:07+02:00 -> 12:15Z."""
    naive = next_due("*/15 * * * *", after=datetime(2026, 3, 1, 12, 7))
    assert naive == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)
    plus_two = timezone(timedelta(hours=2))
    zoned = next_due("*/15 * * * *", after=datetime(2026, 3, 1, 14, 7, tzinfo=plus_two))
    assert zoned == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)
    assert zoned.tzinfo is UTC
    daily = next_due("0 9 * * *", after=datetime(2026, 3, 1, 10, 0, tzinfo=plus_two))
    assert daily == datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def test_a_tick_is_due_once_a_slot_has_passed_since_the_last() -> None:
    """Hourly, last tick at 12:00: not due at 12:59, due at 13:00 and after."""
    since = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert not is_due("@hourly", since=since, now=datetime(2026, 3, 1, 12, 59, tzinfo=UTC))
    assert is_due("@hourly", since=since, now=datetime(2026, 3, 1, 13, 0, tzinfo=UTC))
    assert is_due("@hourly", since=since, now=datetime(2026, 3, 2, 8, 0, tzinfo=UTC))


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ("", "a cron schedule is required"),
        ("   ", "a cron schedule is required"),
        ("* * *", "has 3 field(s); a cron schedule has 5"),
        ("0 * * * * *", "has 6 field(s)"),  # croniter's seconds field: not CronJob's dialect
        ("61 * * * *", "is not a valid cron expression"),
        ("* * * * mon-xyz", "is not a valid cron expression"),
        ("@fortnightly", "unknown cron macro"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_field(schedule: str, words: str) -> None:
    """Every unusable cron expression is an InputError at spec.schedule, in one line."""
    with pytest.raises(InputError) as caught:
        validate_schedule(schedule)
    assert caught.value.field == "spec.schedule"
    assert words in caught.value.reason
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError):
        next_due(schedule, after=datetime(2026, 1, 1, tzinfo=UTC))


def test_good_schedules_are_accepted_as_written() -> None:
    """Standard five-field expressions, names and macros pass; extra spaces are tidied."""
    assert validate_schedule("*/5 * * * *") == "*/5 * * * *"
    assert validate_schedule("0  9 * *   MON-FRI") == "0 9 * * MON-FRI"
    assert validate_schedule("@hourly") == "@hourly"
    assert validate_schedule("0 0 29 2 *") == "0 0 29 2 *"  # leap days do come
