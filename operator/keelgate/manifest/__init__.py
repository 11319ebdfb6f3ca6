"""The manifest models of Keelgate: AgentRun, Reconciliation and Approval (contract section 5).

They are the single source of truth: the CLI validates with them, the operator parses with them
and the CRD schemas are generated from them. This package only describes and validates; it must
never build models or tools, import user code, or talk to Kubernetes.
"""

from keelgate.manifest.agentrun import (
    AgentRun,
    AgentRunSpec,
    AgentRunStatus,
    BudgetConfig,
    HttpToolConfig,
    McpToolConfig,
    ModelConfig,
    PricingConfig,
    PricingTable,
    Provider,
    PythonToolConfig,
    ScriptEntry,
    StepConfig,
    ToolConfig,
)
from keelgate.manifest.base import API_VERSION, Condition, ObjectMeta
from keelgate.manifest.load import (
    input_error,
    load_agentrun,
    load_pricing,
    parse,
    read_yaml,
    spec_from_manifest,
)
from keelgate.manifest.settle import (
    Approval,
    ApprovalSpec,
    ApprovalStatus,
    Reconciliation,
    ReconciliationSpec,
    ReconciliationStatus,
)

__all__ = [
    "API_VERSION",
    "AgentRun",
    "AgentRunSpec",
    "AgentRunStatus",
    "Approval",
    "ApprovalSpec",
    "ApprovalStatus",
    "BudgetConfig",
    "Condition",
    "HttpToolConfig",
    "McpToolConfig",
    "ModelConfig",
    "ObjectMeta",
    "PricingConfig",
    "PricingTable",
    "Provider",
    "PythonToolConfig",
    "Reconciliation",
    "ReconciliationSpec",
    "ReconciliationStatus",
    "ScriptEntry",
    "StepConfig",
    "ToolConfig",
    "input_error",
    "load_agentrun",
    "load_pricing",
    "parse",
    "read_yaml",
    "spec_from_manifest",
]
