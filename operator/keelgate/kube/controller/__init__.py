"""The operator's decisions: one reconciler per kind of decision, each a small module.

- ``dispatch``: ``Controller``, the one entry the workers call: a key to its reconciler.
- ``agentrun``: drive a run a step pod at a time (``AgentRunReconciler``); with it
  ``run_status`` (write the run's status), ``step_pods`` (create the pod the status names),
  ``retention`` (finished pods collected), ``signed_heads``, ``traces`` and
  ``decision_objects`` (the Reconciliations and Approvals a stop asks people for).
- ``reconciliations``: a person's settlement of an unknown outcome (``ReconciliationReconciler``).
- ``approvals``: people's approvals, one by one (``ApprovalReconciler``); with it
  ``approval_status`` (what an Approval shows of the store, also shown by ``decision_objects``).
- ``monitor``: a monitor's ticks (``MonitorReconciler``, given to the AgentRun reconciler).
- ``refusals``: a decision the loop refuses, shown and tried again (Reconciliations, Approvals).
- Beside them: ``outcomes`` (``Step``, ``Stall``, ``Rest``, ``Requeue``), ``pod_ends`` (how a
  step pod ended), ``slots`` (the cap on step pods), ``memory`` (what is kept between
  reconciles), ``events`` (the Event recorder), ``ports`` (what a reconciler needs from the
  cluster, the cache and the metrics) and ``context`` (all of that in one value, and the
  settings).

The four reconcilers import nothing of each other (a contract in pyproject.toml): what two of
them share is a module of its own. The controller does no I/O of its own: it is given the API,
the cache and the stores, so its unit tests run against a fake API server without a cluster. It
imports nothing from ``keelgate.kube.runtime``, which runs it.
"""
