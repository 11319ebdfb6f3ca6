"""The bounds and constrained types of the core's values, shared with the manifest.

Why it exists: a shape the core keeps (a checkpoint, an approval's decision, a spend) and the
manifest field or CLI flag a person fills it from must refuse the same things, in the same words;
so the rule is stated here once (int64 integers as the API server keeps them, a year as the
longest time limit, exact dollars from a decimal string, a person's name on one line) and the
manifest builds on it. How these values become JSON is ``keelgate.core.json_codec``'s. This
module must never loosen a bound a stored record relies on: a record written under a tighter
rule would read differently.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from keelgate.errors import InputError

# The largest integer an API server field holds (int64): manifests and CLI flags stop there.
INT64_MAX = 2**63 - 1
# The longest time limit any field or flag takes: a year. No call or run needs longer, and past
# about 9e9 s Python's thread joins and timers overflow, which would turn a WRITE's timeout into
# an unknown outcome after the WRITE ran.
SECONDS_MAX = 365 * 24 * 3600

DECIMAL = r"^[0-9]+(\.[0-9]+)?$"
ACTION_ID = r"^[0-9]+:[0-9]+$"

# The API server keeps integers as int64: a larger one would mean something else in a cluster
# (or nothing), so it is refused here too, naming the field.
NonNegativeInt = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
NonNegativeFloat = Annotated[StrictFloat, Field(ge=0)]
ActionId = Annotated[str, StringConstraints(pattern=ACTION_ID)]
#: How many different people an approval rule may ask for (a rule asking more is a typo).
MAX_APPROVERS = 16
PositiveCount = Annotated[StrictInt, Field(ge=1, le=MAX_APPROVERS)]
#: The most decisions one action takes (a person may decide again once their approval expired;
#: a rule asks at most ``MAX_APPROVERS`` people): the checkpoint's and the Approval object's bound.
MAX_DECISIONS = 4 * MAX_APPROVERS
#: The most groups a decision may name (the API server's list for one person; a checkpoint and
#: an Approval object keep them with the decision).
MAX_GROUPS = 64
#: The longest name a record keeps: who decided, a group (a DNS subdomain's bound; Kubernetes
#: puts none on a user's or a group's spelling, this one keeps a checkpoint and a status small).
NAME_MAX = 253
#: A group the API server authenticates people in.
GroupName = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX)]
#: A positive time, in seconds, up to a year (a whole number read as one is kept a float).
PositiveSeconds = Annotated[float, Field(gt=0, le=SECONDS_MAX, allow_inf_nan=False)]


def one_line(text: str, field: str, what: str) -> str:
    """``text`` if a record can keep it as a name (who decided, a group): not blank, one line of
    at most ``NAME_MAX`` printable characters, valid UTF-8; else an ``InputError`` naming
    ``field``, in one line. ``what`` is what the text should name ("the person deciding")."""
    if not text.strip():
        raise InputError(field, f"must name {what}")
    if len(text) > NAME_MAX or any(ord(c) < 32 or ord(c) == 127 for c in text):
        # Shown as Python writes it (one line whatever it holds), cut short if long.
        shown = repr(text) if len(text) <= 64 else f"{text[:64]!r}..."
        raise InputError(
            field, f"must be one line of at most {NAME_MAX} printable characters, not {shown}"
        )
    if any("\ud800" <= c <= "\udfff" for c in text):
        # What Python makes of bytes that are not UTF-8 (a terminal in another encoding): they
        # cannot be stored, so the name would be lost, or the store's write fail, mid-settle.
        raise InputError(field, "is not valid UTF-8 text (check the terminal's encoding)")
    return text


def refuse_numbers(value: Any) -> Any:
    """Money is read from a decimal string only: a YAML or JSON number is a binary float, and
    0.1 is not 0.1."""
    if isinstance(value, bool | int | float):
        raise PydanticCustomError(
            "decimal_string", 'must be a quoted decimal string such as "2.50", not a number'
        )
    return value


#: Exact dollars, written as a decimal string (never a binary float).
Dollars = Annotated[
    Decimal,
    BeforeValidator(refuse_numbers),
    Field(ge=0),
    WithJsonSchema({"type": "string", "pattern": DECIMAL}),
]
