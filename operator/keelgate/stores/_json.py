"""How stores turn documents into JSON text and back: fast, and never different in meaning.

A checkpoint is written at every phase boundary, so its encoding is on the hot path; a long
audit chain is read back event by event. orjson writes and reads the same JSON several times
faster; anything it refuses (integers beyond 64 bits, keys that are not strings, NaN) goes
through the standard library instead, which accepts a superset. This module must never be used
for audit hashes: those depend on ``canonical_json``'s exact bytes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact JSON text for ``value``."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), check_circular=False)


def loads(text: str | bytes) -> Any:
    """The value of JSON ``text``, as ``json.loads`` gives it (a ``ValueError`` if it is not
    JSON). orjson refuses what the standard library still reads (integers beyond 64 bits,
    ``NaN``), and those are read by the standard library."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
