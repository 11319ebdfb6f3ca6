"""Sending the operator's notices as CloudEvents over HTTP to the sinks it was given, retried,
and sent again by the next leader when the last one could not.

Why it exists: people want to be told where they already look. The notices are derived from what
the operator writes (``keelgate.kube.notices``): every object the cache takes in (a watch event,
or the answer to the operator's own write) is looked at when it differs from the one the cache
held, and a notice this process has not told yet is queued for each sink that wants its type.
Each sink has its own bounded queue and its own thread: a sink that is slow or down delays only
itself, and reconciling never waits for any of them. A sink's queue is shared fairly by the
namespaces: their notices go out in turn, and a full queue drops the newest notice of the
namespace holding the most (counted in ``keelgate_notifications_dropped_total``), so one
namespace's flood never pushes out another's notices. A delivery that fails (a connection
refused, a timeout, 408, 429 or 5xx) is tried again after 1 s, 2 s, 4 s ... at most 60 s apart,
for ``retryForSeconds``; any other answer (400, 401, 404 ...) will not change by being asked
again, and drops the notice. Each try ends at ``timeoutSeconds`` and the whole delivery at
``retryForSeconds``, whatever the sink sends (``keelgate.core.cutoff``: a sink that trickles its
answer is cut off), and a 2xx is taken at its status, its body unread.

Restarts. How far delivery has come is kept in a ConfigMap (``state``): every notice whose
record's time is before ``through`` has been delivered or dropped. A new leader reads it before
it lists the cluster; each notice the listing holds whose time is after it is sent again, with
the same id (the receiver de-duplicates), and older ones are taken as told. So a notice is sent
at least once, unless it is dropped (a full queue, a refusal, retries exhausted), whatever
process dies when. Without a state ConfigMap, a restart takes everything it finds as told.

This module must never block a reconcile on a sink, never let one try or one delivery outlive
its limit, never send a secret or a tool's argument unless the sink asks (``includeArguments``:
redacted first), and never log a header's value.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import httpx
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent

from keelgate.core import clocks
from keelgate.core.cutoff import Cutoff
from keelgate.core.redaction import redact_text, redact_value
from keelgate.core.state import planned_arguments
from keelgate.errors import InputError
from keelgate.kube.notices import KINDS, SERVER_CLOCK, Notice, notices_of
from keelgate.kube.runtime.metrics import Metrics
from keelgate.kube.times import parse_time
from keelgate.manifest.notifications import NotifySettings, Sink

log = logging.getLogger("keelgate.operator")

#: How far ``through`` stays behind the operator's clock, and how much earlier than it a record
#: on the API server's clock is still sent again after a restart: records are in whole seconds,
#: and clocks further apart than this (the API server's and the operator's, or two leaders')
#: may lose a notice across a restart. At least 1 s (a record's time is truncated).
CLOCK_MARGIN = 5.0
FIRST_RETRY = 1.0
MAX_RETRY = 60.0
#: HTTP answers worth asking again: the receiver was busy, away or timed out.
RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
STATE_KEY = "through"

#: (namespace, run, action) -> the action's recorded arguments, or None when not found.
Arguments = Callable[[str, str, str], Any]


class NotifyState(Protocol):
    """Where ``through`` is kept between leaders."""

    def load(self) -> float | None: ...

    def save(self, through: float) -> None: ...


class ConfigMaps(Protocol):
    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> None: ...


class ConfigMapState:
    """``through`` in the data of a ConfigMap (``NAMESPACE/NAME``), created when first saved."""

    def __init__(self, api: ConfigMaps, where: str) -> None:
        self._api = api
        self.namespace, self.name = where.split("/", 1)

    def load(self) -> float | None:
        found = self._api.read_config_map(self.namespace, self.name)
        text = str(((found or {}).get("data") or {}).get(STATE_KEY) or "")
        moment = parse_time(text)
        return None if moment is None else moment.timestamp()

    def save(self, through: float) -> None:
        moment = dt.datetime.fromtimestamp(through, dt.UTC)
        self._api.write_config_map(
            self.namespace, self.name, {STATE_KEY: moment.isoformat(timespec="milliseconds")}
        )


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


def cloud_event(notice: Notice, *, source: str, arguments: Any = None) -> CloudEvent:
    """The CloudEvent of ``notice`` as the operator ``source`` tells it (with ``arguments``,
    already redacted, when a sink asked for them and they were found)."""
    data = dict(notice.data)
    if arguments is not None:
        data["arguments"] = arguments
    return CloudEvent(
        attributes={
            "specversion": "1.0",
            "type": notice.type,
            "source": f"/{source}{notice.path}",
            "id": notice.id,
            "subject": notice.subject,
            "time": dt.datetime.fromtimestamp(notice.time, dt.UTC),
            "datacontenttype": "application/json",
        },
        data=data,
    )


@dataclass
class _Queued:
    notice: Notice
    since: float | None = None  # boot-clock time of its first try
    tries: int = 0


class _Outcome(StrEnum):
    SENT = "sent"
    RETRY = "retry"  # worth asking again
    REFUSED = "refused"  # an answer asking again will not change


class _Fair:
    """The notices waiting for one sink: a queue per namespace, served in turn (a namespace
    that floods waits behind its own notices, not others'), at most ``size`` in all. When full,
    the newest notice of the namespace holding the most is dropped: a flood from one namespace
    pushes out its own notices, never another's. The caller holds the sender's lock."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._queues: dict[str, deque[_Queued]] = {}
        self._turns: deque[str] = deque()  # namespaces with notices waiting, in serving order
        self.count = 0

    def add(self, queued: _Queued) -> _Queued | None:
        """Queue ``queued``; what was dropped to make room (``queued`` itself, if its namespace
        holds the most), or None."""
        namespace = queued.notice.namespace
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
        """The next notice to send (the next namespace's oldest), taken off the queue."""
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
    """One sink: its queues, its thread, its client. Notices go out one at a time, in turn by
    namespace, and in order within one."""

    def __init__(
        self,
        sink: Sink,
        *,
        source: str,
        queue_size: int,
        metrics: Metrics,
        arguments: Arguments | None,
        done: Callable[[Notice], None],
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.sink = sink
        self._source = source
        self._metrics = metrics
        self._arguments = arguments
        self._done = done
        self._headers = read_headers(sink.headers_dir, field=f"sinks.{sink.name}.headersDir")
        self._waiting = _Fair(queue_size)
        self._current: _Queued | None = None  # the notice being tried, off the queue
        self._wake = threading.Condition()
        self._stopping = threading.Event()
        self._sleep = sleep or (lambda seconds: self._stopping.wait(seconds))
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=sink.timeout_seconds, follow_redirects=False)

    # Queueing (any thread)

    def offer(self, notice: Notice) -> bool:
        """Queue ``notice``; False when it was dropped (counted) because the queue is full and
        its namespace holds the most. A notice of another namespace dropped to make room is
        done with here."""
        with self._wake:
            dropped = self._waiting.add(_Queued(notice))
            self._gauge()
            self._wake.notify()
        if dropped is not None:
            self._metrics.notifications_dropped.labels(self.sink.name, "queue_full").inc()
            log.warning(
                "notify %s: queue full (%d); dropped %s %s",
                self.sink.name,
                self._waiting.size,
                dropped.notice.type,
                dropped.notice.subject,
            )
            if dropped.notice is not notice:
                self._done(dropped.notice)
        return dropped is None or dropped.notice is not notice

    def pending(self) -> list[Notice]:
        with self._wake:
            current = [] if self._current is None else [self._current]
            return [queued.notice for queued in current + self._waiting.all()]

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
                return  # stopping: the notice stays undelivered (the next leader sends it)

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
        outcome, said = self._send(head.notice, ends=ends)
        name, notice = sink.name, head.notice
        if outcome == _Outcome.SENT:
            self._metrics.notifications_sent.labels(name, notice.type).inc()
            self._finish(head)
            return None
        self._metrics.notifications_failed.labels(name).inc()
        if outcome == _Outcome.REFUSED:
            self._metrics.notifications_dropped.labels(name, "refused").inc()
            log.warning(
                "notify %s: %s %s refused (%s); dropped", name, notice.type, notice.id, said
            )
            self._finish(head)
            return None
        wait = min(MAX_RETRY, FIRST_RETRY * 2.0 ** (head.tries - 1))
        if clocks.boot() + wait - head.since > sink.retry_for_seconds:
            self._metrics.notifications_dropped.labels(name, "gave_up").inc()
            log.warning(
                "notify %s: %s %s not delivered after %d tries (%s); dropped",
                name,
                notice.type,
                notice.id,
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
        self._done(head.notice)

    def _send(self, notice: Notice, *, ends: float) -> tuple[_Outcome, str]:
        """One try: the event built, then POSTed, the exchange over at ``timeoutSeconds`` and
        never past ``ends`` (on the boot clock)."""
        arguments = None
        if self.sink.include_arguments and notice.action and self._arguments is not None:
            try:
                found = self._arguments(notice.namespace, notice.run, notice.action)
            except Exception as error:  # the store away: the event goes without them
                log.warning(
                    "notify %s: the arguments of %s could not be read (%s)",
                    self.sink.name,
                    notice.subject,
                    _said(error),
                )
                found = None
            arguments = None if found is None else redact_value(found)
        event = cloud_event(notice, source=self._source, arguments=arguments)
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


class Notifier:
    """Every notice the operator's objects hold, told once by this process to every sink that
    wants it; ``through`` kept in ``state`` for the next leader."""

    def __init__(
        self,
        settings: NotifySettings,
        *,
        metrics: Metrics,
        state: NotifyState | None = None,
        arguments: Arguments | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.settings = settings
        self._state = state
        self._clock = clock
        self._lock = threading.Lock()
        # What this process has told (or taken as told), per object (by uid): notice ids.
        self._told: dict[str, set[str]] = {}
        self._boundary: float | None = None  # while listing: notices up to it are told already
        self._listing = False
        self._outstanding: dict[str, tuple[Notice, int]] = {}  # id -> (notice, sinks to go)
        self._latest: float | None = None  # the newest record among the notices seen
        self._saved: float | None = None
        self.senders = [
            SinkSender(
                sink,
                source=settings.source,
                queue_size=settings.queue_size,
                metrics=metrics,
                arguments=arguments,
                done=self._delivered,
                sleep=sleep,
            )
            for sink in settings.sinks
        ]

    # The start of a leader

    def begin(self) -> None:
        """Before the listing: read how far the last leader delivered. Notices the listing
        holds up to that point are taken as told; later ones are sent (again). Without a kept
        state (none configured, none saved yet, or unreadable) everything listed is taken as
        told: a first start never floods its sinks with the cluster's past."""
        through: float | None = None
        if self._state is not None:
            try:
                through = self._state.load()
            except Exception as error:  # told, then taken as nothing kept
                log.warning(
                    "notify: cannot read the delivery state (%s); what the listing holds is "
                    "taken as told",
                    _said(error),
                )
        with self._lock:
            self._listing = True
            self._boundary = through
            self._saved = through
        if through is not None:
            log.info(
                "notify: sending again what was recorded after %s",
                dt.datetime.fromtimestamp(through, dt.UTC).isoformat(timespec="seconds"),
            )

    def live(self) -> None:
        """The listing is done: from now on every new notice is sent."""
        with self._lock:
            self._listing = False
            self._boundary = None

    def start(self) -> None:
        for sender in self.senders:
            sender.start()

    def stop(self) -> None:
        for sender in self.senders:
            sender.stop()
        self.save_state()

    # Observing (any thread: the cache calls it with every body it takes in)

    def observe(self, kind: str, body: Mapping[str, Any], deleted: bool) -> None:
        """The cache took ``body`` in (or saw it deleted): queue the notices it holds that
        this process has not told. Called with every body that changed what the cache held (an
        equal one holds no notice not told already): cheap for one that holds none."""
        if kind not in KINDS:
            return
        uid = str((body.get("metadata") or {}).get("uid", ""))
        if deleted:
            with self._lock:
                self._told.pop(uid, None)
            return
        found = notices_of(kind, body)
        if not found:
            return
        with self._lock:
            told = self._told.setdefault(uid, set())
            fresh = [n for n in found if n.id not in told]
            if self._listing:
                # Told before this process began, unless recorded after the kept state.
                boundary = self._boundary
                for notice in fresh:
                    if boundary is None or not _after(notice, boundary):
                        told.add(notice.id)
                        self._seen(notice)
                fresh = [n for n in fresh if n.id not in told]
            sending = self._take(told, fresh)
        self._offer(sending)

    def tell(self, notice: Notice) -> None:
        """Tell a notice that no object's body holds (an approval found expired), once."""
        with self._lock:
            told = self._told.setdefault(notice.about[3], set())
            sending = self._take(told, [notice] if notice.id not in told else [])
        self._offer(sending)

    def _take(self, told: set[str], fresh: list[Notice]) -> list[tuple[Notice, list[SinkSender]]]:
        """Mark ``fresh`` told and outstanding for the sinks that want each (under the lock,
        so that ``through`` never passes a notice about to be queued)."""
        sending = []
        for notice in fresh:
            told.add(notice.id)
            self._seen(notice)
            wanting = [s for s in self.senders if s.sink.wants(notice.type)]
            if wanting:
                self._outstanding[notice.id] = (notice, len(wanting))
                sending.append((notice, wanting))
        return sending

    def _seen(self, notice: Notice) -> None:
        """The caller holds the lock."""
        if self._latest is None or notice.time > self._latest:
            self._latest = notice.time

    def _offer(self, sending: list[tuple[Notice, list[SinkSender]]]) -> None:
        for notice, wanting in sending:
            for sender in wanting:
                if not sender.offer(notice):
                    self._delivered(notice)

    def _delivered(self, notice: Notice) -> None:
        """One sink is done with ``notice`` (sent, or dropped)."""
        with self._lock:
            entry = self._outstanding.get(notice.id)
            if entry is None:
                return
            if entry[1] <= 1:
                del self._outstanding[notice.id]
            else:
                self._outstanding[notice.id] = (entry[0], entry[1] - 1)

    # How far delivery has come

    def through(self) -> float:
        """Every notice recorded before this moment has been delivered or dropped (or is not
        yet seen, and then recorded within CLOCK_MARGIN of it)."""
        with self._lock:
            oldest = min((n.time for n, _ in self._outstanding.values()), default=None)
        bound = self._clock() - CLOCK_MARGIN
        return bound if oldest is None else min(bound, oldest - 0.001)

    def save_state(self) -> None:
        """Keep ``through`` for the next leader while it has not yet passed the newest notice
        seen (an idle operator writes nothing: after a burst of notices, a few saves, the last
        about CLOCK_MARGIN later). A failure is told and tried at the next save."""
        if self._state is None:
            return
        with self._lock:
            latest, saved = self._latest, self._saved
        if latest is None or (saved is not None and saved >= latest):
            return
        through = self.through()
        if saved is not None and through <= saved:
            return  # held back by an undelivered notice: nothing new to keep
        try:
            self._state.save(through)
        except Exception as error:
            log.warning(
                "notify: cannot keep the delivery state (%s)",
                _said(error),
            )
            return
        with self._lock:
            self._saved = through


def _said(error: BaseException) -> str:
    """An error's first line, redacted (its class's name when it says nothing), for a log."""
    text = redact_text(str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _after(notice: Notice, through: float) -> bool:
    """Whether ``notice`` may not have been delivered by a leader that kept ``through``: one on
    the API server's clock is given CLOCK_MARGIN more (the clocks may differ)."""
    margin = CLOCK_MARGIN if notice.clock == SERVER_CLOCK else 0.0
    return notice.time > through - margin


def plan_arguments(checkpoint_state: Mapping[str, Any], action: str) -> Any:
    """The recorded arguments of ``action`` in a checkpoint document (its plan), or None."""
    return planned_arguments(checkpoint_state).get(action)
