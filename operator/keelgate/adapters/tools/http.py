"""The ``http`` tool: one HTTP endpoint, its URL filled from the arguments, called with httpx.

It exists so a manifest can give an agent a REST call without code. Its one hard rule is the
ADR's: when it cannot know whether a WRITE or PROPOSE reached the server and took effect (a
timeout or a reset after the request may have been sent, a 5xx), it raises OutcomeUncertain and
never retries; only a failure that provably sent nothing (connection refused) or a 4xx is a
definite ToolError. Each WRITE and PROPOSE sends its key as ``Idempotency-Key`` so the downstream
service can deduplicate, and checks its write deadline right before the request's first byte is
written (httpcore's ``trace`` extension), so a process held up past it sends nothing
(``keelgate.core.fence``); the same moment records that its call may have sent something. The
whole exchange ends at ``timeout_seconds``, and a WRITE's or PROPOSE's at its write deadline,
whatever the server sends (``keelgate.core.cutoff``: httpx's timeout bounds each read, and a
server trickling its answer would never trip it); a request cut there is a timeout. Asked to
send for a WRITE or PROPOSE with no write deadline in reach (a thread a composite tool started
without ``keelgate.fenced``), it refuses. It must never put argument values or header values
into an error.
"""

from __future__ import annotations

import json
import ssl
import string
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import httpx

from keelgate.adapters import network
from keelgate.adapters.tools.schema import ArgsSchema
from keelgate.core import fence, tracing
from keelgate.core.cutoff import Cutoff
from keelgate.core.types import ApprovalRule, SideEffect
from keelgate.errors import InputError, OutcomeUncertain, ToolError

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", *BODY_METHODS})
IDEMPOTENCY_HEADER = "Idempotency-Key"
SNIPPET_CAP = 200

# Failures that prove no byte of the request reached the server: the connection was never made
# (refused, unresolvable, TLS or proxy handshake failed, no free connection) or the request was
# refused locally before sending.
_NOTHING_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
    httpx.InvalidURL,
)


