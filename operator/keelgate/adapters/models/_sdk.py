"""What the SDK-backed chat providers (``openai``, ``anthropic``) share: the key rule, the call
with retries, the reading of SDK errors, and the turning of a reply into a plan or a verdict.

Why it exists: the two adapters carried the same constructor, call, error classification and
reply rules side by side, and two copies of a rule drift. A provider module now keeps only its
wire form (``payload``), how it calls its SDK (``_create``), and how it reads its reply into the
neutral pieces ``planned_reply`` takes (text, tool calls, cut off, refused, usage). Both SDKs
name their errors alike (``APITimeoutError``, ``APIConnectionError``, ``APIStatusError``).

Each try of a call ends at ``timeout_seconds`` whatever the server sends (a reply trickled a
byte at a time included): the SDKs' own timeout bounds each read, so every connection a try
makes is given to a ``keelgate.core.cutoff.Cutoff`` that shuts it at the limit, and the try is
then a transient failure like a timeout.

This module must never log or repeat the API key, never retry anything but the model call itself
(``_retry``), and never act on a reply that was cut off: half a tool call is not a plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from types import ModuleType
from typing import Any, ClassVar, Required, TypedDict

import httpx2

from keelgate.adapters import network
from keelgate.adapters.models import _prompt
from keelgate.adapters.models._retry import (
    RetryPolicy,
    Transient,
    call_with_retries,
    one_line,
    retry_after_seconds,
)
from keelgate.core.cutoff import Cutoff
from keelgate.core.model import ModelReply, ModelRequest, PlannedCall
from keelgate.core.types import Usage
from keelgate.errors import InputError, ModelError

#: The try in progress on this thread (or task): its requests' connections are given to it.
_TRY: ContextVar[Cutoff | None] = ContextVar("keelgate_model_try", default=None)


def _traced(request: Any) -> None:
    """An SDK client's request hook: the try in progress takes the request's connections."""
    cutoff = _TRY.get()
    if cutoff is not None:
        request.extensions = {**request.extensions, "trace": cutoff.trace}


class _Cut(Exception):
    """The reply was still coming when the try's time limit came."""


class SdkOptions(TypedDict, total=False):
    """The options every SDK model takes (see ``SdkModel``), for a subclass that adds its own."""

    api_key: Required[str | None]
    base_url: str | None
    max_output_tokens: int | None
    timeout_seconds: float
    retry: RetryPolicy | None
    sleep: Callable[[float], None] | None


