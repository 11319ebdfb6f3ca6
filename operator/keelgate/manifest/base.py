"""Building blocks shared by every Keelgate manifest: the base model, constrained types, metadata.

The manifest models are the single source of truth for the CRD schemas, so every constraint is
declared as a type (pattern, bound, enum) that a JSON schema can carry, and every field has a
description. Field names are camelCase on the wire, like every Kubernetes API. This module must
never import a Kubernetes client or touch I/O: the CLI, the operator and the CRD generator all
import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from keelgate.core.values import (
    ACTION_ID,
    DECIMAL,
    INT64_MAX,
    SECONDS_MAX,
    NonNegativeInt,
    refuse_numbers,
)

API_VERSION = "keelgate.dev/v1alpha1"
#: Who created an AgentRun: in a cluster the admission policy makes it the creating user's own
#: name (set by a MutatingAdmissionPolicy where the API server has one, else checked) and keeps
#: it from changing; an approval rule with notCreator does not count that person's yes.
CREATED_BY_ANNOTATION = "keelgate.dev/created-by"

# Each pattern admits "" because Kubernetes manifests (and the contract's example) spell an
# unset optional string as "".
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
OPTIONAL_DNS_SUBDOMAIN = r"^(|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$"
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
CALLABLE = r"^(|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$"  # noqa: E501
ENV_NAME = r"^(|[A-Za-z_][A-Za-z0-9_]*)$"
HTTP_URL = r"^https?://[^\s/?#]+\S*$"
OPTIONAL_HTTP_URL = r"^(|https?://[^\s/?#]+\S*)$"
TIMESTAMP = r"^(|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2}))$"  # noqa: E501
QUANTITY = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"  # noqa: E501
CONDITION_TYPE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"  # noqa: E501
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
NOT_BLANK = r"\S"  # at least one character that is not white space
# A duration as Kubernetes spells one (metav1.Duration): 90s, 30m, 1h, 1h30m, 1.5h.
DURATION = r"^([0-9]+(\.[0-9]+)?(h|m|s))+$"
GROUP_NAME = r"^[^\x00-\x1f\x7f]+$"

# How a broken pattern reads to a person: the error message never shows a regular expression.
PATTERN_MEANINGS: dict[str, str] = {
    DNS_SUBDOMAIN: "must be a lowercase DNS name (a-z, 0-9, '-' and '.'; start and end with a "
    "letter or digit)",
    DNS_LABEL: "must be a lowercase DNS label (a-z, 0-9 and '-'; start and end with a letter "
    "or digit)",
    OPTIONAL_DNS_SUBDOMAIN: "must be empty or a lowercase DNS name (a-z, 0-9, '-' and '.')",
    TOOL_NAME: "must be 1-64 letters, digits, '_' or '-' (what model APIs accept)",
    CALLABLE: "must be 'package.module:function'",
    ENV_NAME: "must be an environment variable name (letters, digits and '_')",
    HTTP_URL: "must be an http:// or https:// URL",
    OPTIONAL_HTTP_URL: "must be empty or an http:// or https:// URL",
    DECIMAL: 'must be a non-negative decimal string such as "2.50"',
    ACTION_ID: "must be an action id such as '3:0' (iteration:index)",
    TIMESTAMP: "must be empty or an RFC 3339 time such as '2026-01-31T12:00:00Z'",
    QUANTITY: "must be a Kubernetes quantity such as '500m' or '1Gi'",
    CONDITION_TYPE: "must be a condition type such as 'Succeeded'",
    CONDITION_REASON: "must be a CamelCase reason such as 'WriteInFlight'",
    NOT_BLANK: "must not be empty or only white space",
    DURATION: "must be a duration such as '90s', '30m', '1h' or '1h30m'",
    GROUP_NAME: "must be a group name on one line",
}


class KeelgateModel(BaseModel):
    """Base of every manifest model: camelCase on the wire, unknown fields refused, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        # A model's validator is built when it is first used, not when its class is defined:
        # a step pod validates one spec and never pays for the status or settle models.
        defer_build=True,
    )


# A status is written by the operator (and by kopf, which may keep its progress under
# status.kopf), never by a user: a field Keelgate does not know there is not a typo to refuse.
STATUS_CONFIG = ConfigDict(**{**KeelgateModel.model_config, "extra": "ignore"})


def rule_error(loc: Sequence[str | int], reason: str) -> PydanticCustomError:
    """A cross-field rule's error. ``loc`` is relative to the model whose validator raises it
    (camelCase, list indexes as ints); ``keelgate.manifest.load`` appends it to the error's path
    so the user sees e.g. ``spec.model.script[2].actions[0].tool``."""
    at = format_loc(tuple(loc))
    return PydanticCustomError(
        "keelgate_rule",
        "{at}: {reason}" if at else "{reason}",
        {"at": at, "reason": reason, "loc": tuple(loc)},
    )


