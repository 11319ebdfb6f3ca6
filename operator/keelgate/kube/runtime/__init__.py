"""The running operator: what turns the controller's decisions into a process.

- ``operator``: the wiring (kopf's watches into the cache and the work queue, start and stop).
- ``workers``: take keys from the queue, run the controller's reconcile in threads.
- ``workqueue``: each key at most once at a time, re-run if it changed meanwhile, delayed adds.
- ``cache``: what the watches have seen, read by reconciles instead of the API server.
- ``resync``: queue every run again now and then; forget step pods deleted unseen.
- ``health``: ``/healthz``, ``/readyz``, ``/metrics`` and the gauges; ``metrics``: the metrics.

Nothing here decides what a run needs: that is ``keelgate.kube.controller``, which this package
runs and which never imports it. Nothing here keeps state a restart could lose: the cache and the
queue are rebuilt from the cluster's listing.
"""
