"""Local Kubernetes control plane and node agent for Keelgate's end-to-end tests and `make up`.

Why it exists: no Docker engine runs here, so kind cannot start a cluster, and no release binary can
be downloaded. This package starts real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler built from Go modules (see `keelgate_e2e.build`), plus a Python node agent that
stands in for the kubelet. It is test and development infrastructure, never product code: nothing
under `operator/` may import it, and it must never bind anything but 127.0.0.1.
"""

from __future__ import annotations

__all__ = [
    "ETCD_VERSION",
    "HELM_VERSION",
    "JAEGER_VERSION",
    "KREW_VERSION",
    "KUBE_VERSION",
    "KWOK_VERSION",
]

#: The Kubernetes release pinned by e2e/tools/up/go.mod.
KUBE_VERSION = "v1.36.3"
#: The etcd release pinned by e2e/tools/up/go.mod (etcd 3.6 is the pairing for Kubernetes 1.36).
ETCD_VERSION = "v3.6.16"
#: The Helm release pinned by e2e/tools/up/go.mod (installs the chart in `make up`): the 4.2 line
#: is built against Kubernetes 1.36's libraries, the cluster's own, so one build compiles them once.
HELM_VERSION = "v4.2.4"
#: The Jaeger module pinned by e2e/tools/jaeger/go.mod: a trace collector with in-memory storage
#: and a query API, for the tracing tests (built on the OpenTelemetry Collector).
JAEGER_VERSION = "v1.75.0"
#: The krew release pinned by e2e/tools/krew/go.mod: `kubectl krew` and its manifest validator,
#: which check and install the plugin's krew manifest (.krew.yaml).
KREW_VERSION = "v0.4.3"
#: The kwok release pinned by e2e/tools/kwok/go.mod: fake nodes for the scale bench
#: (`make bench-scale`); built only when that bench asks for it, never by `make up` or the tests.
KWOK_VERSION = "v0.8.0"