class SdkModel(ABC):
    """A model reached through a provider's official SDK. ``name`` is the model id sent on the
    wire and priced by. Subclasses set ``provider`` and ``sdk`` and make the client (``_connect``),
    with the SDK's own retries off."""

    provider: ClassVar[str]  # as messages name it: "openai", "anthropic"
    sdk: ClassVar[ModuleType]  # the SDK module, for its error classes
    keyless_servers: ClassVar[bool] = False  # a base_url of one's own may need no key

    def __init__(
        self,
        name: str,
        *,
        api_key: str | None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        timeout_seconds: float = 120.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        # A server of one's own (``base_url``) may need no key where the provider allows it.
        if not api_key and not (base_url and self.keyless_servers):
            raise InputError(
                "spec.model.apiKeyEnv",
                "no API key: set the environment variable that apiKeyEnv names",
            )
        self.name = name
        self.base_url = base_url or None
        self.max_output_tokens = max_output_tokens
        self.retry = retry or RetryPolicy()
        self.timeout_seconds = timeout_seconds
        self._sleep = sleep
        self._secret = api_key or ""
        self._client = self._connect(api_key, timeout_seconds)

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.base_url!r})"

    def close(self) -> None:
        self._client.close()

    @abstractmethod
    def _connect(self, api_key: str | None, timeout_seconds: float) -> Any:
        """The SDK client, with its own retries off (``call`` retries, by ``_retry``'s policy)
        and its HTTP client from ``_http_client``."""

    def _http_client(self) -> Any:
        """The SDK's own HTTP client with its defaults, whose requests give their connections
        to the try in progress (``_try``). None is kept alive: a try on a connection an
        earlier try left in the pool makes none, so its cutoff would hold nothing to shut and
        a reply trickled on it would outlive the time limit. A new connection per try costs a
        handshake against a model call of seconds. Its transport is the real network's unless
        a simulation routes the provider's URL elsewhere (``keelgate.adapters.network``). Its
        limits are ``httpx2``'s, the library both SDKs' clients are built on (already loaded;
        ``httpx`` would add a hundred modules, its command line's, to a step's start)."""
        routed = network.transport(self.base_url or self.provider, network.HTTPX2)
        return self.sdk.DefaultHttpxClient(
            event_hooks={"request": [_traced]},
            limits=httpx2.Limits(max_connections=100, max_keepalive_connections=0),
            **({} if routed is None else {"transport": routed}),
        )

    @abstractmethod
    def payload(self, request: ModelRequest) -> dict[str, Any]:
        """The SDK call's arguments for a request (also what the estimate measures)."""

    @abstractmethod
    def _create(self, body: dict[str, Any]) -> Any:
        """One call of the SDK with ``body``; its reply."""

    @abstractmethod
    def _reply(self, request: ModelRequest, response: Any, body: dict[str, Any]) -> ModelReply:
        """The SDK's reply as a plan or a verdict (see ``planned_reply``)."""

    def call(self, request: ModelRequest) -> ModelReply:
        body = self.payload(request)
        response = call_with_retries(
            lambda: self._try(body),
            self._classify,
            policy=self.retry,
            provider=f"{self.provider} at {self.base_url}" if self.base_url else self.provider,
            sleep=self._sleep,
        )
        return self._reply(request, response, body)

    def _try(self, body: dict[str, Any]) -> Any:
        """One try of the call, over by ``timeout_seconds`` whatever the server sends."""
        with Cutoff.after(self.timeout_seconds) as cutoff:
            token = _TRY.set(cutoff)
            try:
                return self._create(body)
            except Exception:
                if cutoff.cut:
                    raise _Cut from None
                raise
            finally:
                _TRY.reset(token)

    def _classify(self, error: Exception) -> Transient | ModelError:
        """Transport trouble, a 429 or a 5xx is worth another try; anything else is final."""
        if isinstance(error, _Cut):
            return Transient(f"no whole reply within {self.timeout_seconds:g}s")
        if isinstance(error, self.sdk.APITimeoutError):
            return Transient("the request timed out")
        if isinstance(error, self.sdk.APIConnectionError):
            return Transient("could not reach the server")
        secrets = (self._secret,)
        if isinstance(error, self.sdk.APIStatusError):
            text = self._status_text(error) or f"HTTP {error.status_code}"
            message = f"{error.status_code} {one_line(text, secrets=secrets)}"
            if error.status_code == 429 or error.status_code >= 500:
                return Transient(message, retry_after_seconds(dict(error.response.headers)))
            return ModelError(f"{self.provider}: {message}")
        text = str(error) or type(error).__name__
        return ModelError(f"{self.provider}: {one_line(text, secrets=secrets)}")

    @staticmethod
    @abstractmethod
    def _status_text(error: Any) -> str:
        """The provider's own message in an error reply, or "" if it gave none."""

    def planned_reply(
        self,
        request: ModelRequest,
        *,
        text: str,
        calls: Sequence[tuple[str, Any]],
        cut: bool,
        refusal: str | None,
        usage: Usage,
        limit: Any,
    ) -> ModelReply:
        """A reply as a plan or a verdict, from its pieces: the text, the tool calls (name and
        raw arguments), whether it was cut off at the output ``limit``, and the model's refusal
        (None if it did not refuse)."""
        cut_off = (
            f"{self.provider}: the reply was cut off at the output limit ({limit} tokens); "
            "raise maxOutputTokens"
        )
        if request.phase == "verify":
            for tool, args in calls:
                if tool == _prompt.VERDICT_TOOL:
                    return _prompt.verdict_from_args(
                        _prompt.parse_arguments(args, tool=tool), usage
                    )
            if cut:
                raise ModelError(cut_off)
            return _prompt.verdict_from_text(text, usage)
        if cut:
            # A reply cut off mid-way may carry half a tool call or half an answer: act on neither.
            raise ModelError(cut_off)
        if refusal is not None and not calls:
            raise ModelError(f"{self.provider}: the model refused: {one_line(refusal)}")
        actions = tuple(
            PlannedCall(tool, _prompt.parse_arguments(args, tool=tool)) for tool, args in calls
        )
        if actions:
            return ModelReply(actions=actions, usage=usage)
        return ModelReply(done=True, answer=text, usage=usage)
