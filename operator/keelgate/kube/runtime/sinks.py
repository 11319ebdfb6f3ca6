"""One sink's delivery of the operator's notifications as CloudEvents over HTTP: its queue, its
thread, its tries.

Why it exists: each sink has its own bounded queue and its own thread, so a sink that is slow or
down delays only itself, and reconciling never waits for any of them; the notifier
(``keelgate.kube.runtime.notifier``) decides what to send and to which sinks, this module how one
sink gets it. A sink's queue is shared fairly by the namespaces: their notifications go out in
turn, and a full queue drops the newest notification of the namespace holding the most (counted
in ``keelgate_notifications_dropped_total``), so one namespace's flood never pushes out
another's notifications. A delivery that fails (a connection refused, a timeout, 408, 429 or
5xx) is tried again after 1 s, 2 s, 4 s ... at most 60 s apart, for ``retryForSeconds``; any
other answer (400, 401, 404 ...) will not change by being asked again, and drops the
notification. Each try ends at ``timeoutSeconds`` and the whole delivery at ``retryForSeconds``,
whatever the sink sends (``keelgate.core.cutoff``: a sink that trickles its answer is cut off),
and a 2xx is taken at its status, its body unread.

This module must never let one try or one delivery outlive its limit, never send a secret or a
tool's argument unless the sink asks (``includeArguments``: redacted first), and never log a
header's value.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent

from keelgate.core import clocks
from keelgate.core.cutoff import Cutoff
from keelgate.core.redaction import redact_text, redact_value, redacted_line
from keelgate.errors import InputError
from keelgate.kube.notifications import Notification
from keelgate.kube.runtime.metrics import Metrics
from keelgate.manifest.notifications import Sink

log = logging.getLogger("keelgate.operator")

FIRST_RETRY = 1.0
MAX_RETRY = 60.0
#: HTTP answers worth asking again: the receiver was busy, away or timed out.
RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})

#: (namespace, run, action) -> the action's recorded arguments, or None when not found.
Arguments = Callable[[str, str, str], Any]


def read_headers(folder: str, *, field: str) -> dict[str, str]:
    """The headers a sink sends: each file in ``folder`` (a mounted Secret: its keys) is one,
    named as the file, its value the file's text without the final line end. Dot-files (the
    mount's own bookkeeping) are skipped. A header's value is never shown."""
    if not folder:
        return {}
    path = Path(folder)
    if not path.is_dir():
        raise InputError(field, f"{folder}: no such folder")
    headers: dict[str, str] = {}
    for item in sorted(path.iterdir()):
        if item.name.startswith(".") or not item.is_file():
            continue
        try:
            value = item.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError):
            raise InputError(field, f"{item}: cannot be read as text") from None
        if "\n" in value or "\r" in value:
            raise InputError(field, f"{item.name}: a header's value must be one line")
        headers[item.name] = value
    return headers


def cloud_event(notification: Notification, *, source: str, arguments: Any = None) -> CloudEvent:
    """The CloudEvent of ``notification`` as the operator ``source`` tells it (with ``arguments``,
    already redacted, when a sink asked for them and they were found)."""
    data = dict(notification.data)
    if arguments is not None:
        data["arguments"] = arguments
    return CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": notification.type,
            "source": f"/{source}{notification.path}",
            "id": notification.id,
            "subject": notification.subject,
            "time": dt.datetime.fromtimestamp(notification.time, dt.UTC),
            "datacontenttype": "application/json",
        },
        data=data,
    )


@dataclass
class _Queued:
    notification: Notification
    since: float | None = None  # boot-clock time of its first try
    tries: int = 0


class _Outcome(StrEnum):
    SENT = "sent"
    RETRY = "retry"  # worth asking again
    REFUSED = "refused"  # an answer asking again will not change


class _Fair:
    """The notifications waiting for one sink: a queue per namespace, served in turn (a namespace
    that floods waits behind its own notifications, not others'), at most ``size`` in all. When
    full, the newest notification of the namespace holding the most is dropped: a flood from one
    namespace pushes out its own notifications, never another's. The caller holds the sender's
    lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._queues: dict[str, deque[_Queued]] = {}
        self._turns: deque[str] = deque()  # the namespaces with some waiting, in serving order
        self.count = 0

    def add(self, queued: _Queued) -> _Queued | None:
        """Queue ``queued``; what was dropped to make room (``queued`` itself, if its namespace
        holds the most), or None."""
        namespace = queued.notification.namespace
        dropped: _Queued | None = None
        if self.count >= self.size:
            mine = len(self._queues.get(namespace, ()))
            fullest = max(self._queues, key=lambda name: len(self._queues[name]))
            if mine >= len(self._queues[fullest]):
                return queued
            dropped = self._queues[fullest].pop()
            self.count -= 1
            if not self._queues[fullest]:
                del self._queues[fullest]
                self._turns.remove(fullest)
        if namespace not in self._queues:
            self._queues[namespace] = deque()
            self._turns.append(namespace)
        self._queues[namespace].append(queued)
        self.count += 1
        return dropped

    def take(self) -> _Queued | None:
        """The next notification to send (the next namespace's oldest), taken off the queue."""
        if not self._turns:
            return None
        namespace = self._turns.popleft()
        waiting = self._queues[namespace]
        queued = waiting.popleft()
        self.count -= 1
        if waiting:
            self._turns.append(namespace)
        else:
            del self._queues[namespace]
        return queued

    def all(self) -> list[_Queued]:
        return [queued for name in self._turns for queued in self._queues[name]]


class SinkSender:
    """One sink: its queues, its thread, its client. Notifications go out one at a time, in turn by
    namespace, and in order within one."""

    def __init__(
        self,
        sink: Sink,
        *,
        source: str,
        queue_size: int,
        metrics: Metrics,
        arguments: Arguments | None,
        done: Callable[[Notification], None],
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.sink = sink
        self._source = source
        self._metrics = metrics
        self._arguments = arguments
        self._done = done
        self._headers = read_headers(sink.headers_dir, field=f"sinks.{sink.name}.headersDir")
        self._waiting = _Fair(queue_size)
        self._current: _Queued | None = None  # the notification being tried, off the queue
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._sleep = sleep or (lambda seconds: self._stopping.wait(seconds))
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=sink.timeout_seconds, follow_redirects=False)

    # Queueing (any thread)

    def offer(self, notification: Notification) -> bool:
        """Queue ``notification``; False when it was dropped (counted) because the queue is full and
        its namespace holds the most. A notification of another namespace dropped to make room is
        done with here."""
        with self._wake:
            dropped = self._waiting.add(_Queued(notification))
            self._gauge()
            self._wake.notify()
        if dropped is not None:
            self._metrics.notifications_dropped.labels(self.sink.name, "queue_full").inc()
            log.warning(
                "notify %s: queue full (%d); dropped %s %s",
                self.sink.name,
                self._waiting.size,
                dropped.notification.type,
                dropped.notification.subject,
            )
            if dropped.notification is not notification:
                self._done(dropped.notification)
        return dropped is None or dropped.notification is not notification

    def pending(self) -> list[Notification]:
        with self._wake:
            current = [] if self._current is None else [self._current]
            return [queued.notification for queued in current + self._waiting.all()]

    def _gauge(self) -> None:
        """The caller holds the lock."""
        waiting = self._waiting.count + (self._current is not None)
        self._metrics.notifications_queued.labels(self.sink.name).set(waiting)

    # Sending (its thread)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"keelgate-notify-{self.sink.name}", daemon=True
        )
        self._thread.start()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._client.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._wake:
                while self._current is None and not self._stopping.is_set():
                    self._current = self._waiting.take()
                    if self._current is None:
                        self._wake.wait()
                if self._stopping.is_set():
                    return
                head = self._current
            assert head is not None
            wait = self._attempt(head)
            if wait is not None and self._sleep(wait):
                return  # stopping: the notification stays undelivered (the next leader sends it)

    def _attempt(self, head: _Queued) -> float | None:
        """Try to deliver ``head`` once; the seconds to wait before trying it again, or None
        when it is done with (sent, refused or given up). The try ends at ``timeoutSeconds``,
        and no later than the delivery's end (``retryForSeconds`` after its first try, or one
        whole try when that is longer), whatever the sink sends."""
        now = clocks.boot()
        if head.since is None:
            head.since = now
        head.tries += 1
        sink = self.sink
        ends = head.since + max(sink.retry_for_seconds, sink.timeout_seconds)
        outcome, said = self._send(head.notification, ends=ends)
        name, notification = sink.name, head.notification
        if outcome == _Outcome.SENT:
            self._metrics.notifications_sent.labels(name, notification.type).inc()
            self._finish(head)
            return None
        self._metrics.notifications_failed.labels(name).inc()
        if outcome == _Outcome.REFUSED:
            self._metrics.notifications_dropped.labels(name, "refused").inc()
            log.warning(
                "notify %s: %s %s refused (%s); dropped",
                name,
                notification.type,
                notification.id,
                said,
            )
            self._finish(head)
            return None
        wait = clocks.backoff(FIRST_RETRY, MAX_RETRY, head.tries - 1)
        if clocks.boot() + wait - head.since > sink.retry_for_seconds:
            self._metrics.notifications_dropped.labels(name, "gave_up").inc()
            log.warning(
                "notify %s: %s %s not delivered after %d tries (%s); dropped",
                name,
                notification.type,
                notification.id,
                head.tries,
                said,
            )
            self._finish(head)
            return None
        log.info("notify %s: %s; trying again in %.0fs", name, said, wait)
        return wait

    def _finish(self, head: _Queued) -> None:
        with self._wake:
            if self._current is head:
                self._current = None
            self._gauge()
        self._done(head.notification)

    def _send(self, notification: Notification, *, ends: float) -> tuple[_Outcome, str]:
        """One try: the event built, then POSTed, the exchange over at ``timeoutSeconds`` and
        never past ``ends`` (on the boot clock)."""
        arguments = None
        if self.sink.include_arguments and notification.action and self._arguments is not None:
            try:
                found = self._arguments(
                    notification.namespace, notification.run, notification.action
                )
            except Exception as error:  # the store away: the event goes without them
                log.warning(
                    "notify %s: the arguments of %s could not be read (%s)",
                    self.sink.name,
                    notification.subject,
                    redacted_line(error),
                )
                found = None
            arguments = None if found is None else redact_value(found)
        event = cloud_event(notification, source=self._source, arguments=arguments)
        if self.sink.mode == "binary":
            message = to_binary_event(event)
        else:
            message = to_structured_event(event)
        cutoff = Cutoff.after(self.sink.timeout_seconds, at_most=ends)
        request = self._client.build_request(
            "POST",
            self.sink.url,
            content=message.body,
            headers={**self._headers, **message.headers},
            timeout=cutoff.remaining(),
            extensions={"trace": cutoff.trace},
        )
        try:
            # The answer's status is the sink's word; its body is not read (a sink that
            # trickles one would hold the try for nothing).
            with cutoff:
                answer = self._client.send(request, stream=True)
                answer.close()
        except httpx.HTTPError as error:
            if cutoff.cut:
                return _Outcome.RETRY, "no whole answer in time (the try was cut)"
            return _Outcome.RETRY, f"{type(error).__name__}: {redact_text(str(error))}"
        if 200 <= answer.status_code <= 299:
            return _Outcome.SENT, ""
        said = f"HTTP {answer.status_code}"
        if answer.status_code in RETRYABLE:
            return _Outcome.RETRY, said
        return _Outcome.REFUSED, said
