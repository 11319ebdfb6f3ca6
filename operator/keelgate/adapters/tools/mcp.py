"""The ``mcp`` tool: one tool of an MCP server, reached over streamable HTTP with the ``mcp`` SDK.

The manifest, not the server, says whether a tool is READ, PROPOSE or WRITE: MCP's readOnlyHint
and destructiveHint are a server's unverified claims, so they only produce warnings
(``hint_warnings``) when they disagree with the manifest. A WRITE or PROPOSE call carries its
idempotency key in the request's ``_meta`` under ``keelgate.dev/idempotency-key`` (or, for a
server that takes it as a parameter, in the argument named by ``key_argument``).

Each call runs its own short event loop (``asyncio.run``) and its own MCP session. The loop is
synchronous and a model call dwarfs a local handshake, while a per-call session holds nothing
between calls: no background thread or loop to stop, nothing half-open after a crash or a fork,
and a call cannot be confused with another's. A failure before the ``tools/call`` request was
sent (connection refused, handshake failed) is a definite ToolError; after it, a WRITE or PROPOSE
whose answer did not arrive is OutcomeUncertain and is never retried. The write deadline is checked
where the HTTP tool checks it: on the ``tools/call`` request itself, after its connection is made
and before its headers are written (an httpx2 request hook and httpcore's ``trace``), which also
records that the call may have sent something (``keelgate.core.fence``). The whole call (the
session, the request, its answer) ends at the tool's time limit and its write deadline, whatever
the server sends: a ``keelgate.core.cutoff.Cutoff`` closes the session's connections and cancels
its work then, and the call is a timeout. It must never put argument values or header values
into an error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar, cast

import anyio
import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    CallToolResult,
    RequestParamsMeta,
    ToolAnnotations,
)

from keelgate.adapters import network
from keelgate.adapters.tools.schema import ArgsSchema
from keelgate.core import fence, tracing
from keelgate.core.cutoff import Cutoff
from keelgate.core.types import ApprovalRule, SideEffect
from keelgate.errors import InputError, OutcomeUncertain, ToolError

KEY_META = "keelgate.dev/idempotency-key"
# JSON-RPC errors that mean the server refused the request as such: the tool never ran.
_REFUSED_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})
TEXT_CAP = 300
T = TypeVar("T")


@dataclass(frozen=True)
class RemoteTool:
    """What an MCP server says about one of its tools."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: ToolAnnotations | None = None


@dataclass(frozen=True)
class McpToolSpec:
    """One manifest entry naming a tool of an MCP server, with its declared side effect."""

    name: str
    side_effect: SideEffect
    remote_name: str | None = None
    requires_approval: bool = False
    description: str = ""
    timeout_seconds: float | None = None
    key_argument: str | None = None
    where: str = ""  # the manifest path errors name, e.g. spec.tools[2]
    approval: ApprovalRule | None = None