def _no_tls() -> ssl.SSLContext:
    """The TLS context of a tool whose URL is plain http: no certificate authority loaded, so
    the certificate of any TLS connection made with it fails verification. None is ever made
    (the URL's scheme and host are fixed, redirects are not followed); loading the system's
    authorities for it was a quarter of a step pod's CPU at the call (docs/performance.md)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class HttpTool:
    """``method url`` with ``{placeholders}`` filled from the arguments (URL-escaped).

    The remaining arguments are the JSON body for POST, PUT and PATCH, and the query string for
    the other methods. ``headers`` are sent as given (they may carry credentials, so they are
    never shown). Without an ``input_schema``, one is derived that requires each placeholder.
    ``where`` is the manifest path that errors in these settings name (``spec.tools[1]``).
    """

    def __init__(
        self,
        name: str,
        *,
        url: str,
        method: str = "GET",
        side_effect: SideEffect = SideEffect.READ,
        requires_approval: bool = False,
        approval: ApprovalRule | None = None,
        description: str = "",
        input_schema: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = fence.NETWORK_CALL_SECONDS,
        where: str = "",
    ) -> None:
        where = where or f"tools[{name}]"  # the manifest path errors name
        self.name = name
        self.method = method.upper()
        if self.method not in METHODS:
            raise InputError(f"{where}.http.method", f"unknown HTTP method {method!r}")
        self.url = url
        self.placeholders = _placeholders(url, field=f"{where}.http.url")
        parts = urlsplit(url.replace("{", "").replace("}", ""))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(f"{where}.http.url", "must be an absolute http(s) URL")
        self.where = f"{self.method} {parts.scheme}://{parts.netloc}"
        self._tls = parts.scheme == "https"
        self.side_effect = side_effect
        self.requires_approval = requires_approval or approval is not None
        self.approval = approval
        self.description = description or f"{self.method} {url}"
        self.input_schema: Mapping[str, Any] = (
            dict(input_schema) if input_schema is not None else _derived_schema(self.placeholders)
        )
        self._schema = ArgsSchema(self.input_schema, field=f"{where}.inputSchema")
        self.headers = dict(headers or {})
        if timeout_seconds <= 0:
            raise InputError(f"{where}.timeoutSeconds", "must be more than 0")
        self.timeout_seconds = timeout_seconds
        # No kept-alive connections: every request opens its own, so a failure to connect really
        # means nothing was sent (a pooled connection the server had closed would blur that).
        # The client itself is reused because building one (its TLS context) is slow, and it is
        # built at the first call: a step pod that does not call this tool never pays for it.
        # httpx never retries a request.
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                timeout=self.timeout_seconds,
                follow_redirects=False,
                limits=httpx.Limits(max_keepalive_connections=0),
                verify=True if self._tls else _no_tls(),
                transport=network.transport(self.url),  # None: the real network
            )
        return self._client

    def __repr__(self) -> str:  # headers may hold credentials
        return f"HttpTool(name={self.name!r}, {self.where})"

    @property
    def definition(self) -> Mapping[str, Any]:
        """What decides this tool's call (``keelgate.core.calls``): its method, URL template,
        the names of its headers (their values may be credentials, rotated without changing
        what the call does) and its body (none: the arguments are the body)."""
        return {
            "http.method": self.method,
            "http.url": self.url,
            "http.headers": sorted({name.lower() for name in self.headers}),
            "http.body": None,
        }

    def invoke(self, args: Mapping[str, Any], *, idempotency_key: str | None) -> Any:
        self._schema.check(self.name, args)
        url, rest = self._fill(args)
        headers = dict(self.headers)
        headers.update(tracing.outgoing_headers())  # traceparent: the call joins the run's trace
        changes = fence.changes_things(self.side_effect, idempotency_key)
        if idempotency_key:
            headers[IDEMPOTENCY_HEADER] = idempotency_key
        request: dict[str, Any] = {"headers": headers}
        if self.method in BODY_METHODS:
            request["json"] = rest
        elif rest:
            request["params"] = _query(rest)
        # A request for a WRITE or PROPOSE with no call in reach is refused here, unsent.
        call = fence.for_sending(self.name, idempotency_key=idempotency_key, changes_things=changes)
        sends: list[fence.Send] = []  # what this request recorded as sent (a proxy's CONNECT too)
        # The whole exchange ends at the time limit, and a WRITE's or PROPOSE's at its call's
        # write deadline, whatever the server sends; httpx's own timeout bounds each operation.
        cutoff = Cutoff.after(
            self.timeout_seconds, at_most=None if call is None else call.deadline.at
        )
        request["timeout"] = cutoff.remaining()
        request["extensions"] = {"trace": _checks_before_sending(call, sends, cutoff)}
        with cutoff:
            try:
                response = self._exchange(url, request, cutoff)
            except ToolError:
                raise  # the fence refused the request (its deadline passed): it was not sent
            except _NOTHING_SENT as error:
                _took_no_effect(sends)
                raise ToolError(
                    f"{self.name}: {self.where} failed before anything was sent "
                    f"({type(error).__name__})"
                ) from None
            except Exception as error:  # a timeout, a reset, anything mid-exchange
                if cutoff.cut or isinstance(error, _Cut):
                    self._unsure(f"no whole answer within its time limit: {_CUT}", changes)
                if isinstance(error, httpx.TimeoutException):
                    self._unsure(
                        f"no answer within {self.timeout_seconds}s ({type(error).__name__})",
                        changes,
                    )
                self._unsure(f"the exchange broke off ({type(error).__name__})", changes)
        if 400 <= response.status_code < 500:
            _took_no_effect(sends)  # a definite refusal: this request changed nothing
        return self._result(response, changes)

    def _exchange(self, url: str, request: dict[str, Any], cutoff: Cutoff) -> httpx.Response:
        """The request and its whole answer, read in pieces that each ask ``cutoff`` whether
        the exchange is over (its alarm also shuts the connection, which ends a blocked read)."""
        sent = self.client.build_request(self.method, url, **request)
        streamed = self.client.send(sent, stream=True)
        try:
            raw = bytearray()
            for chunk in streamed.iter_raw():
                if cutoff.passed:
                    raise _Cut
                raw += chunk
        finally:
            streamed.close()
        # The raw bytes, decoded as the headers say (gzip ...), as httpx reads a whole answer.
        return httpx.Response(
            streamed.status_code, headers=streamed.headers, content=bytes(raw), request=sent
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _unsure(self, why: str, changes: bool) -> NoReturn:
        message = f"{self.name}: {self.where}: {why}"
        if changes:
            raise OutcomeUncertain(f"{message}; it may or may not have taken effect")
        raise ToolError(message)

    def _result(self, response: httpx.Response, changes: bool) -> Any:
        status = response.status_code
        if 200 <= status < 300:
            return _body(response)
        snippet = _snippet(response)
        if 400 <= status < 500:
            raise ToolError(f"{self.name}: HTTP {status}{': ' + snippet if snippet else ''}")
        # A 5xx (or an unexpected 1xx/3xx) says nothing certain about whether a change happened.
        self._unsure(f"HTTP {status}{': ' + snippet if snippet else ''}", changes)

    def _fill(self, args: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        values: dict[str, str] = {}
        for name in self.placeholders:
            if name not in args or args[name] is None:
                raise ToolError(f"{self.name}: argument {name!r} is needed for the URL")
            values[name] = quote(_scalar(args[name]), safe="")
        rest = {k: v for k, v in args.items() if k not in self.placeholders}
        return self.url.format_map(values), rest


class _Cut(Exception):
    """The answer was still coming when the exchange's time limit came."""


