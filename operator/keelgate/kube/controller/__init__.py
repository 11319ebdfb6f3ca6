"""The operator's decisions: one reconciler per kind of decision, each a small module.

- ``dispatch``: ``Controller``, the one entry the workers call: a key to its reconciler.
- ``agentrun``: drive a run a step pod at a time (``AgentRunReconciler``); with it
  ``run_status`` (write the run's status), ``step_pods`` (create the pod the status names) and
  ``decision_objects`` (the Reconciliations and Approvals a stop asks people for).
- ``decisions``: Reconciliations and Approvals, one reconciler parametrised by kind.
- ``monitor``: a monitor's ticks.
- Beside them: ``outcomes`` (``Step``, ``Stall``, ``Rest``, ``Requeue``), ``pod_ends`` (how a
  step pod ended), ``slots`` (the cap on step pods), ``memory`` (what is kept between
  reconciles), ``events`` (the Event recorder), ``ports`` (what a reconciler needs from the
  cluster, the cache and the metrics) and ``context`` (all of that in one value, and the
  settings).

The controller does no I/O of its own: it is given the API, the cache and the stores, so its
unit tests run against a fake API server without a cluster. It imports nothing from
``keelgate.kube.runtime``, which runs it.
"""
