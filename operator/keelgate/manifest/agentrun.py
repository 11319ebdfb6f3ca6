"""The AgentRun manifest (contract section 5): what a user writes to run an agent loop.

The same models validate ``keelgate run -f``, parse the operator's objects and generate the CRD
schema, so a manifest that passes here means the same thing everywhere. Cross-field rules
(a scripted model needs a script, tool names are unique, a verification loop only reads ...)
live here too, each failing with the path of the field to fix. This module must never build a
model or a tool, import user code, or read secrets: it only describes.

Why one module past 500 lines: the cross-field rules read several parts of one manifest at once
(the side effects allowed against the loop's kind, a script's actions against the tools named,
a schedule against the loop's kind), so the models they join are read in one file; what other
kinds share is in ``manifest/base.py``, the notification settings in ``manifest/notifications.py``.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from keelgate.core import fence
from keelgate.core.monitor import validate_schedule
from keelgate.core.spec import Budget, LoopSpec, Price
from keelgate.core.types import ApprovalRule, LoopKind, RunStatus, SideEffect
from keelgate.core.values import MAX_APPROVERS, SECONDS_MAX, NonNegativeInt
from keelgate.errors import InputError
from keelgate.manifest.base import (
    CREATED_BY_ANNOTATION,
    STATUS_CONFIG,
    CallableRef,
    Condition,
    DecimalString,
    DnsSubdomain,
    Duration,
    EnvName,
    GroupName,
    HttpUrl,
    JsonObject,
    KeelgateModel,
    NonEmpty,
    NotBlank,
    ObjectMeta,
    OptionalDnsSubdomain,
    OptionalHttpUrl,
    PositiveInt,
    Quantity,
    Seconds,
    Timestamp,
    ToolName,
    duration_seconds,
    rule_error,
)


class Provider(StrEnum):
    SCRIPTED = "scripted"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    PYTHON = "python"


DEFAULT_API_KEY_ENV = {Provider.OPENAI: "OPENAI_API_KEY", Provider.ANTHROPIC: "ANTHROPIC_API_KEY"}


class SecretKeyRef(KeelgateModel):
    name: DnsSubdomain = Field(description="The Secret's name, in the AgentRun's namespace.")
    key: NonEmpty = Field(description="The key within the Secret.")


class ScriptAction(KeelgateModel):
    tool: NonEmpty = Field(description="A tool declared in spec.tools.")
    args: JsonObject = Field(default_factory=dict, description="The call's arguments.")


class ScriptUsage(KeelgateModel):
    input_tokens: NonNegativeInt = Field(default=0, description="Input tokens to charge.")
    output_tokens: NonNegativeInt = Field(default=0, description="Output tokens to charge.")


class ScriptEntry(KeelgateModel):
    """One planning call's answer, and optionally the verdict of that iteration's verify call."""

    actions: list[ScriptAction] = Field(default_factory=list, description="Tool calls to plan.")
    done: StrictBool = Field(default=False, description="True: the goal is met, stop.")
    answer: str | None = Field(default=None, description="The final answer, with done.")
    usage: ScriptUsage | None = Field(default=None, description="Tokens this call costs.")
    verdict: Literal["accept", "reject"] | None = Field(
        default=None, description="The verify phase's verdict for this iteration (default accept)."
    )
    reason: str = Field(default="", description="The verifier's reason, shown to the model.")

    @model_validator(mode="after")
    def _actions_or_done(self) -> ScriptEntry:
        if self.actions and self.done:
            raise rule_error(("done",), "an entry has either actions or done: true, not both")
        if not self.actions and not self.done:
            raise rule_error((), "an entry needs actions or done: true")
        return self


class ModelConfig(KeelgateModel):
    provider: Provider = Field(description="scripted | openai | anthropic | python.")
    name: str = Field(
        default="",
        description="The model's name (required for openai and anthropic); prices and usage "
        "are booked under it. Default: the provider's name.",
    )
    base_url: OptionalHttpUrl = Field(
        default="",
        alias="baseURL",
        description="An OpenAI-compatible endpoint (vLLM, Ollama, LiteLLM ...); empty for the "
        "provider's own.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Where the API key is, in a cluster."
    )
    api_key_env: EnvName = Field(
        default="",
        description="The environment variable holding the API key with `keelgate run`. Default: "
        "OPENAI_API_KEY or ANTHROPIC_API_KEY by provider.",
    )
    max_output_tokens: PositiveInt | None = Field(
        default=None, description="Caps each reply's output tokens."
    )
    callable: CallableRef = Field(
        default="",
        description="provider python only: 'pkg.module:function', called as fn(request) -> dict.",
    )
    script: list[ScriptEntry] | None = Field(
        default=None, description="provider scripted only: one entry per planning call."
    )

    @property
    def effective_name(self) -> str:
        """The name usage and prices are booked under."""
        return self.name or self.provider.value

    @property
    def api_key_env_name(self) -> str:
        return self.api_key_env or DEFAULT_API_KEY_ENV.get(self.provider, "")

    @model_validator(mode="after")
    def _provider_fields(self) -> ModelConfig:
        if self.provider is Provider.SCRIPTED and not self.script:
            raise rule_error(("script",), "provider scripted needs a script (one entry per call)")
        if self.provider is not Provider.SCRIPTED and self.script is not None:
            raise rule_error(("script",), "only provider scripted takes a script")
        if self.provider is Provider.PYTHON and not self.callable:
            raise rule_error(("callable",), "provider python needs 'package.module:function'")
        if self.provider is not Provider.PYTHON and self.callable:
            raise rule_error(("callable",), "only provider python takes a callable")
        if self.provider in (Provider.OPENAI, Provider.ANTHROPIC) and not self.name:
            raise rule_error(("name",), f"provider {self.provider.value} needs the model's name")
        return self


class HttpToolConfig(KeelgateModel):
    url: HttpUrl = Field(description="URL template; {name} is filled from the arguments.")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(
        default="GET", description="The HTTP method."
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    body: JsonObject | None = Field(
        default=None,
        description="Reserved: a fixed body is not supported yet and is refused. POST, PUT "
        "and PATCH send the arguments as the JSON body.",
    )


class PythonToolConfig(KeelgateModel):
    callable: CallableRef = Field(
        description="'pkg.module:function', called as fn(args, *, idempotency_key)."
    )

    @field_validator("callable")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise rule_error((), "must be 'package.module:function'")
        return value


class McpToolConfig(KeelgateModel):
    url: HttpUrl = Field(description="The MCP server's streamable HTTP endpoint.")
    tool: str = Field(default="", description="The server's tool name. Default: this tool's name.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    key_argument: str = Field(
        default="",
        description="For a server that takes the idempotency key as a parameter: the argument "
        "to pass it in (WRITE and PROPOSE). It is always sent in the request's _meta.",
    )


class ApprovalConfig(KeelgateModel):
    """Who must approve each call of a tool before it runs, and for how long an approval holds.
    Setting it makes the tool require approval (requiresApproval: true is this with every field
    at its default)."""

    required: Annotated[StrictInt, Field(ge=1, le=MAX_APPROVERS)] = Field(
        default=1,
        description=f"Approvals needed, each by a different person (1-{MAX_APPROVERS}); any "
        "deny denies.",
    )
    groups: list[GroupName] = Field(
        default_factory=list,
        max_length=32,
        description="A person's decision counts only if the API server authenticated them in "
        "one of these groups (their Kubernetes groups, as in RBAC). Empty: anyone who may "
        "patch the Approval.",
    )
    not_creator: StrictBool = Field(
        default=False,
        description="The person who created the AgentRun cannot approve its calls (they may "
        "still deny). The creator is the annotation keelgate.dev/created-by, which the "
        "admission policy sets or checks.",
    )
    expires_after: Duration | None = Field(
        default=None,
        description="How long an approval counts, e.g. 1h: one given longer ago when the call "
        "would run (a budget stop in between, say) is asked for again. Default: it does not "
        "expire.",
    )

    service_accounts: StrictBool = Field(
        default=False,
        description="ServiceAccounts may decide (approve or deny) too. Default: people only: a "
        "ServiceAccount is whoever holds its token or may impersonate it, so two of them can be "
        "one person, and notCreator cannot tell who acted through one.",
    )
    reason_to_deny: StrictBool = Field(
        default=False,
        description="A deny must give its reason (the decision's note, kubectl keelgate approve "
        "--deny --note): one without is refused, and the reason is shown to everyone waiting.",
    )

    @field_validator("groups")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        for index, group in enumerate(value):
            if group in value[:index]:
                raise rule_error((index,), f"{group!r} is listed twice")
        return value

    @field_validator("expires_after")
    @classmethod
    def _a_real_time(cls, value: str | None) -> str | None:
        if value is not None and not 0 < duration_seconds(value) <= SECONDS_MAX:
            raise rule_error((), "must be above zero and at most a year (8760h)")
        return value

    def to_rule(self) -> ApprovalRule:
        return ApprovalRule(
            required=self.required,
            groups=tuple(self.groups),
            not_creator=self.not_creator,
            expires_after=None
            if self.expires_after is None
            else float(duration_seconds(self.expires_after)),
            service_accounts=self.service_accounts,
            reason_to_deny=self.reason_to_deny,
        )


class ToolConfig(KeelgateModel):
    name: ToolName = Field(description="Unique within the run; what the model calls.")
    description: str = Field(default="", description="What the model is told the tool does.")
    side_effect: SideEffect = Field(
        description="READ | PROPOSE | WRITE. The manifest decides; nothing infers it."
    )
    requires_approval: StrictBool = Field(
        default=False,
        description="Stop with awaiting_approval before each call until one person approves "
        "(approval asks for more).",
    )
    approval: ApprovalConfig | None = Field(
        default=None,
        description="Who must approve each call: how many people, from which groups, not the "
        "run's creator, for how long. Setting it requires approval, whatever requiresApproval "
        "says.",
    )
    timeout_seconds: Seconds | None = Field(
        default=None, description="A call running longer is an unknown outcome (for a WRITE)."
    )
    input_schema: JsonObject | None = Field(
        default=None,
        description="JSON schema of the arguments, given to the model; arguments that fail it "
        'never reach the tool. Default: {"type": "object"}.',
    )
    http: HttpToolConfig | None = Field(default=None, description="Call an HTTP endpoint.")
    python: PythonToolConfig | None = Field(default=None, description="Call a Python function.")
    mcp: McpToolConfig | None = Field(default=None, description="Call a tool of an MCP server.")

    @property
    def kind(self) -> str:
        """Which of http, python, mcp this tool is."""
        return next(k for k in ("http", "python", "mcp") if getattr(self, k) is not None)

    def call_seconds(self) -> float:
        """How long one call may take: its timeoutSeconds, else the tool kind's own limit
        (HTTP and MCP calls), else the limit every PROPOSE or WRITE is held to."""
        if self.timeout_seconds is not None:
            return float(self.timeout_seconds)
        if self.kind in ("http", "mcp"):
            return fence.NETWORK_CALL_SECONDS
        return fence.call_seconds(None)

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if value.get("type") != "object":
            raise rule_error(("type",), 'an input schema must have type: "object"')
        properties = value.get("properties", {})
        if not isinstance(properties, dict):
            raise rule_error(("properties",), "must be a mapping of argument names to schemas")
        return value

    def approval_rule(self) -> ApprovalRule | None:
        """The rule the tool's calls must meet (None: no approval needed)."""
        if self.approval is not None:
            return self.approval.to_rule()
        return ApprovalRule() if self.requires_approval else None

    @model_validator(mode="after")
    def _one_kind(self) -> ToolConfig:
        kinds = [k for k in ("http", "python", "mcp") if getattr(self, k) is not None]
        if len(kinds) != 1:
            found = f" (found: {', '.join(kinds)})" if kinds else ""
            raise rule_error((), f"a tool needs exactly one of http, python, mcp{found}")
        return self


