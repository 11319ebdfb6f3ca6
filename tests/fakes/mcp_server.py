"""A real MCP server (the ``mcp`` SDK's MCPServer over streamable HTTP) on 127.0.0.1.

It offers a READ tool (``stock``) and a WRITE tool (``place_order``) that counts calls by the
idempotency key it finds in the request's ``_meta``, so tests can ask it, as a confirmer would,
how many times an order really arrived. Hints are set on purpose: ``stock`` says read-only and
``place_order`` destructive; ``wipe`` is destructive and always fails; ``place_order_keyed``
takes the key as a parameter instead.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

KEY_META = "keelgate.dev/idempotency-key"


class McpFake:
    def __init__(self) -> None:
        self.orders: Counter[str] = Counter()
        self.seen_meta: list[dict[str, Any]] = []
        self.slow_seconds = 0.0
        server = MCPServer("keelgate-fake")
        fake = self

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        def stock(sku: str) -> dict[str, Any]:
            """How many of a SKU are in stock."""
            return {"sku": sku, "count": 3}

        @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
        async def place_order(sku: str, qty: int, ctx: Context) -> dict[str, Any]:
            """Order qty of a SKU."""
            meta = dict(ctx.request_context.meta or {})
            fake.seen_meta.append(meta)
            if fake.slow_seconds:
                await asyncio.sleep(fake.slow_seconds)
            key = str(meta.get(KEY_META, ""))
            fake.orders[key] += 1
            return {"ordered": qty, "sku": sku}

        @server.tool()
        def place_order_keyed(sku: str, qty: int, idempotency_key: str) -> dict[str, Any]:
            """Order qty of a SKU; the caller passes its idempotency key as a parameter."""
            fake.orders[idempotency_key] += 1
            return {"ordered": qty, "sku": sku}

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        def wipe(table: str) -> str:
            """Delete everything in a table."""
            raise ValueError(f"refusing to wipe {table}")

        self.server = server
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(
            server.streamable_http_app(), log_level="warning", lifespan="on", access_log=False
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> McpFake:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._uvicorn.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP fake did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
