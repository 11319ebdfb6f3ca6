"""The Event recorder: what reconciles tell people, as core/v1 Events, posted after the work.

Why it exists: an Event tells a person what happened; it must never stand between one step
pod's end and the creation of the next (each Event is an API write). So within ``deferred()``
(one reconcile, in one worker thread) Events are kept and posted when the reconcile ends, in the
order recorded; outside it they are posted at once. Posting is best effort (``ApiServer.event``
logs a refusal). This module must never put a tool's argument or a secret into a message.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from keelgate.kube.controller.ports import ApiServer

# (the object it is about, Normal or Warning, reason, message)
_Event = tuple[Mapping[str, Any], str, str, str]


class EventRecorder:
    def __init__(self, api: ApiServer) -> None:
        self._api = api
        self._kept = threading.local()  # each worker thread's Events, posted after its work

    def normal(self, involved: Mapping[str, Any], reason: str, message: str) -> None:
        self._record((involved, "Normal", reason, message))

    def warning(self, involved: Mapping[str, Any], reason: str, message: str) -> None:
        self._record((involved, "Warning", reason, message))

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Keep this thread's Events until the block ends, then post them (even if it raised:
        what happened before the error happened)."""
        self._kept.events = []
        try:
            yield
        finally:
            kept: list[_Event] = self._kept.events
            self._kept.events = None
            for event in kept:
                self._post(event)

    def _record(self, event: _Event) -> None:
        kept: list[_Event] | None = getattr(self._kept, "events", None)
        if kept is None:
            self._post(event)
        else:
            kept.append(event)

    def _post(self, event: _Event) -> None:
        involved, type_, reason, message = event
        self._api.event(involved, type_=type_, reason=reason, message=message)
