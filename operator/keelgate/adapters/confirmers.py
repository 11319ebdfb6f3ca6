"""The HTTP confirmer: asks the system of record, over HTTP, whether an unknown WRITE took effect.

A confirmer is trusted code (ADR-0004's amendment); this one needs no code in the step image, only
an endpoint in the system the WRITE changes: ``GET <url>``, with ``{idempotencyKey}``, ``{tool}``,
``{action}``, ``{run}`` and ``{tenant}`` filled in (URL-encoded), answering JSON with a boolean
``executed``. ``true`` settles the action as done, ``false`` abandons it; any other answer (an
error status, no such field, a timeout, a refused connection, an answer still coming at the time
limit: the exchange is cut then, whatever the server sends) leaves it for a person. The tool's
arguments are never sent, and a model's or a tool's own claim is never asked. It must never
raise: failing to know is a reason to leave the decision to a person. Its requests go where
``keelgate.adapters.network`` says, as the HTTP tool's do: the real network, unless a simulation
routes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from keelgate.adapters import network
from keelgate.core.cutoff import Cutoff
from keelgate.core.types import UnknownAction
from keelgate.errors import InputError

log = logging.getLogger("keelgate.confirmer")

FIELDS = ("idempotencyKey", "tool", "action", "run", "tenant")


class HttpConfirmer:
    """A Confirmer over one URL template (see the module's docstring)."""

    def __init__(self, url: str, *, timeout_seconds: float = 10.0, name: str = "") -> None:
        if not url.startswith(("http://", "https://")):
            raise InputError("--confirmer-url", "must be an http:// or https:// URL")
        try:
            url.format(**dict.fromkeys(FIELDS, "x"))
        except (KeyError, IndexError, ValueError):
            raise InputError(
                "--confirmer-url", f"may only name the fields {{{'}, {'.join(FIELDS)}}}"
            ) from None
        self.url = url
        self.timeout = timeout_seconds
        self.name = name or "http-confirmer"

    def confirm(
        self, tenant: str, run: str, action: UnknownAction, args: Mapping[str, Any]
    ) -> bool | None:
        values = {
            "idempotencyKey": action.idempotency_key,
            "tool": action.tool,
            "action": action.action,
            "run": run,
            "tenant": tenant,
        }
        url = self.url.format(**{k: quote(v, safe="") for k, v in values.items()})
        cutoff = Cutoff.after(self.timeout)  # the whole exchange, whatever the server sends
        try:
            with (
                cutoff,
                httpx.Client(
                    timeout=self.timeout,
                    transport=network.transport(url),  # None: the real network
                ) as client,
            ):
                answer = client.get(url, extensions={"trace": cutoff.trace})
        except httpx.HTTPError as error:
            why = "no whole answer in time" if cutoff.cut else type(error).__name__
            log.warning("%s: %s asked nothing (%s)", self.name, action.action, why)
            return None
        if answer.status_code != 200:
            return None
        try:
            executed = answer.json().get("executed")
        except (ValueError, AttributeError):
            return None
        return executed if isinstance(executed, bool) else None
