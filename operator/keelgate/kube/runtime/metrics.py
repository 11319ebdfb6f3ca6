"""The operator's Prometheus metrics (``/metrics``), in one registry of its own.

What an operator of Keelgate watches: runs by phase, steps started and ended (by how they
ended), how long steps take, the hand-off from one step pod's end to the next one's creation,
unknown outcomes and approvals waiting for a person, API writes, and the CloudEvents sent to
sinks. Labels carry no run names (unbounded cardinality) and never anything from a run's spec.
This module must never import kopf or the Kubernetes client: it only counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

HANDOFF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._runs_and_steps()
        self._decisions_waiting()
        self._operator_itself()
        self._notifications()

    def _runs_and_steps(self) -> None:
        """Runs by phase, and their step pods: started, ended, how long, the hand-offs."""
        self.runs = Gauge(
            "keelgate_runs", "AgentRuns by status.phase.", ["phase"], registry=self.registry
        )
        self.steps_started = Counter(
            "keelgate_steps_started", "Step pods created.", registry=self.registry
        )
        self.steps_ended = Counter(
            "keelgate_steps_ended",
            "Step pods whose end was accounted, by how they ended.",
            ["result"],
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "keelgate_step_duration_seconds",
            "Step pod run time, container start to end.",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.handoff_seconds = Histogram(
            "keelgate_step_handoff_seconds",
            "From a step pod's end to the creation of the run's next step pod.",
            buckets=HANDOFF_BUCKETS,
            registry=self.registry,
        )

    def _decisions_waiting(self) -> None:
        """What waits for a person: unknown outcomes, late results, approvals."""
        self.unknown_outcomes = Gauge(
            "keelgate_unknown_outcomes",
            "WRITEs whose outcome is unknown and not yet settled.",
            registry=self.registry,
        )
        self.late_results = Gauge(
            "keelgate_late_results",
            "Calls that ended after someone else had settled their keys, as runs' statuses "
            "list them (the newest 10 of each run).",
            registry=self.registry,
        )
        self.oldest_waiting = Gauge(
            "keelgate_decision_oldest_waiting_seconds",
            "How long the oldest unsettled Reconciliation or Approval has waited for a person "
            "(0: none waits); the alert 'a decision waits too long' reads it.",
            ["kind"],
            registry=self.registry,
        )
        self.approvals_pending = Gauge(
            "keelgate_approvals_pending",
            "Actions waiting for a person's approval.",
            registry=self.registry,
        )

    def _operator_itself(self) -> None:
        """The operator's own work: the step pods it runs and their cap, its API writes and
        their throttling, its lead, its failed reconciles."""
        self.step_pods_active = Gauge(
            "keelgate_step_pods_active",
            "Step pods pending or running.",
            registry=self.registry,
        )
        self.api_writes = Counter(
            "keelgate_api_writes",
            "Writes to the Kubernetes API, by verb and kind.",
            ["what"],
            registry=self.registry,
        )
        self.api_throttled = Counter(
            "keelgate_api_throttled_seconds",
            "Seconds the operator's API requests waited for its client rate limit "
            "(--kube-qps, --kube-burst); growing steadily: the limit binds.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "keelgate_leader",
            "1 on the replica that leads (drives runs), 0 on a standby; sharded (--shards): "
            "1 on each replica that drives a shard.",
            registry=self.registry,
        )
        self.shards_driven = Gauge(
            "keelgate_shards_driven",
            "The shards this replica drives (--shards; 0 when not sharded).",
            registry=self.registry,
        )
        self.step_pod_cap = Gauge(
            "keelgate_step_pods_max",
            "The most step pods pending or running at once (--max-step-pods; sharded: this "
            "replica's share of it).",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "keelgate_reconcile_errors",
            "Reconciles that failed and were retried.",
            ["kind"],
            registry=self.registry,
        )

    def _notifications(self) -> None:
        """CloudEvents to the sinks (keelgate.kube.runtime.sinks): the sink label is a name the
        chart's values give, the type one of the catalogue's: both bounded."""
        self.notifications_sent = Counter(
            "keelgate_notifications_sent",
            "CloudEvents a sink accepted (2xx), by sink and event type.",
            ["sink", "type"],
            registry=self.registry,
        )
        self.notifications_failed = Counter(
            "keelgate_notifications_failed",
            "Delivery attempts that failed (an error, a timeout, a non-2xx answer), by sink.",
            ["sink"],
            registry=self.registry,
        )
        self.notifications_dropped = Counter(
            "keelgate_notifications_dropped",
            "CloudEvents given up, by sink and why: queue_full, refused (a 4xx that asking "
            "again will not change), gave_up (still failing after the sink's retryForSeconds).",
            ["sink", "reason"],
            registry=self.registry,
        )
        self.notifications_queued = Gauge(
            "keelgate_notifications_queued",
            "CloudEvents waiting for a sink (the one being tried included).",
            ["sink"],
            registry=self.registry,
        )

    # The step meter of the reconcilers (keelgate.kube.controller.ports.StepMeter).

    def step_started(self) -> None:
        self.steps_started.inc()

    def step_ended(self, result: str, seconds: float | None) -> None:
        self.steps_ended.labels(result).inc()
        if seconds is not None:
            self.step_seconds.observe(seconds)

    def handoff(self, seconds: float) -> None:
        self.handoff_seconds.observe(seconds)
