"""How stores turn documents into JSON text: fast, and never different in meaning.

A checkpoint is written at every phase boundary, so its encoding is on the hot path. orjson
writes the same JSON several times faster; anything it refuses (integers beyond 64 bits, keys
that are not strings) goes through the standard library instead, which accepts a superset. This
module must never be used for audit hashes: those depend on ``canonical_json``'s exact bytes.
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
