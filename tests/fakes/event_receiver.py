"""A CloudEvents receiver on loopback: what a chat bridge, a Knative broker or a workflow's
webhook is to the operator's notifier.

Each POST is parsed with the CloudEvents SDK (``cloudevents.core.bindings.http.from_http``, binary
or structured mode as the request says), so a request the SDK cannot read as a CloudEvent fails
the test that made it: the wire format is checked, not assumed. It can be told to fail a number
of requests first (an answer, or a dropped connection), as a receiver being restarted does, or to
trickle its answer to the events of some namespaces (a bridge that chokes on one team's flood).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat

from fakes.loopback import Answer, LoopbackServer, Received


@dataclass(frozen=True)
class Got:
    """One CloudEvent the receiver accepted, and the request that carried it."""

    event: BaseCloudEvent
    request: Received

    @property
    def type(self) -> str:
        return self.event.get_type()

    @property
    def id(self) -> str:
        return self.event.get_id()

    @property
    def data(self) -> Any:
        return self.event.get_data()


def quick(_: float) -> bool:
    """The notifier's back-off between tries, cut to a moment (the waits it asks for are still
    counted): its ``sleep``, for tests."""
    time.sleep(0.01)
    return False


class EventReceiver(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[Got] = []
        self.unreadable: list[str] = []
        #: Answers for the next requests, in order (then 202).
        self.failures: list[Answer] = []
        #: An answer for every request while set (a receiver that stays down).
        self.down: Answer | None = None
        #: Events about these namespaces are read, then answered a byte every ``pace``
        #: seconds (the status line first); kept in ``trickled``, not ``accepted``.
        self.slow_namespaces: set[str] = set()
        self.pace = 0.5
        self.trickled: list[Got] = []
        self._arrived = threading.Condition()

    def respond(self, received: Received) -> Answer:
        with self._arrived:
            if self.down is not None:
                return self.down
            if self.failures:
                return self.failures.pop(0)
        try:
            event = from_http(HTTPMessage(received.headers, received.body), JSONFormat())
        except Exception as error:  # not a CloudEvent: the test fails on it
            with self._arrived:
                self.unreadable.append(f"{type(error).__name__}: {error}")
            return Answer(status=400)
        got = Got(event, received)
        if (got.data or {}).get("namespace") in self.slow_namespaces:
            with self._arrived:
                self.trickled.append(got)
            return Answer(status=202, trickle="headers", pace=self.pace)
        with self._arrived:
            self.accepted.append(got)
            self._arrived.notify_all()
        return Answer(status=202)

    def wait_for(self, count: int, *, timeout: float = 10.0) -> list[Got]:
        """The events accepted, once there are at least ``count``."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.accepted) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{len(self.accepted)} events arrived, not {count}: "
                        f"{[g.type for g in self.accepted]} (unreadable: {self.unreadable})"
                    )
                self._arrived.wait(left)
            return list(self.accepted)

    def types(self) -> list[str]:
        with self._arrived:
            return [got.type for got in self.accepted]
