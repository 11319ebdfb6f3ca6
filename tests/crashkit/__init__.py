"""Crash-test kit: a downstream world that remembers every side effect, and restart helpers.

It exists so that crash tests can count how many times a WRITE really happened, from outside
Keelgate, across simulated and real process deaths. It must never deduplicate, repair or settle
anything on Keelgate's behalf: the world only records, and a settlement it drives is truthful.
"""

from crashkit.rig import (
    Rig,
    StoreOpener,
    assert_no_arguments_in_audit,
    assert_promise,
    drive,
    memory_opener,
    opener_for,
    settle_truthfully,
    url_opener,
)
from crashkit.scripts import RESTOCK, Call, Script, expected_crash, tool_calls
from crashkit.world import SIDE_EFFECTS, CountingModel, Journal, LedgerConfirmer, World

__all__ = [
    "RESTOCK",
    "SIDE_EFFECTS",
    "Call",
    "CountingModel",
    "Journal",
    "LedgerConfirmer",
    "Rig",
    "Script",
    "StoreOpener",
    "World",
    "assert_no_arguments_in_audit",
    "assert_promise",
    "drive",
    "expected_crash",
    "memory_opener",
    "opener_for",
    "settle_truthfully",
    "tool_calls",
    "url_opener",
]
