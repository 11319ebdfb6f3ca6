"""A real MCP server (the ``mcp`` SDK's MCPServer over streamable HTTP) on 127.0.0.1.

It offers a READ tool (``stock``) and a WRITE tool (``place_order``) that counts calls by the
idempotency key it finds in the request's ``_meta``, so tests can ask it, as a confirmer would,
how many times an order really arrived. Hints are set on purpose: ``stock`` says read-only and
``place_order`` destructive; ``wipe`` is destructive and always fails; ``place_order_keyed``
takes the key as a parameter instead. With ``trickle_pace`` set, the answer to every
``tools/call`` trickles, a byte every ``trickle_pace`` seconds (the tool has run by then), until
the client hangs up (noted in ``hangups``, monotonic time); with ``initialize_delay`` set, a
session's opening request (``initialize``, or ``server/discover``, which the SDK sends instead
since the stateless protocol) is answered that many seconds late.
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
        self.trickle_pace = 0.0
        self.initialize_delay = 0.0
        self.hangups: list[float] = []
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
            _Trickling(server.streamable_http_app(), self),
            log_level="warning",
            lifespan="on",
            access_log=False,
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


Message = dict[str, Any]


class _Trickling:
    """ASGI middleware: the answer to a ``tools/call`` sent a byte at a time when the fake's
    ``trickle_pace`` is set, stopping when the client hangs up; a session's opening request
    answered ``initialize_delay`` seconds late."""

    def __init__(self, app: Any, fake: McpFake) -> None:
        self.app = app
        self.fake = fake

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        pace, delay = self.fake.trickle_pace, self.fake.initialize_delay
        if scope["type"] != "http" or scope["method"] != "POST" or not (pace or delay):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        gone = asyncio.Event()

        async def replayed() -> Message:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        if b'"initialize"' in body or b'"server/discover"' in body:
            await asyncio.sleep(delay)
        if b'"tools/call"' not in body or not pace:
            await self.app(scope, replayed, send)
            return

        finished: list[bool] = []

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not finished:  # uvicorn says "disconnect" after a whole answer too
                self.fake.hangups.append(time.monotonic())
            gone.set()

        async def trickled(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            data = message.get("body", b"")
            for index in range(len(data)):
                if gone.is_set():
                    return
                piece = data[index : index + 1]
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await asyncio.sleep(pace)
            if not message.get("more_body") and not gone.is_set():
                finished.append(True)
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, replayed, trickled)
        finally:
            watcher.cancel()
