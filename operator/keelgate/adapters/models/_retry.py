"""The one retry policy for model calls, shared by every network provider.

Retrying a model call is safe because nothing about it is saved until it returns: the loop writes
the plan only after a reply, so a call that failed in transit left no trace. That is the only
reason this exists, and it must never be used for a tool call. Provider SDKs' own retries are
switched off so that this policy is the whole story (bounded, testable, one place to read).
A definite refusal (a 4xx other than 429) is never retried: asking again gets the same answer.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from keelgate.core import clocks
from keelgate.core.redaction import REDACTED, redact_text
from keelgate.errors import ModelError, ModelUnavailable

log = logging.getLogger("keelgate.models")

T = TypeVar("T")

MESSAGE_CAP = 300


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure.

    ``attempts`` counts the first try. The delay doubles from ``base_delay`` up to ``max_delay``;
    a server's Retry-After is honoured up to ``max_retry_after`` (a longer wait is not waited
    for: the call fails, so one slow provider cannot hold a run for an hour).
    """

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next try after ``attempt`` failed, or None to give up."""
        if attempt >= self.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return clocks.backoff(self.base_delay, self.max_delay, attempt - 1)


@dataclass(frozen=True)
class Transient:
    """A failure worth another try: transport trouble, a 5xx, or a 429."""

    what: str
    retry_after: float | None = None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Read ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date); None if absent."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def one_line(text: str, *, secrets: tuple[str, ...] = ()) -> str:
    """A provider's message as one short line, with anything key-like removed."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    # Providers echo a masked key in 401 messages ("Incorrect API key provided: sk-ab***yz");
    # even masked, it does not belong in a status: the redactor knows that shape too.
    text = redact_text(text)
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CAP else text[: MESSAGE_CAP - 3] + "..."


def call_with_retries(
    call: Callable[[], T],
    classify: Callable[[Exception], Transient | ModelError],
    *,
    policy: RetryPolicy,
    provider: str,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Run ``call``; retry what ``classify`` calls transient, raise ModelError for the rest.

    ``classify`` turns every exception into either a Transient (try again) or the ModelError to
    raise. The final error says how many attempts were made and why the last one failed.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as error:
            verdict = classify(error)
            if isinstance(verdict, ModelError):
                raise verdict from None
            wait = policy.delay(attempt, verdict.retry_after)
            if wait is None:
                detail = (
                    f"; the server asked to wait {verdict.retry_after:.0f}s"
                    if verdict.retry_after is not None
                    and verdict.retry_after > policy.max_retry_after
                    else ""
                )
                raise ModelUnavailable(
                    f"{provider}: {verdict.what} (gave up after {attempt} "
                    f"attempt{'s' if attempt != 1 else ''}{detail})"
                ) from None
            log.warning(
                "%s: %s; retrying in %.1fs (attempt %d of %d)",
                provider,
                verdict.what,
                wait,
                attempt,
                policy.attempts,
            )
            (sleep or clocks.sleep)(wait)
