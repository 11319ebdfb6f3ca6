# e2e.mk: the local Kubernetes control plane and node agent (e2e/), included by the top-level
# Makefile. Targets: e2e-build, up-build, up, down, up-standby, down-standby, e2e-test,
# e2e-lint. See docs/control-plane.md.
#
#   PY       the project's venv python (the top-level Makefile sets it; default .venv/bin/python)
#   BUILD_PY the Python of the build, which needs only the standard library (default: PY)
#   UP_DEPS  what `up` needs first (default: up-build; the top-level Makefile builds and installs
#            the venv side by side)
#   DEV_DIR  run directory of `make up` (kubeconfig, logs, state); default .dev
#   STANDBY_DIR  run directory of `make up-standby` (a second cluster on the same store); .dev-west
#   GO       Go toolchain (default: `go` on PATH, else /usr/local/go/bin/go)
#   KUBECTL  kubectl for the tests (default: `kubectl` on PATH)
#   KUBEBUILDER_ASSETS  a directory with kube-apiserver/etcd/... to use instead of building

PY ?= .venv/bin/python
BUILD_PY ?= $(PY)
UP_DEPS ?= up-build
DEV_DIR ?= .dev
STANDBY_DIR ?= .dev-west
E2E_PY = PYTHONPATH=e2e$(if $(PYTHONPATH),:$(PYTHONPATH)) $(PY)
E2E_PYTEST_ARGS ?=

.PHONY: e2e-build up-build up down up-standby down-standby e2e-test e2e-lint

## e2e-build: build every program the e2e suite runs into e2e/bin: kube-apiserver,
## kube-controller-manager, kube-scheduler, etcd, helm, jaeger and krew (only what is missing or
## not at the pinned version)
e2e-build:
	$(E2E_PY) -m keelgate_e2e.build --for e2e

## up-build: only what `make up` runs: the cluster's four programs and helm
up-build:
	PYTHONPATH=e2e $(BUILD_PY) -m keelgate_e2e.build --for up

## up: start etcd, the API server, controller-manager, scheduler, node agent and PostgreSQL in
## the background, and install Keelgate's chart; writes $(DEV_DIR)/kubeconfig (contexts admin
## [default], alice, bob)
up: $(UP_DEPS)
	$(E2E_PY) -m keelgate_e2e --dir $(DEV_DIR) up

## down: stop everything `make up` started; fails if any process is left
down:
	$(E2E_PY) -m keelgate_e2e --dir $(DEV_DIR) down

## up-standby: a second cluster beside `make up`'s (run directory $(STANDBY_DIR)): its own
## control plane and node agent, no PostgreSQL of its own; its operator (cluster west) shares the
## first cluster's store, so the same AgentRun applied to both runs in one (docs/operator.md)
up-standby: $(UP_DEPS)
	$(E2E_PY) -m keelgate_e2e --dir $(STANDBY_DIR) up --store-of $(DEV_DIR) --cluster-name west

## down-standby: stop everything `make up-standby` started
down-standby:
	$(E2E_PY) -m keelgate_e2e --dir $(STANDBY_DIR) down

## e2e-test: run the e2e suite against its own private cluster (not the one of `make up`)
e2e-test: e2e-build
	$(PY) -m pytest e2e/tests -p no:cacheprovider $(E2E_PYTEST_ARGS)

## e2e-lint: ruff and mypy --strict over e2e/
e2e-lint:
	$(PY) -m ruff check e2e
	$(PY) -m ruff format --check e2e
	$(PY) -m mypy --config-file e2e/mypy.ini