@dataclass(frozen=True)
class McpServerRef:
    """Where an MCP server is: its streamable-HTTP URL, headers (may hold credentials)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = fence.NETWORK_CALL_SECONDS

    def __repr__(self) -> str:  # headers may hold credentials
        return f"McpServerRef(url={self.url!r})"


class McpTool:
    def __init__(
        self,
        name: str,
        *,
        server: McpServerRef,
        side_effect: SideEffect,
        remote_name: str | None = None,
        requires_approval: bool = False,
        description: str = "",
        input_schema: Mapping[str, Any] | None = None,
        timeout_seconds: float | None = None,
        key_argument: str | None = None,
        warnings: Sequence[str] = (),
        where: str = "",
        approval: ApprovalRule | None = None,
    ) -> None:
        where = where or f"tools[{name}]"
        self.name = name
        self.server = server
        self.remote_name = remote_name or name
        self.side_effect = side_effect
        self.requires_approval = requires_approval or approval is not None
        self.approval = approval
        self.description = description
        self.key_argument = key_argument
        schema = dict(input_schema) if input_schema is not None else {"type": "object"}
        # The key is Keelgate's to supply, never the model's: hide it from the model's schema.
        self.input_schema: Mapping[str, Any] = _without(schema, key_argument)
        self._schema = ArgsSchema(self.input_schema, field=f"{where}.inputSchema")
        self.timeout_seconds = timeout_seconds or server.timeout_seconds
        self.warnings = tuple(warnings)

    def __repr__(self) -> str:
        return f"McpTool(name={self.name!r}, server={self.server.url!r})"

    @property
    def definition(self) -> Mapping[str, Any]:
        """What decides this tool's call (``keelgate.core.calls``): the server, the tool it
        calls there, the names of the headers sent (values may be rotated credentials) and
        the argument that carries the key."""
        return {
            "mcp.url": self.server.url,
            "mcp.tool": self.remote_name,
            "mcp.headers": sorted({name.lower() for name in self.server.headers}),
            "mcp.keyArgument": self.key_argument or "",
        }

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        self._schema.check(self.name, args)
        arguments = dict(args)
        meta_fields: dict[str, str] = dict(tracing.outgoing_headers())  # traceparent in _meta
        changes = fence.changes_things(self.side_effect, idempotency_key)
        if idempotency_key:
            meta_fields[KEY_META] = idempotency_key
            if self.key_argument:
                arguments[self.key_argument] = idempotency_key
        meta = cast(RequestParamsMeta, meta_fields) if meta_fields else None
        # Read here, not on the event loop: the call may run on a helper thread (run_sync). A
        # WRITE or PROPOSE with no call in reach is refused here, unsent.
        call = fence.for_sending(
            self.name,
            idempotency_key=idempotency_key,
            changes_things=changes,
        )
        return run_sync(lambda: self._call(arguments, meta, call, changes))

    async def _call(
        self,
        arguments: dict[str, Any],
        meta: RequestParamsMeta | None,
        call: fence.Invocation | None,
        changes: bool,
    ) -> Any:
        guard = _CallGuard(call)
        result: CallToolResult | None = None
        # The whole call (the session, the request, its answer) ends at the time limit, and a
        # WRITE's or PROPOSE's at its call's write deadline, whatever the server sends.
        cutoff = Cutoff.after(
            self.timeout_seconds, at_most=None if call is None else call.deadline.at
        )
        try:
            async with (
                _bounded(cutoff),
                _session(self.server, cutoff.remaining(), guard, cutoff) as client,
            ):
                result = await client.call_tool(self.remote_name, arguments, meta=meta)
        except Exception as error:
            if result is None and guard.refused is None:
                self._failed(error, guard, changes)
            # The answer arrived (or the fence refused the call); only closing the session, or
            # the SDK's handling of the refusal, failed.
        if guard.refused is not None:
            raise guard.refused  # the tools/call request was not sent
        assert result is not None
        return self._result(result, changes)

    def _failed(self, error: Exception, guard: _CallGuard, changes: bool) -> NoReturn:
        leaf = _leaf(error)
        kind = type(leaf).__name__
        if not guard.sent:
            raise ToolError(
                f"{self.name}: could not open a session with the MCP server "
                f"{self.server.url} ({kind}); nothing was sent"
            )
        if isinstance(leaf, MCPError) and leaf.code in _REFUSED_CODES:
            guard.took_no_effect()
            raise ToolError(f"{self.name}: the server refused the call: {_cap(leaf.error.message)}")
        why = f"{self.name}: no answer from the MCP server ({kind})"
        if isinstance(leaf, TimeoutError):
            why = f"{self.name}: no whole answer from the MCP server within its time limit"
        if not changes:
            raise ToolError(why)
        raise OutcomeUncertain(f"{why}; it may or may not have taken effect")

    def _result(self, result: CallToolResult, changes: bool) -> Any:
        if result.is_error:
            message = f"{self.name}: {_cap(_text(result)) or 'the tool reported an error'}"
            if not changes:
                raise ToolError(message)
            # isError says the call failed, not that nothing happened: MCP servers report any
            # exception raised mid-body this way, after side effects as well as before. For a
            # WRITE or PROPOSE that is not knowing, so it stops rather than letting a retry in.
            raise OutcomeUncertain(f"{message} (the server gave no word on side effects)")
        if result.structured_content is not None:
            return result.structured_content
        texts = [getattr(c, "text", None) for c in result.content]
        if len(texts) == 1 and isinstance(texts[0], str):
            try:
                return json.loads(texts[0])
            except ValueError:
                return texts[0]
        return [
            t if isinstance(t, str) else {"type": getattr(c, "type", "?")}
            for t, c in zip(texts, result.content, strict=True)
        ]


def discover(server: McpServerRef, specs: Sequence[McpToolSpec]) -> list[McpTool]:
    """Build the manifest's tools of one server, with descriptions and schemas from the server.

    A tool the server does not offer is an InputError naming the manifest entry. Where the
    server's hints disagree with the declared side effect, the tool carries ``warnings``.
    """
    remote = list_remote_tools(server)
    tools: list[McpTool] = []
    for spec in specs:
        where = spec.where or f"tools[{spec.name}]"
        found = remote.get(spec.remote_name or spec.name)
        if found is None:
            offered = ", ".join(sorted(remote)) or "none"
            raise InputError(
                f"{where}.mcp.tool",
                f"the MCP server offers no tool {spec.remote_name or spec.name!r} "
                f"(it offers: {offered})",
            )
        tools.append(
            McpTool(
                spec.name,
                server=server,
                side_effect=spec.side_effect,
                remote_name=found.name,
                requires_approval=spec.requires_approval,
                approval=spec.approval,
                description=spec.description or found.description,
                input_schema=found.input_schema,
                timeout_seconds=spec.timeout_seconds,
                key_argument=spec.key_argument,
                warnings=hint_warnings(where, spec.side_effect, found.annotations),
                where=where,
            )
        )
    return tools


def list_remote_tools(server: McpServerRef) -> dict[str, RemoteTool]:
    """Every tool the server lists (all pages). An unreachable server is a ToolError."""

    async def listing() -> dict[str, RemoteTool]:
        found: dict[str, RemoteTool] = {}
        cutoff = Cutoff.after(server.timeout_seconds)
        async with _bounded(cutoff), _session(server, cutoff.remaining(), None, cutoff) as client:
            cursor: str | None = None
            for _ in range(100):  # a server that pages forever is not followed forever
                page = await client.list_tools(cursor=cursor)
                for tool in page.tools:
                    found[tool.name] = RemoteTool(
                        tool.name, tool.description or "", dict(tool.input_schema), tool.annotations
                    )
                cursor = page.next_cursor
                if not cursor:
                    break
        return found

    try:
        return run_sync(listing)
    except Exception as error:
        raise ToolError(
            f"cannot list the tools of the MCP server {server.url} ({type(_leaf(error)).__name__})"
        ) from None


def hint_warnings(
    where: str, side_effect: SideEffect, annotations: ToolAnnotations | None
) -> list[str]:
    """Where the server's hints disagree with the manifest entry at ``where`` (its path).

    The manifest still decides; these are for the user's eyes (CLI warnings, Warning events)."""
    if annotations is None:
        return []
    read_only = annotations.read_only_hint
    destructive = annotations.destructive_hint
    if side_effect is SideEffect.READ and (read_only is False or destructive is True):
        what = "destructive" if destructive else "not read-only"
        return [
            f"{where}: declared READ, but the MCP server marks it {what}; it will be "
            "called without an idempotency key and without the WRITE rules"
        ]
    if side_effect is not SideEffect.READ and read_only is True:
        return [
            f"{where}: declared {side_effect.value}, but the MCP server marks it "
            "read-only; it will still be treated as a " + side_effect.value
        ]
    return []