class BudgetConfig(KeelgateModel):
    """Limits of a run; unset means unlimited. Raise one and the run resumes."""

    max_iterations: PositiveInt | None = Field(default=None, description="Planning iterations.")
    tokens: PositiveInt | None = Field(default=None, description="Input plus output tokens.")
    dollars: DecimalString | None = Field(
        default=None, description='Dollars, as a decimal string such as "2.50"; needs pricing.'
    )
    timeout_seconds: Seconds | None = Field(
        default=None, description="Active seconds; time stopped (waiting for a person) is free."
    )
    max_verifier_rejections: PositiveInt | None = Field(
        default=3, description="Verifier rejections before the run stops."
    )

    def to_budget(self) -> Budget:
        return Budget(
            max_iterations=self.max_iterations,
            tokens=self.tokens,
            dollars=None if self.dollars is None else Decimal(self.dollars),
            timeout_seconds=self.timeout_seconds,
            max_verifier_rejections=self.max_verifier_rejections,
        )


class PricingConfig(KeelgateModel):
    input_per_million_tokens: DecimalString = Field(description="Dollars per million input tokens.")
    output_per_million_tokens: DecimalString = Field(
        description="Dollars per million output tokens."
    )

    def to_price(self) -> Price:
        return Price(
            Decimal(self.input_per_million_tokens), Decimal(self.output_per_million_tokens)
        )