_CUT = "the exchange was cut (the server was still sending)"


def _checks_before_sending(
    call: fence.Invocation | None, sends: list[fence.Send], cutoff: Cutoff
) -> Any:
    """An httpcore ``trace`` callback that gives ``cutoff`` each connection made and, for a
    call under a deadline (a WRITE, a PROPOSE, a READ let through on approvals that expire),
    checks the deadline right before the request's headers are written (after the connection
    is made, before any byte of the request leaves) and records in ``sends`` that the call may
    have sent something from then on."""

    def trace(event: str, info: Mapping[str, Any]) -> None:
        cutoff.trace(event, info)
        if call is not None and event.endswith(".send_request_headers.started"):
            sends.append(call.sending())

    return trace


def _took_no_effect(sends: list[fence.Send]) -> None:
    """The request's answer says it changed nothing (a 4xx, or a failure that sent nothing):
    it no longer counts as something its call may have done."""
    for send in sends:
        send.refused()


def _placeholders(url: str, *, field: str) -> tuple[str, ...]:
    names: list[str] = []
    try:
        for _, name, spec, conversion in string.Formatter().parse(url):
            if name is None:
                continue
            if not name.isidentifier() or spec or conversion:
                raise InputError(field, f"placeholder {{{name}}} must be a plain argument name")
            if name not in names:
                names.append(name)
    except ValueError as error:
        raise InputError(field, f"bad URL template: {error}") from None
    return tuple(names)


def _derived_schema(placeholders: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {p: {"type": ["string", "integer", "number"]} for p in placeholders},
        "required": list(placeholders),
    }


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _query(rest: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for key, value in rest.items():
        items = value if isinstance(value, list) else [value]
        pairs.extend((key, _scalar(item)) for item in items if item is not None)
    return pairs


def _body(response: httpx.Response) -> Any:
    if not response.content:
        return {"status": response.status_code}
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except ValueError:
            pass
    return response.text


def _snippet(response: httpx.Response) -> str:
    try:
        text = response.text
    except Exception:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CAP else text[: SNIPPET_CAP - 3] + "..."
