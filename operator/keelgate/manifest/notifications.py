"""Where the operator sends CloudEvents, and which: the catalogue of event types and the settings
of the sinks (``keelgate operator --notify-config FILE`` or ``--notify-sink URL``; the chart's
``notifications`` values).

Why it exists: people want to be told when a decision waits for them, is made or expires, and
when a run stops or finishes, where they already look (a chat channel, a pager, a workflow),
rather than watch a page. The event types are one catalogue under one reverse-DNS prefix, so a
sink that names a type that does not exist is refused at start in one line, never silently told
nothing. This module only describes and validates: it must never open a connection or read a
Secret (a sink's headers are files the chart mounts from one; ``keelgate.kube.runtime.sinks``
reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from keelgate.errors import InputError
from keelgate.manifest.base import HTTP_URL, KeelgateModel, rule_error
from keelgate.manifest.load import load_settings, parse

#: Every event type's prefix (reverse DNS of the API group, keelgate.dev).
PREFIX = "dev.keelgate."

RUN_STOPPED = PREFIX + "run.stopped"
RUN_SUCCEEDED = PREFIX + "run.succeeded"
RUN_FAILED = PREFIX + "run.failed"
RECONCILIATION_REQUESTED = PREFIX + "reconciliation.requested"
RECONCILIATION_SETTLED = PREFIX + "reconciliation.settled"
APPROVAL_REQUESTED = PREFIX + "approval.requested"
APPROVAL_APPROVED = PREFIX + "approval.approved"
APPROVAL_DENIED = PREFIX + "approval.denied"
APPROVAL_EXPIRED = PREFIX + "approval.expired"

#: The catalogue (docs/notifications.md describes each type's data).
EVENT_TYPES: tuple[str, ...] = (
    RUN_STOPPED,
    RUN_SUCCEEDED,
    RUN_FAILED,
    RECONCILIATION_REQUESTED,
    RECONCILIATION_SETTLED,
    APPROVAL_REQUESTED,
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
)

SINK_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Sink(KeelgateModel):
    """One receiver of the operator's CloudEvents."""

    name: Annotated[str, StringConstraints(pattern=SINK_NAME, max_length=63)] = Field(
        description="The sink's name, in logs and in the metrics' sink label."
    )
    url: Annotated[str, StringConstraints(pattern=HTTP_URL)] = Field(
        description="Where each event is POSTed."
    )
    types: list[str] = Field(
        default_factory=list,
        description="The event types it is sent (empty: every type in the catalogue).",
    )
    mode: Literal["structured", "binary"] = Field(
        default="structured",
        description="CloudEvents HTTP content mode: the whole event as application/cloudevents"
        "+json (structured), or its attributes in ce- headers and its data as the body (binary).",
    )
    timeout_seconds: float = Field(
        default=5.0, gt=0, le=300, description="How long one delivery attempt may take."
    )
    retry_for_seconds: float = Field(
        default=600.0,
        ge=0,
        le=86400,
        description="How long a failing delivery is tried again (backing off 1 s, doubling to "
        "60 s) before the event is dropped.",
    )
    headers_dir: str = Field(
        default="",
        description="A folder of files, each a header to send (its name the file's, its value "
        "the file's text): a Secret mounted there by the chart. Empty: no extra headers.",
    )
    include_arguments: bool = Field(
        default=False,
        description="Add the tool call's arguments (redacted) to the events about a decision.",
    )

    @field_validator("types")
    @classmethod
    def _known_types(cls, value: list[str]) -> list[str]:
        for index, name in enumerate(value):
            if name not in EVENT_TYPES:
                raise rule_error(
                    (index,), f"{name!r} is not an event type (known: {', '.join(EVENT_TYPES)})"
                )
        return value

    def wants(self, event_type: str) -> bool:
        return not self.types or event_type in self.types


class NotifySettings(KeelgateModel):
    """The operator's sinks and how it keeps what it has told."""

    source: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")] = Field(
        default="keelgate",
        description="The operator's name at the head of every event's source (the chart's: "
        "<namespace>/<release>); the same on every replica, so an event has one source.",
    )
    queue_size: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Events waiting for each sink at most; one more is dropped (and counted).",
    )
    state: str = Field(
        default="",
        description="NAMESPACE/NAME of a ConfigMap where the operator keeps how far its events "
        "are delivered, so that a new leader sends again what the last one could not. Empty: "
        "nothing is kept (a restart sends again nothing older than itself).",
    )
    sinks: list[Sink] = Field(default_factory=list, description="Where events go.")

    @field_validator("state")
    @classmethod
    def _namespaced(cls, value: str) -> str:
        if value and (value.count("/") != 1 or not all(value.split("/"))):
            raise ValueError("must be NAMESPACE/NAME")
        return value

    @field_validator("sinks")
    @classmethod
    def _distinct(cls, value: list[Sink]) -> list[Sink]:
        seen: set[str] = set()
        for index, sink in enumerate(value):
            if sink.name in seen:
                raise rule_error((index, "name"), f"{sink.name!r} is used by another sink")
            seen.add(sink.name)
        return value


def load_notify_settings(path: str | Path) -> NotifySettings:
    """Read the sinks from a YAML or JSON file (``--notify-config``); an empty file has none.
    Any problem is one InputError naming the file and the field."""
    return load_settings(NotifySettings, path)


def sink_from_url(url: str, *, index: int) -> Sink:
    """A ``--notify-sink URL``: every event type, structured mode, the defaults."""
    try:
        return parse(Sink, {"name": f"sink-{index}", "url": url}, source="--notify-sink")
    except InputError as error:
        raise InputError("--notify-sink", f"{url!r}: {error.reason}") from None
