# Keelgate's two set-up commands are `make demo` and `make test`; everything else is a helper.
# Prerequisites: Python 3.11+ (PYTHON, default python3), Go (for the control plane, `make up`
# and the e2e tests), kubectl, and the PostgreSQL server programs (PG_BIN, else pg_config's
# bindir, else /usr/lib/postgresql/*/bin, else initdb on PATH). See README.md.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# What goes into .venv (pyproject.toml's extras): `make demo-local` needs the base alone, `make up`
# and `make demo` what the cluster runs (the operator, the PostgreSQL driver of `keelgate tenant
# add` and the step pods, and OpenTelemetry for the chart's documented tracing.otlpEndpoint), the
# checks and tests every extra. A larger set satisfies a smaller one.
EXTRAS     := test,operator,openai,anthropic,mcp,postgres,langgraph,temporal,tracing
UP_EXTRAS  := operator,postgres,tracing
STAMP      := $(VENV)/.installed-stamp
UP_STAMP   := $(VENV)/.installed-up
BASE_STAMP := $(VENV)/.installed-base

.PHONY: venv demo demo-cold demo-local krew test prereqs up-prepare lint typecheck unit sim check-python clean crds bench bench-peers bench-big bench-cluster bench-scale bench-temporal bench-step argocd-cm

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
	  { echo "Keelgate needs Python 3.11 or newer: set PYTHON=/path/to/python3.11"; exit 1; }

# install(EXTRAS, STAMPS): the venv (made once), the project with EXTRAS in it. The pip that Python
# 3.11+ brings (22.3 or newer, editable installs came in 21.3) does: upgrading it only cost time.
define install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.$(if $(1),[$(1)])'
	touch $(2)
endef

$(BASE_STAMP): pyproject.toml | check-python
	$(call install,,$(BASE_STAMP))

$(UP_STAMP): pyproject.toml | check-python
	$(call install,$(UP_EXTRAS),$(UP_STAMP) $(BASE_STAMP))

$(STAMP): pyproject.toml | check-python
	$(call install,$(EXTRAS),$(STAMP) $(UP_STAMP) $(BASE_STAMP))

venv: $(STAMP)

## demo: the restock run on the local cluster (`make up`): a step pod killed right after the
## order, OutcomeUnknown, a Reconciliation settled with kubectl as alice, one order
demo: up
	$(E2E_PY) examples/restock/cluster_demo.py --dir $(DEV_DIR)

## demo-cold: what a newcomer's first `make demo` costs: a fresh clone of HEAD in a temporary
## folder, Go's and pip's caches empty, wall and CPU time and where they go (bench/demo_cold.py;
## figures in docs/control-plane.md); needs an idle machine for a wall time worth quoting
demo-cold: check-python
	$(PYTHON) bench/demo_cold.py $(COLD_ARGS)

## demo-local: the same story in-process, on the embedded SQLite store (no cluster)
demo-local: $(BASE_STAMP)
	$(PY) examples/restock/demo.py

# `make up` (and so `make demo`) on a fresh machine: the Go build of what it runs (CPU-bound) and
# the install of what its venv needs (mostly waiting on the network) run side by side. The build
# needs only the standard library, so it runs on $(PYTHON), before the venv exists.
BUILD_PY := $(PYTHON)
UP_DEPS  := up-prepare
up-prepare: check-python
	@$(MAKE) --no-print-directory -j2 up-build $(UP_STAMP)
up-build: | check-python
up: $(UP_STAMP)
e2e-build: venv

lint: venv e2e-lint
	$(VENV)/bin/ruff check operator tests bench examples deploy
	$(VENV)/bin/ruff format --check operator tests bench examples deploy
	cd operator && ../$(VENV)/bin/lint-imports ../pyproject.toml
	$(PY) -m keelgate.kube.crds --check crds/
	$(PY) -m keelgate.kube.crds --check charts/keelgate/files/crds/
	$(PY) deploy/argocd/argocd_cm.py --check

## crds: regenerate crds/ from the manifest models (the single source of truth)
crds: venv
	$(PY) -m keelgate.kube.crds --write crds/
	$(PY) -m keelgate.kube.crds --write charts/keelgate/files/crds/

