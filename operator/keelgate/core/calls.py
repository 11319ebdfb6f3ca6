"""What a call is: the parts of a tool's definition that decide what its call does.

An approval is given for a call as it will be sent. The idempotency key names the tool and the
arguments; what the tool then does with them is its definition: the HTTP method, URL, header names
and body template of an ``http`` tool, the server and remote tool of an ``mcp`` one, the callable
of a ``python`` one (and the step image it is loaded from, when a run names one), and the confirmer
that would vouch for the call's outcome. A saved action keeps the digests of those parts
(``Action.definition``); a decision names the fingerprint of the definition it was made on
(``Decision.definition``). A manifest edit that changes a part after a decision voids the decision
(the gate asks again, and the chain says which parts changed), and no call goes out under a
definition other than the one its action is bound to (the gateway checks before its claim). Only
digests are kept: a URL or a callable's name stays in the manifest, never in a decision, an event
or a status. This module must never leave out a part that decides where a call goes or what it does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from keelgate.core.protocols import Confirmer, Tool
from keelgate.core.types import canonical_json

#: A definition: part name ("http.url") -> the digest of its value.
Definition = Mapping[str, str]

#: How long each digest is (hex digits): enough to tell two values apart, short in a checkpoint.
_DIGEST = 16


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:_DIGEST]


def parts_of(tool: Tool) -> Mapping[str, Any]:
    """What decides the effect of ``tool``'s call, as named values: the tool's own
    ``definition`` (the built-in tools give theirs), else its class and, for a plain function
    behind it, the function's module and name (a tool written before definitions)."""
    given = getattr(tool, "definition", None)
    if isinstance(given, Mapping) and given:
        return given
    kind = type(tool)
    parts: dict[str, Any] = {"tool.class": f"{kind.__module__}.{kind.__qualname__}"}
    function = getattr(tool, "function", None)
    if callable(function):
        parts["python.callable"] = callable_name(function)
    return parts


def callable_name(function: Any) -> str:
    """A function as a definition names it (``module:qualname``), for a tool that has no name
    of it from a manifest."""
    module = getattr(function, "__module__", None) or "?"
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{module}:{name}"


#: The parts that name the confirmer, not the tool.
CONFIRMER_PARTS = frozenset({"confirmer"})


def confirmer_parts(confirmer: Confirmer | None) -> Mapping[str, Any]:
    """The confirmer that would vouch for a call whose outcome is unknown: its name, and what it
    asks (an HTTP confirmer's URL; a Python one's class). None: no part (a person settles)."""
    if confirmer is None:
        return {}
    kind = type(confirmer)
    return {
        "confirmer": {
            "name": confirmer.name,
            "class": f"{kind.__module__}.{kind.__qualname__}",
            "url": str(getattr(confirmer, "url", "") or ""),
        }
    }


def definition_of(tool: Tool, confirmer: Confirmer | None = None) -> Definition:
    """The digests of what decides ``tool``'s call (``confirmer``: the one the run has)."""
    parts = {**parts_of(tool), **confirmer_parts(confirmer)}
    return {name: _digest(value) for name, value in sorted(parts.items())}


def fingerprint(definition: Definition) -> str:
    """One digest of a whole definition ("" for none: an action saved before definitions)."""
    return _digest(dict(definition)) if definition else ""


def changed_parts(before: Definition, after: Definition) -> list[str]:
    """The names of the parts that differ between two definitions, sorted."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
