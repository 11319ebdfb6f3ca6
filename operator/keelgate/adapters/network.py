"""Where the adapters' HTTP requests go: the real network, or a simulation's.

Why it exists: the simulator (``keelgate.testing.sim``) runs the product's own HTTP tool, MCP tool
and model adapters, unchanged, on virtual time: their time limits, retries, status handling and
write-deadline checks are the ones a step pod runs. Only where their bytes go differs. Each
adapter asks for a transport when it makes its client, naming the client library it uses
(``HTTPX``: the HTTP tool's; ``HTTPX2``: the model SDKs'; ``HTTPX2_ASYNC``: the MCP SDK's); None,
what a production process always gets, means the library's own transport over real sockets. Only
a simulation sets the route, for a block (``simulated``), as ``keelgate.core.clocks`` is set.

This module must never hold anything but the route, and never be set outside a simulation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

HTTPX = "httpx"  # an httpx.BaseTransport
HTTPX2 = "httpx2"  # an httpx2.BaseTransport
HTTPX2_ASYNC = "httpx2-async"  # an httpx2.AsyncBaseTransport

#: (URL, library) -> a transport of that library for the URL (None: the real network).
_route: Callable[[str, str], Any] | None = None


def transport(url: str, library: str = HTTPX) -> Any:
    """The transport of ``library`` a client for ``url`` uses (None: the library's own, the real
    network)."""
    return None if _route is None else _route(url, library)


@contextmanager
def simulated(route: Callable[[str, str], Any]) -> Iterator[None]:
    """Send every adapter's requests where ``route`` says for the block (a simulation's
    network), then give the real network back."""
    global _route
    saved, _route = _route, route
    try:
        yield
    finally:
        _route = saved