class PricingTable(KeelgateModel):
    """A pricing file for the CLI (``--pricing``): prices by model name, used for any run whose
    manifest states no ``spec.pricing`` of its own. Keelgate ships no prices."""

    models: dict[str, PricingConfig] = Field(
        description="Model name (as in spec.model.name) to its price."
    )

    def to_prices(self) -> dict[str, Price]:
        return {name: price.to_price() for name, price in self.models.items()}


class Toleration(KeelgateModel):
    key: str = Field(default="", description="The taint key.")
    operator: Literal["", "Exists", "Equal"] = Field(default="", description="Exists or Equal.")
    value: str = Field(default="", description="The taint value.")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="", description="The taint effect."
    )
    toleration_seconds: NonNegativeInt | None = Field(default=None, description="For NoExecute.")


class Resources(KeelgateModel):
    limits: dict[str, Quantity] = Field(default_factory=dict, description="e.g. {cpu: 500m}.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="e.g. {memory: 256Mi}.")


class StepConfig(KeelgateModel):
    """How the operator runs a step pod; ignored by ``keelgate run``."""

    image: str = Field(default="", description="The step image. Default: the operator's.")
    resources: Resources = Field(default_factory=Resources, description="Container resources.")
    service_account_name: OptionalDnsSubdomain = Field(
        default="", description="The pod's service account."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node selector.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations.")
    keep_finished_pods: PositiveInt | None = Field(
        default=None,
        le=100,
        description="Finished step pods kept (the newest). Default: the operator's (3).",
    )


class AgentRunSpec(KeelgateModel):
    loop: LoopKind = Field(default=LoopKind.TASK, description="task | verification | monitor.")
    goal: NotBlank = Field(description="What the agent is for; the model sees it.")
    model: ModelConfig = Field(description="The model that plans and verifies.")
    tools: list[ToolConfig] = Field(default_factory=list, description="What the model may call.")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="The run's limits.")
    pricing: PricingConfig | None = Field(
        default=None, description="The model's prices; needed for a dollar budget."
    )
    allowed_side_effects: list[SideEffect] | None = Field(
        default=None,
        min_length=1,
        description="Side effects the gateway lets through. Default: all for task, READ for "
        "verification and monitor. A verification loop may only have READ.",
    )
    schedule: str = Field(
        default="", description="monitor only (required there): a 5-field cron schedule, UTC."
    )
    suspend: StrictBool = Field(default=False, description="True: do not start or continue.")
    successful_ticks_history_limit: NonNegativeInt = Field(
        default=3, description="monitor only: finished ticks (goal met) kept as AgentRuns."
    )
    failed_ticks_history_limit: NonNegativeInt = Field(
        default=1, description="monitor only: failed ticks kept as AgentRuns."
    )
    step: StepConfig = Field(default_factory=StepConfig, description="Step pod settings.")

    @model_validator(mode="after")
    def _rules(self) -> AgentRunSpec:
        self._check_tools()
        self._check_side_effects()
        self._check_schedule()
        return self

    def _check_tools(self) -> None:
        seen: dict[str, int] = {}
        for index, tool in enumerate(self.tools):
            if tool.name in seen:
                raise rule_error(
                    ("tools", index, "name"),
                    f"duplicate tool name {tool.name!r} (also spec.tools[{seen[tool.name]}])",
                )
            seen[tool.name] = index
        for number, entry in enumerate(self.model.script or ()):
            for place, action in enumerate(entry.actions):
                if action.tool not in seen:
                    declared = ", ".join(seen) or "none"
                    raise rule_error(
                        ("model", "script", number, "actions", place, "tool"),
                        f"tool {action.tool!r} is not declared in spec.tools (declared: "
                        f"{declared})",
                    )

    def _check_side_effects(self) -> None:
        allowed = self.allowed_side_effects
        if allowed is None:
            return
        for index, effect in enumerate(allowed):
            if effect in allowed[:index]:
                raise rule_error(("allowedSideEffects", index), f"{effect.value} is listed twice")
            if self.loop is LoopKind.VERIFICATION and effect is not SideEffect.READ:
                raise rule_error(
                    ("allowedSideEffects", index),
                    f"a verification loop may only READ, not {effect.value}",
                )

    def _check_schedule(self) -> None:
        if self.loop is LoopKind.MONITOR:
            try:
                validate_schedule(self.schedule, field="")
            except InputError as error:
                raise rule_error(("schedule",), error.reason) from None
        elif self.schedule.strip():
            raise rule_error(("schedule",), "only a monitor loop takes a schedule")

    def manifest(self) -> dict[str, Any]:
        """The spec as a JSON-able dict in the manifest's own spelling (what a LoopSpec carries)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def longest_call_seconds(self) -> float:
        """How long the longest call of any of the run's tools may take (0 with no tools): a
        step pod asked to stop (a drain) finishes the call it is in, so its grace period must
        cover it."""
        return max((tool.call_seconds() for tool in self.tools), default=0.0)

    def loop_spec(self, *, tenant: str, run: str, creator: str = "") -> LoopSpec:
        """The serialisable LoopSpec a runner drives; this spec rides along as its manifest.
        ``creator`` is who created the run (its annotation keelgate.dev/created-by)."""
        allowed = self.allowed_side_effects
        return LoopSpec(
            tenant=tenant,
            run=run,
            goal=self.goal,
            kind=self.loop,
            budget=self.budget.to_budget(),
            allowed_side_effects=None if allowed is None else frozenset(allowed),
            manifest=self.manifest(),
            creator=creator,
        )

    def needs_creator(self) -> int | None:
        """The index of the first tool whose approval rule says notCreator (None: no tool)."""
        for index, tool in enumerate(self.tools):
            if tool.approval is not None and tool.approval.not_creator:
                return index
        return None


class StepStatus(KeelgateModel):
    """The operator's record of the step pod it intends, runs or last ran (written before the
    pod is created, so a restarted operator creates or adopts exactly that pod)."""

    model_config = STATUS_CONFIG

    number: NonNegativeInt = Field(default=0, description="The step's number within the run.")
    attempt: NonNegativeInt = Field(default=0, description="Attempts at this step so far.")
    pod: str = Field(default="", description="The step pod's name.")
    state: Literal["", "Pending", "Ended", "Stalled"] = Field(
        default="",
        description="Pending: the pod is to run or running; Ended: its end is accounted; "
        "Stalled: no further pod until the spec changes.",
    )
    generation: NonNegativeInt = Field(
        default=0, description="The generation whose spec the pod runs."
    )
    crashes: NonNegativeInt = Field(
        default=0, description="Step pods in a row that ended without recording a stop."
    )
    not_before: Timestamp = Field(
        default="", description="After crashes: no new attempt before this time (back-off)."
    )
    failpoints: str = Field(
        default="", description="The failpoints armed in this pod (development clusters only)."
    )
    last_exit: str = Field(default="", description="How the last step pod ended, in words.")
    last_lines: str = Field(
        default="",
        description="The last lines the last step pod wrote, when it failed (its termination "
        "message); kept after the pod is deleted.",
    )


class AgentRunStatus(RunStatus):
    """Written by the operator only: the run's status as the checkpoint has it (``RunStatus``,
    the shape ``--output json`` prints too), and what only the operator knows."""

    model_config = STATUS_CONFIG

    observed_generation: NonNegativeInt | None = Field(
        default=None, description="The .metadata.generation this status reflects."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Succeeded, OutcomeUnknown, AwaitingApproval ..."
    )
    last_tick: str = Field(default="", description="monitor only: the latest tick's run name.")
    last_schedule_time: Timestamp = Field(
        default="", description="monitor only: when the latest tick was scheduled."
    )
    step: StepStatus | None = Field(default=None, description="The current or last step pod.")
    failpoints_seen: str = Field(
        default="",
        description="The keelgate.dev/failpoints value last delivered or refused (one-shot per "
        "value).",
    )
    kopf: JsonObject | None = Field(
        default=None, description="Kept for the operator framework (kopf); never user data."
    )


class AgentRun(KeelgateModel):
    api_version: Literal["keelgate.dev/v1alpha1"] = Field(description="keelgate.dev/v1alpha1.")
    kind: Literal["AgentRun"] = Field(description="AgentRun.")
    metadata: ObjectMeta = Field(description="name, and namespace (the tenant).")
    spec: AgentRunSpec = Field(description="What to run.")
    status: AgentRunStatus | None = Field(default=None, description="Written by the operator.")

    @property
    def tenant(self) -> str:
        return self.metadata.namespace or "default"

    @property
    def creator(self) -> str:
        """Who created the run, as its annotation keelgate.dev/created-by says ("": unknown)."""
        return self.metadata.annotations.get(CREATED_BY_ANNOTATION, "")

    @model_validator(mode="after")
    def _creator_when_asked_for(self) -> AgentRun:
        # A rule that does not count the creator's yes needs to know who that is; without the
        # annotation no approval could ever count, so the manifest is refused instead.
        index = self.spec.needs_creator()
        if index is not None and not self.creator.strip():
            raise rule_error(
                ("metadata", "annotations", CREATED_BY_ANNOTATION),
                f"needed by spec.tools[{index}].approval.notCreator: name who creates the run "
                "(in a cluster the admission policy sets or checks it)",
            )
        return self

    def to_loop_spec(self) -> LoopSpec:
        """The serialisable LoopSpec a runner drives; the spec rides along as its manifest."""
        return self.spec.loop_spec(
            tenant=self.tenant, run=self.metadata.name, creator=self.creator.strip()
        )