## argocd-cm: regenerate deploy/argocd/argocd-cm.yaml from the Argo CD health checks beside it
argocd-cm: venv
	$(PY) deploy/argocd/argocd_cm.py --write

## krew: the plugin's krew archives (one per platform) and its rendered manifest, in dist/krew
krew: venv
	$(PY) deploy/krew/package.py --out dist/krew

## bench: the loop against the raw durable commits it needs (figures: docs/performance.md)
bench: venv
	$(PY) bench/loop_vs_commits.py

## bench-peers: the same iteration through Keelgate, DBOS Transact and LangGraph on the same
## SQLite disk and PostgreSQL server (figures: docs/performance.md); installs the bench extra
bench-peers: venv
	$(PY) -c 'import dbos, langgraph.graph, langgraph.checkpoint.postgres, aiosqlite' 2>/dev/null || \
	  $(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/peers.py

## bench-big: one run of 10,000 iterations: cost per iteration early and late, and the time of
## `keelgate audit --verify` of it (figures: docs/performance.md)
bench-big: venv
	$(PY) bench/big_run.py

## bench-temporal: a loop driven through a Temporal workflow against the same in-process, on the
## same PostgreSQL server (figures: docs/performance.md)
bench-temporal: venv
	$(PY) bench/temporal_vs_inprocess.py

## bench-step: `keelgate step` from exec to its checkpoint loaded, 20 starts per store, beside
## bare Python (figures: docs/performance.md)
bench-step: venv
	$(PY) bench/step_start.py

## bench-cluster: the operator on the local control plane: step start, hand-off, API writes per
## step, operator memory (figures: docs/performance.md)
bench-cluster: venv e2e-build
	$(PY) bench/cluster_steps.py

## bench-scale: one operator against 1,000, 5,000 and 10,000 runs under way, on kwok's fake
## nodes (built from its Go module here, only for this bench) with a hollow step executor
## running each step's real work (about 50 minutes; figures and plot: docs/performance.md);
## installs the bench-scale extra (matplotlib, py-spy)
bench-scale: venv e2e-build
	$(PY) -c 'import matplotlib, shutil; assert shutil.which("py-spy", path="$(VENV)/bin")' 2>/dev/null || \
	  $(PY) -m pip install --quiet -e '.[bench-scale]'
	$(PY) bench/scale.py --plot docs/images/scale-kwok.png $(SCALE_ARGS)

# The second run holds the operator's unit-test fake and rig to the seams the real classes fit.
typecheck: venv
	$(VENV)/bin/mypy
	MYPYPATH=tests $(VENV)/bin/mypy tests/fakes/kube_api.py tests/support/operator_rig.py

unit: venv
	$(VENV)/bin/pytest -q -p no:cacheprovider tests

## sim: seeded simulations of whole runs on virtual time, judged by the promise's oracle
## (docs/simulation.md): SEEDS seeds (default 1000), or fresh seeds for SECONDS=N seconds.
## SIM_FLAGS (default: every move of issues 46 and 48, as `make test`'s budget runs them;
## SIM_FLAGS= for none). `make test` runs a fixed budget of them (tests/test_simulation.py).
SEEDS ?= 1000
SIM_FLAGS ?= --every-move
sim: venv
	$(PY) -m keelgate.testing.sim $(SIM_FLAGS) $(if $(SECONDS),--seconds $(SECONDS),--seeds $(SEEDS))

## prereqs: `make test`'s first step, and so CI's: finds Go, kubectl, PostgreSQL, Chromium and
## chromedriver, and installs the last two (Debian's packages, as root) when they are missing;
## else one line for each missing program says what to run
prereqs: venv
	$(E2E_PY) -m keelgate_e2e.prereqs

# Nothing starts before the prerequisite step has passed (under -j too), and the control-plane
# binaries are built (or found) before pytest starts: a cold build inside a test fixture would
# outlast any test timeout.
test: prereqs lint typecheck unit e2e-test
e2e-test: prereqs
ifneq ($(filter test,$(MAKECMDGOALS)),)
lint e2e-lint typecheck unit e2e-build: | prereqs
endif

clean:
	rm -rf $(VENV) .keelgate .mypy_cache .ruff_cache .pytest_cache

include e2e/e2e.mk
