"""When a person's "not executed", written on a Reconciliation, can count.

Why it exists: a call whose outcome is unknown may still be sent, by a process held up between
its claim and its send, until its write deadline (on the store's clock); a person who looks
before then sees a moment after which the call may still leave. So "not executed" counts only
written after the deadline, and the moment people are shown (``status.notExecutedAfter``), the
one the kubectl plugin and the inbox wait for, and the one the operator judges a write's moment
against are this one definition. The API server dates writes on its own clock, in whole seconds:
``CLOCK_SKEW`` is allowed between the two. It must never make a decision count earlier than the
deadline.
"""

from __future__ import annotations

import math

from keelgate.kube.times import parse_time, stamp

#: The reason a Reconciliation's "not executed" written before that moment is refused (its
#: Stalled condition's): what the plugin, the inbox and people read to write it again.
TOO_EARLY = "DecidedTooEarly"

#: How far the API server's clock (its records of writes) and the store's (the write deadline)
#: may be apart: a "not executed" written within it after the deadline is taken as early.
CLOCK_SKEW = 5.0


def counts_from(deadline: float) -> float:
    """The first moment (the API server's clock, POSIX seconds) a "not executed" written on a
    Reconciliation counts, for a call whose write deadline is ``deadline`` (the store's)."""
    return float(math.ceil(deadline + CLOCK_SKEW))


def shown_from(deadline: float) -> str:
    """``counts_from`` as people are shown it (a metav1.Time, whole seconds)."""
    return stamp(counts_from(deadline))


def shown_after(deadline: str) -> str:
    """A call's write deadline as the store names it (RFC 3339, "" for none) as people are
    shown it: ``shown_from``; "" stays ""."""
    moment = parse_time(deadline)
    return "" if moment is None else shown_from(moment.timestamp())