def suggested_side_effect(annotations: ToolAnnotations | None) -> SideEffect | None:
    """The side effect the server's hints suggest, for diagnostics only (None: no hint)."""
    if annotations is None:
        return None
    if annotations.read_only_hint is True:
        return SideEffect.READ
    if annotations.read_only_hint is False or annotations.destructive_hint is not None:
        return SideEffect.WRITE
    return None


def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from synchronous code, on a fresh event loop.

    If this thread already runs a loop (an async caller such as an operator handler), the
    coroutine runs on a fresh loop in a helper thread instead: never nested, never shared.
    """

    async def main() -> T:
        return await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


class _CallGuard:
    """Watches a session's HTTP requests for the ``tools/call`` one and, right before its
    headers are written (after its connection is made, as the HTTP tool does), checks the
    write deadline and records the send (``Invocation.sending``). ``sent``: whether the call's
    request may have left; ``refused``: the fence's refusal, if it refused it (unsent).

    The SDK opens the request's connection when it sends it, which may be long after the
    session opened: a check before ``call_tool`` would leave that connect inside the window.
    """

    def __init__(self, call: fence.Invocation | None) -> None:
        self.call = call
        self.sent = False
        self.sends: list[fence.Send] = []
        self.refused: ToolError | None = None

    async def on_request(self, request: httpx2.Request) -> None:
        """An httpx2 ``request`` event hook: it runs for every request of the session,
        redirects included, before its connection is taken (after the cutoff's hook, whose
        trace it keeps)."""
        if request.method == "POST" and _is_tool_call(request.content):
            traced = request.extensions.get("trace")

            async def trace(event: str, info: Mapping[str, Any]) -> None:
                if traced is not None:
                    await traced(event, info)
                await self._before_sending(event, info)

            request.extensions = {**request.extensions, "trace": trace}

    async def _before_sending(self, event: str, info: Mapping[str, Any]) -> None:
        if not event.endswith(".send_request_headers.started"):
            return
        if self.call is not None:
            try:
                self.sends.append(self.call.sending())
            except ToolError as refused:
                self.refused = refused
                raise
        self.sent = True

    def took_no_effect(self) -> None:
        """The server answered the call with a definite refusal: it changed nothing."""
        for send in self.sends:
            send.refused()


def _is_tool_call(body: bytes) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("method") == "tools/call"


@asynccontextmanager
async def _bounded(cutoff: Cutoff) -> AsyncIterator[None]:
    """Run the block until ``cutoff``: its alarm cancels the block (from the alarm's thread,
    through the event loop) and shuts the connections it reported, then ``TimeoutError``."""
    loop = asyncio.get_running_loop()
    with cutoff, anyio.CancelScope() as scope:
        cutoff.close_with(lambda: loop.call_soon_threadsafe(scope.cancel))
        yield
    if scope.cancelled_caught:
        raise TimeoutError("cut at its time limit")


class _session:
    """An open MCP client session over streamable HTTP, closed with its HTTP client. With a
    ``guard``, its ``tools/call`` request is checked against the write deadline; every
    connection it makes is given to ``cutoff``, which shuts it at the time limit."""

    def __init__(
        self,
        server: McpServerRef,
        timeout: float,
        guard: _CallGuard | None,
        cutoff: Cutoff,
    ) -> None:
        async def traced(request: httpx2.Request) -> None:
            # Before the guard's hook, which adds its own check to the tools/call request.
            request.extensions = {**request.extensions, "trace": cutoff.atrace}

        hooks = {"request": [traced, *([guard.on_request] if guard is not None else [])]}
        self.http = httpx2.AsyncClient(
            headers=dict(server.headers),
            timeout=httpx2.Timeout(timeout),
            follow_redirects=False,
            event_hooks=hooks,
            transport=network.transport(server.url, network.HTTPX2_ASYNC),  # None: real
        )
        self.client = Client(
            streamable_http_client(server.url, http_client=self.http),
            read_timeout_seconds=timeout,
            cache=None,
        )

    async def __aenter__(self) -> Client:
        await self.http.__aenter__()
        try:
            return await self.client.__aenter__()
        except BaseException:
            await self.http.aclose()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.client.__aexit__(*exc)
        finally:
            await self.http.aclose()


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside the exception groups that anyio task groups wrap."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        mcp_errors = [e for e in error.exceptions if isinstance(_leaf(e), MCPError)]
        error = mcp_errors[0] if mcp_errors else error.exceptions[0]
    return error


def _without(schema: dict[str, Any], key: str | None) -> dict[str, Any]:
    if not key:
        return schema
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if k != key}
    required = [r for r in (schema.get("required") or []) if r != key]
    return {**schema, "properties": properties, "required": required}


def _text(result: CallToolResult) -> str:
    return " ".join(t for t in (getattr(c, "text", None) for c in result.content) if t)


def _cap(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= TEXT_CAP else text[: TEXT_CAP - 3] + "..."