def format_loc(loc: Sequence[str | int]) -> str:
    """``('spec', 'tools', 1, 'sideEffect')`` -> ``spec.tools[1].sideEffect``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _json_values(value: Any, *, _depth: int = 0) -> Any:
    """Refuse anything a checkpoint could not store as JSON: bytes, NaN, non-string keys."""
    if _depth > 64:
        raise PydanticCustomError("json_value", "is nested too deeply")
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError("json_value", "must hold finite numbers only")
        return value
    if isinstance(value, list | tuple):
        return [_json_values(v, _depth=_depth + 1) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PydanticCustomError("json_value", "must have string keys only")
            out[key] = _json_values(item, _depth=_depth + 1)
        return out
    raise PydanticCustomError(
        "json_value", "must hold JSON values only (not {kind})", {"kind": type(value).__name__}
    )


def _quantity(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# A free-form JSON object (tool arguments, a JSON schema, an HTTP body): kept as given.
JsonObject = Annotated[
    dict[str, Any],
    AfterValidator(_json_values),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
DecimalString = Annotated[
    str,
    BeforeValidator(refuse_numbers),
    StringConstraints(pattern=DECIMAL),
    WithJsonSchema({"type": "string", "pattern": DECIMAL}),
]
Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    StringConstraints(pattern=QUANTITY),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
DnsSubdomain = Annotated[str, StringConstraints(max_length=253, pattern=DNS_SUBDOMAIN)]
DnsLabel = Annotated[str, StringConstraints(max_length=63, pattern=DNS_LABEL)]
OptionalDnsSubdomain = Annotated[
    str, StringConstraints(max_length=253, pattern=OPTIONAL_DNS_SUBDOMAIN)
]
ToolName = Annotated[str, StringConstraints(pattern=TOOL_NAME)]
CallableRef = Annotated[str, StringConstraints(pattern=CALLABLE)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME)]
HttpUrl = Annotated[str, StringConstraints(pattern=HTTP_URL)]
OptionalHttpUrl = Annotated[str, StringConstraints(pattern=OPTIONAL_HTTP_URL)]
Timestamp = Annotated[str, StringConstraints(pattern=TIMESTAMP)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
# Words a person or a model reads: something other than white space.
NotBlank = Annotated[str, StringConstraints(min_length=1, pattern=NOT_BLANK)]
# Bounded by int64 as NonNegativeInt is (keelgate.core.values, shared with the core's shapes).
PositiveInt = Annotated[StrictInt, Field(gt=0, le=INT64_MAX)]
# A time limit: a finite number of seconds, above zero, at most a year.
Seconds = Annotated[StrictFloat, Field(gt=0, le=SECONDS_MAX, allow_inf_nan=False)]
Duration = Annotated[str, StringConstraints(max_length=32, pattern=DURATION)]
GroupName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=GROUP_NAME)]


def duration_seconds(text: str) -> int | float:
    """The seconds a ``Duration`` (already matched: ``1h30m``, ``90s``, ``1.5h``) says; a whole
    number of them as an int."""
    total = 0.0
    number = ""
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        else:
            total += float(number) * {"h": 3600, "m": 60, "s": 1}[char]
            number = ""
    return int(total) if total == int(total) else total


class ObjectMeta(KeelgateModel):
    """Kubernetes object metadata. The fields a server adds are accepted, so an object read back
    from a cluster parses; any other field is a typo and refused."""

    name: DnsSubdomain = Field(description="The object's name; for an AgentRun, the run's name.")
    namespace: DnsLabel | None = Field(
        default=None, description="The namespace; for an AgentRun, the tenant. Default: default."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels, as in Kubernetes.")
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations; keelgate.dev/failpoints arms failpoints in step pods when "
        "the operator allows it.",
    )
    generate_name: str | None = Field(default=None, description="Set by Kubernetes clients.")
    uid: str | None = Field(default=None, description="Set by the API server.")
    resource_version: str | None = Field(default=None, description="Set by the API server.")
    generation: StrictInt | None = Field(default=None, description="Set by the API server.")
    creation_timestamp: str | None = Field(default=None, description="Set by the API server.")
    deletion_timestamp: str | None = Field(default=None, description="Set by the API server.")
    deletion_grace_period_seconds: StrictInt | None = Field(
        default=None, description="Set by the API server."
    )
    self_link: str | None = Field(default=None, description="Set by the API server.")
    owner_references: list[dict[str, Any]] = Field(
        default_factory=list, description="Owners, as in Kubernetes."
    )
    finalizers: list[str] = Field(default_factory=list, description="Finalizers.")
    managed_fields: list[dict[str, Any]] = Field(
        default_factory=list, description="Set by the API server."
    )


class Condition(KeelgateModel):
    """A status condition in the shape of metav1.Condition."""

    type: Annotated[str, StringConstraints(max_length=316, pattern=CONDITION_TYPE)] = Field(
        description="The condition's type, e.g. Succeeded or OutcomeUnknown."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(max_length=1024, pattern=CONDITION_REASON)] = Field(
        description="A CamelCase reason for the last transition."
    )
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        default="", description="A human-readable message."
    )
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )
    observed_generation: NonNegativeInt | None = Field(
        default=None, description="The .metadata.generation the condition was set from."
    )
