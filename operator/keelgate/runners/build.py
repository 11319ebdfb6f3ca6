"""Build a Loop's live parts (model, tools, prices) from the manifest a LoopSpec carries.

Every runner builds the same way, so a run means the same thing in-process, in a step pod or in
a Temporal worker. Each model provider and tool kind is one builder in ``MODEL_BUILDERS`` or
``TOOL_BUILDERS``; a new provider is one module in ``keelgate.adapters`` plus one entry here.
Building must never touch a store or call a tool: a bad manifest, a missing module or a
callable with the wrong signature fails here, before any saved state is opened.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from keelgate.adapters.loading import FROM_SYS_PATH, CallableLoader
from keelgate.adapters.models.python import PythonModel
from keelgate.adapters.models.scripted import ScriptedModel
from keelgate.adapters.tools.python import PythonTool
from keelgate.core.loop import Loop
from keelgate.core.model import Model
from keelgate.core.protocols import Confirmer, Stores, Tool
from keelgate.core.spec import LoopSpec, Price
from keelgate.core.tracing import NO_TRACING, Tracer
from keelgate.errors import InputError, MissingExtra, ToolError
from keelgate.manifest import AgentRunSpec, ModelConfig, Provider, ToolConfig, spec_from_manifest

# (the model, where its code is imported from) -> Model
ModelBuilder = Callable[[ModelConfig, CallableLoader], Model]
# (the tool, its manifest path, where its code is imported from) -> Tool
ToolBuilder = Callable[[ToolConfig, str, CallableLoader], Tool]


log = logging.getLogger("keelgate.build")


@dataclass(frozen=True)
class Parts:
    """What a Loop needs beyond its stores, built from one manifest."""

    model: Model
    tools: tuple[Tool, ...]
    pricing: Mapping[str, Price] = field(default_factory=dict)
    price_model: str | None = None
    max_output_tokens: int | None = None


def build_parts(
    spec: LoopSpec,
    *,
    manifest: AgentRunSpec | None = None,
    callables: CallableLoader = FROM_SYS_PATH,
) -> Parts:
    """The model, tools and prices of ``spec``'s manifest (validated again: it may have come
    over the wire), python code imported through ``callables``. Raises ``InputError`` naming the
    manifest field at fault."""
    config = manifest if manifest is not None else spec_from_manifest(spec.manifest)
    model_config = config.model
    model = MODEL_BUILDERS[model_config.provider](model_config, callables)
    tools = tuple(
        _from_image(TOOL_BUILDERS[tool.kind](tool, f"spec.tools[{index}]", callables), config)
        for index, tool in enumerate(config.tools)
    )
    for tool in tools:
        # e.g. an MCP server's hints disagreeing with the declared side effect: the manifest
        # decides, but the user should hear about it.
        for warning in getattr(tool, "warnings", ()):
            log.warning("%s", warning)
    name = model_config.effective_name
    return Parts(
        model=model,
        tools=tools,
        pricing={} if config.pricing is None else {name: config.pricing.to_price()},
        price_model=name,
        max_output_tokens=model_config.max_output_tokens,
    )


def build_loop(
    spec: LoopSpec,
    stores: Stores,
    *,
    confirmer: Confirmer | None = None,
    parts: Parts | None = None,
    pricing: Mapping[str, Price] | None = None,
    tracer: Tracer = NO_TRACING,
    busy_wait: float = 5.0,
) -> Loop:
    """A Loop over ``stores`` with the model and tools ``spec``'s manifest names.

    ``pricing`` is a table by model name (a pricing file); the manifest's own ``spec.pricing``
    wins for its model. ``busy_wait`` is the Loop's: how long a run (or a key) held by another
    driver is waited for before the run is busy.
    """
    built = parts if parts is not None else build_parts(spec)
    return Loop(
        stores=stores,
        model=built.model,
        tools=built.tools,
        confirmer=confirmer,
        pricing={**(pricing or {}), **built.pricing},
        price_model=built.price_model,
        max_output_tokens=built.max_output_tokens,
        tracer=tracer,
        busy_wait=busy_wait,
    )


# Models


def _scripted(config: ModelConfig, _: CallableLoader) -> Model:
    script: list[dict[str, Any]] = []
    for entry in config.script or ():
        answer: dict[str, Any] = {
            "actions": [{"tool": a.tool, "args": dict(a.args)} for a in entry.actions],
            "done": entry.done,
            "answer": entry.answer,
        }
        if entry.usage is not None:
            answer["usage"] = entry.usage.model_dump(by_alias=True)
        if entry.verdict is not None or entry.reason:
            answer["verdict"] = {"verdict": entry.verdict or "accept", "reason": entry.reason}
        script.append(answer)
    return ScriptedModel(script, name=config.effective_name)


def _python_model(config: ModelConfig, callables: CallableLoader) -> Model:
    where = "spec.model.callable"
    function = callables.load(config.callable, field=where)
    _check_signature(function, ({},), {}, field=where, shape="fn(request: dict) -> dict")
    return PythonModel(function, name=config.effective_name)


def _openai(config: ModelConfig, _: CallableLoader) -> Model:
    module = _adapter(
        "keelgate.adapters.models.openai",
        field="spec.model.provider",
        what="provider 'openai'",
        extra="openai",
    )
    model: Model = module.OpenAIModel(
        config.effective_name,
        api_key=_api_key(config),
        base_url=config.base_url or None,
        max_output_tokens=config.max_output_tokens,
    )
    return model


def _anthropic(config: ModelConfig, _: CallableLoader) -> Model:
    module = _adapter(
        "keelgate.adapters.models.anthropic",
        field="spec.model.provider",
        what="provider 'anthropic'",
        extra="anthropic",
    )
    model: Model = module.AnthropicModel(
        config.effective_name,
        api_key=_api_key(config),
        base_url=config.base_url or None,
        max_output_tokens=config.max_output_tokens,
    )
    return model


def _api_key(config: ModelConfig) -> str | None:
    # In a step pod the operator maps apiKeySecretRef to this variable; the key itself is never
    # part of a manifest, a LoopSpec or a checkpoint.
    key = os.environ.get(config.api_key_env_name)
    if key:
        return key
    if config.provider is Provider.OPENAI and config.base_url:
        return None  # a local OpenAI-compatible server (Ollama, vLLM) usually wants none
    raise InputError(
        "spec.model.apiKeyEnv",
        f"{config.api_key_env_name} is not set: export it, or name another variable",
    )


# Tools


def _python_tool(tool: ToolConfig, where: str, callables: CallableLoader) -> Tool:
    assert tool.python is not None
    place = f"{where}.python.callable"
    function = callables.load(tool.python.callable, field=place)
    _check_signature(
        function,
        ({},),
        {"idempotency_key": None},
        field=place,
        shape="fn(args: dict, *, idempotency_key: str | None)",
    )
    schema = tool.input_schema
    if schema is not None:
        function = _checked(tool.name, function, schema, field=f"{where}.inputSchema")
    return PythonTool(
        tool.name,
        function,
        side_effect=tool.side_effect,
        requires_approval=tool.approval_rule() is not None,
        approval=tool.approval_rule(),
        description=tool.description,
        input_schema=schema if schema is not None else {"type": "object"},
        timeout_seconds=tool.timeout_seconds,
        reference=tool.python.callable,
    )


def _from_image(tool: Tool, config: AgentRunSpec) -> Tool:
    """A Python tool with the step image its code comes from (``spec.step.image``), which is
    part of what an approval of its call is given for: an image edited after the approval holds
    other code under the callable's name. Other tools are Keelgate's own code."""
    if isinstance(tool, PythonTool) and config.step.image:
        return replace(tool, image=config.step.image)
    return tool


def _checked(
    name: str, function: Callable[..., Any], schema: Mapping[str, Any], *, field: str
) -> Callable[..., Any]:
    """``function`` behind the tool's input schema: arguments that fail it are a ToolError
    (definite: nothing ran) the model sees, and the function is never called."""
    module = _adapter("keelgate.adapters.tools.schema", field=field)
    check = module.ArgsSchema(schema, field=field).check

    def guarded(args: dict[str, Any], *, idempotency_key: str | None) -> Any:
        check(name, args)
        return function(args, idempotency_key=idempotency_key)

    return guarded


def _http_tool(tool: ToolConfig, where: str, _: CallableLoader) -> Tool:
    assert tool.http is not None
    if tool.http.body is not None:
        raise InputError(f"{where}.http.body", "a fixed body is not supported yet; omit it")
    module = _adapter("keelgate.adapters.tools.http", field=f"{where}.http", what="the http tool")
    options: dict[str, Any] = {}
    if tool.timeout_seconds is not None:
        options["timeout_seconds"] = tool.timeout_seconds
    built: Tool = module.HttpTool(
        tool.name,
        url=tool.http.url,
        method=tool.http.method,
        side_effect=tool.side_effect,
        requires_approval=tool.approval_rule() is not None,
        approval=tool.approval_rule(),
        description=tool.description,
        input_schema=tool.input_schema,
        headers=tool.http.headers,
        where=where,
        **options,
    )
    return built


def _mcp_tool(tool: ToolConfig, where: str, _: CallableLoader) -> Tool:
    assert tool.mcp is not None
    module = _adapter(
        "keelgate.adapters.tools.mcp", field=f"{where}.mcp", what="the mcp tool", extra="mcp"
    )
    server = module.McpServerRef(url=tool.mcp.url, headers=dict(tool.mcp.headers))
    common: dict[str, Any] = {
        "side_effect": tool.side_effect,
        "remote_name": tool.mcp.tool or None,
        "requires_approval": tool.approval_rule() is not None,
        "approval": tool.approval_rule(),
        "description": tool.description,
        "timeout_seconds": tool.timeout_seconds,
        "key_argument": tool.mcp.key_argument or None,
        "where": where,
    }
    if tool.input_schema is not None:
        # The manifest gave the schema: no need to ask the server before the run starts.
        built: Tool = module.McpTool(
            tool.name, server=server, input_schema=tool.input_schema, **common
        )
        return built
    try:
        found: list[Tool] = module.discover(server, [module.McpToolSpec(tool.name, **common)])
    except ToolError as error:
        raise InputError(f"{where}.mcp.url", f"{error.message}; or give inputSchema") from None
    return found[0]


def _adapter(name: str, *, field: str, what: str = "", extra: str = "") -> ModuleType:
    """Import an adapter whose SDK is optional; a missing module is the user's input problem,
    told with the extra that brings it (``keelgate[openai]``)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            label = what or repr(name.rsplit(".", 1)[1])
            raise InputError(field, f"{label} is not available yet") from None
        missing = (error.name or "").split(".")[0]
        if extra:
            raise MissingExtra(extra, field=field, what=what or extra, module=missing) from None
        raise InputError(
            field, f"needs the Python package {missing!r}, which is not installed"
        ) from None


def _check_signature(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    field: str,
    shape: str,
) -> None:
    # A WRITE whose call fails on its signature would read as "maybe it ran": refuse it here.
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): trust the reference
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        raise InputError(field, f"must be callable as {shape}") from None


MODEL_BUILDERS: dict[Provider, ModelBuilder] = {
    Provider.SCRIPTED: _scripted,
    Provider.PYTHON: _python_model,
    Provider.OPENAI: _openai,
    Provider.ANTHROPIC: _anthropic,
}
TOOL_BUILDERS: dict[str, ToolBuilder] = {
    "python": _python_tool,
    "http": _http_tool,
    "mcp": _mcp_tool,
}
