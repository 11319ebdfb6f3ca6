"""Keelgate's Kubernetes floor: the operator, and the CRDs generated from the manifest models.

Two jobs, two folders, and the cluster adapter and pure builders they share:

- ``crds/``: CRD generation (a build step: ``python -m keelgate.kube.crds``).
- ``controller/``: the decisions, one reconciler per kind (no I/O of their own).
- ``runtime/``: the running operator (kopf's watches, cache, work queue, workers, resync,
  health, metrics), which runs the controller.
- ``api`` (the API calls), ``resources`` (the bodies made), ``status`` (a run's status, pure),
  ``naming`` (names and labels), ``times`` (metav1 times).

Imports point down: ``runtime`` may import ``controller``, never the reverse; both, and
``crds``, import the shared modules. It may import ``keelgate.manifest`` and ``keelgate.core``;
nothing below it may import this package, and importing it must never contact a cluster.
"""
