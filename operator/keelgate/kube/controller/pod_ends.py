"""How a step pod ended, read from what Kubernetes says about it: one of seven kinds.

Why it exists: the operator's next move depends on how the last step pod ended (go on, retry
with back-off, retry later because another process drives the run, leave the run to the
operator that took it over, or stall until the spec changes), and ``kubectl keelgate status``
shows the same words. The exit codes are those of
``keelgate step`` (``keelgate.core.exits``): 0, 1 and 3 are a step that recorded where the run
stands; any other code is read from the error table of ``keelgate.errors``. This module is pure: it
never talks to a cluster or a store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from keelgate.core.exits import EXIT_BUSY, EXIT_FENCED, EXIT_PREEMPTED, RECORDED
from keelgate.errors import exit_retryable
from keelgate.kube.times import parse_time


class EndKind(StrEnum):
    """How a step pod ended (also the ``result`` label of ``keelgate_steps_ended_total``)."""

    CLEAN = "clean"  # the step recorded where the run stands
    CRASH = "crash"  # it ended without recording a stop: retried, with back-off
    BUSY = "busy"  # another process was driving the run: retried later, not a crash
    BAD_INPUT = "bad_input"  # the step refused its input: the spec must change
    STORE = "store"  # the store could not be reached: a crash
    # Asked to stop (SIGTERM: a drain, an eviction), it finished its call, recorded it and
    # stopped at a checkpoint: not a crash, and the next attempt goes on from there at once.
    PREEMPTED = "preempted"
    # Its writes were refused for the run's epoch (exit 6): another holder took the run over.
    # Not a crash and not retried: the run goes on only under whoever holds it.
    FENCED = "fenced"


@dataclass(frozen=True)
class PodEnd:
    """How a step pod ended: its kind, in words for people, and its run time if known."""

    kind: EndKind
    words: str
    seconds: float | None = None
    #: The last lines the step wrote (its termination message: the log's tail when it failed),
    #: kept in ``status.step.lastLines`` after its pod is deleted.
    last_lines: str = ""

    @property
    def clean(self) -> bool:
        return self.kind is EndKind.CLEAN


def classify(pod: Mapping[str, Any], *, deleted: bool = False) -> PodEnd:
    """A finished (or vanished) step pod's end, from its container's terminated state."""
    pod_status = pod.get("status") or {}
    containers = pod_status.get("containerStatuses") or []
    terminated = (containers[0].get("state") or {}).get("terminated") if containers else None
    if terminated:
        end = _terminated(pod_status, terminated)
        # A clean end's message is the step's outcome, which the status shows already.
        return end if end.clean else replace(end, last_lines=_tail(terminated))
    if pod_status.get("phase") == "Failed":
        reason = pod_status.get("reason") or "Failed"
        message = pod_status.get("message") or ""
        return PodEnd(EndKind.CRASH, f"{reason}: {message}" if message else reason)
    if deleted:
        return PodEnd(EndKind.CRASH, "deleted before it ended")
    return PodEnd(EndKind.CRASH, f"ended as {pod_status.get('phase') or 'unknown'}")


def _terminated(pod_status: Mapping[str, Any], terminated: Mapping[str, Any]) -> PodEnd:
    code = terminated.get("exitCode")
    reason = terminated.get("reason") or ""
    seconds = _duration(terminated.get("startedAt"), terminated.get("finishedAt"))
    words = f"exit code {code}" + (f" ({reason})" if reason else "")
    if code in RECORDED:
        return PodEnd(EndKind.CLEAN, words, seconds)
    if pod_status.get("reason") == "DeadlineExceeded":
        # Killed at its activeDeadlineSeconds: a step that ran past its run's time budget.
        return PodEnd(
            EndKind.CRASH, f"{words}: ran past its deadline (activeDeadlineSeconds)", seconds
        )
    if code == EXIT_BUSY:
        return PodEnd(EndKind.BUSY, f"{words}: another process was driving the run", seconds)
    if code == EXIT_FENCED:
        # Its writes were refused for the run's epoch: another holder drives the run now, and
        # what this step left in flight is that holder's unknown outcome. Not a crash, and not
        # bad input: the run goes on under whoever holds it.
        return PodEnd(
            EndKind.FENCED,
            f"{words}: another holder took the run over; nothing more was written",
            seconds,
        )
    if code == EXIT_PREEMPTED:
        return PodEnd(
            EndKind.PREEMPTED,
            f"{words}: asked to stop (a drain or an eviction), it stopped at a checkpoint",
            seconds,
        )
    retryable = exit_retryable(code) if isinstance(code, int) else None
    if retryable is False:  # the same pod would meet the same error: the spec must change
        detail = _last_line(terminated.get("message") or "")
        return PodEnd(EndKind.BAD_INPUT, f"{words}: {detail}" if detail else words, seconds)
    if retryable is True:
        return PodEnd(EndKind.STORE, f"{words}: the store could not be reached", seconds)
    return PodEnd(EndKind.CRASH, words, seconds)


#: What of a step's last words is kept in its run's status: lines, and characters.
TAIL_LINES, TAIL_CHARS = 5, 1000


def _tail(terminated: Mapping[str, Any]) -> str:
    lines = [line.rstrip() for line in str(terminated.get("message") or "").splitlines()]
    kept = "\n".join(line for line in lines if line.strip())
    kept = "\n".join(kept.splitlines()[-TAIL_LINES:])
    return kept[-TAIL_CHARS:]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # The step prints its outcome as one JSON object last; the error line comes before it.
    for line in reversed(lines):
        if not line.startswith("{"):
            return line[:300]
    return ""


def _duration(start: str | None, end: str | None) -> float | None:
    begun, done = parse_time(start), parse_time(end)
    if begun is None or done is None:
        return None
    return max(0.0, (done - begun).total_seconds())
