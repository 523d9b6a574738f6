# neuron-helm-chart: a Kubernetes stack for AWS Neuron accelerators.
# Quick start: `make setup` then `make test`; `make demo` runs the stack on a simulated node.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV      := .venv
BIN       := $(VENV)/bin
PYTHON    := $(BIN)/python
SRC_DIRS  := $(wildcard libs/*/src services/*/src)
PY_DIRS   := $(wildcard libs services tests bench tools charts)

export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python caches what it compiles (in __pycache__, which git, the image builds and the chart ignore).
# A machine that sets PYTHONDONTWRITEBYTECODE otherwise compiles the project's own modules in every
# process it starts, and pytest rewrites every test module's asserts on each run: collecting the
# integration stage took 11.4 CPU-seconds so, 3.5 with the cache, in a make test that is CPU-bound.
unexport PYTHONDONTWRITEBYTECODE

# pytest-xdist workers for make unit: one per core, whole modules to a worker (module fixtures start
# once); JOBS=0 runs it in one process. Not for make integration: its scheduling simulations and
# reduced benches run against deadlines, and two of them at once on two cores, beside the cluster
# stage, missed theirs.
JOBS      ?= $(shell nproc)
XDIST     := -n $(JOBS) --dist loadfile

.PHONY: aws-handover k8s-versions k8s-next help setup test lint typecheck unit integration integration-chart integration-rest bench demo protos dashboards dra-config npd-rules chart-docs chart-lint e2e clean cluster-up cluster-down cluster-test images images-build release

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

setup: ## install everything the project needs (idempotent; seconds when nothing changed)
	@tools/setup.sh

test: ## ruff, mypy --strict on src/, then the real-cluster tests with the integration and unit tests beside them; prints each stage's time
	@tools/stage.sh --reset
	@tools/stage.sh lint $(MAKE) --no-print-directory lint
	@tools/stage.sh typecheck $(MAKE) --no-print-directory typecheck
	@tools/stage.sh cluster-test tools/cluster_stage.sh --beside "integration-rest integration-chart unit"
	@tools/stage.sh --summary

lint: ## ruff lint and format check
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)

typecheck: ## mypy --strict over every package's src/
	$(BIN)/mypy $(SRC_DIRS)

unit: ## pure, in-process tests only: a test that starts an external process here fails (mark it integration)
	NEURON_TEST_STAGE=unit $(BIN)/pytest -q $(XDIST) --durations=10 -m 'not integration and not cluster and not e2e and not cluster_down'

INTEGRATION := $(BIN)/pytest -q --durations=20 -m 'integration and not cluster and not e2e and not cluster_down'
integration: ## tests that start real processes: kube-apiserver, kube-scheduler, Prometheus, NFD, helm, the services
	$(INTEGRATION)

# make integration in two parts, which make test runs at different times (tools/cluster_stage.sh)
integration-chart: ## make integration's chart tests (tests/chart) alone
	$(INTEGRATION) tests/chart

integration-rest: ## make integration without its chart tests
	$(INTEGRATION) --ignore=tests/chart

aws-handover: ## replace a release of AWS's neuron-helm-chart by this chart, keeping every node advertised: make aws-handover FROM=release [FROM_NAMESPACE=default] RELEASE=name [NAMESPACE=default] [ARGS='-f values.yaml']
	$(PYTHON) tools/aws_handover.py --from-release "$(FROM)" --from-namespace "$(or $(FROM_NAMESPACE),default)" --release "$(RELEASE)" --namespace "$(or $(NAMESPACE),default)" -- $(ARGS)

release: ## publish, sign and attest the images and the chart: make release REGISTRY=host[:port][/path] VERSION=x.y.z SIGN_KEY=cosign.key
	$(PYTHON) tools/release.py --registry "$(REGISTRY)" --version "$(VERSION)" --sign-key "$(SIGN_KEY)"

cluster-up: ## start the real single-node cluster (etcd, API server, kubelet, containerd) on this machine
	tests/cluster/up.sh

cluster-down: ## stop it (and make cluster-test's second cluster, if one is left) and remove what they mounted and made
	tests/cluster/isolated.sh down .run/isolated-cluster
	tests/cluster/down.sh

images: ## images-build, then import the images into the running cluster's containerd
	tests/cluster/images.sh --import

images-build: ## build the service images from services/Dockerfile with podman, smoke-run them, print their sizes
	tests/cluster/images.sh

cluster-test: ## bring the cluster up, build and import the images, run the cluster and e2e tests, then make demo and a cluster-down that must leave nothing
	tools/cluster_stage.sh

e2e: ## the chart end to end (install, helm test, faults, ct install) on a running cluster: $$KUBECONFIG or make cluster-up's
	KUBECONFIG=$${KUBECONFIG:-$(CURDIR)/.run/cluster/admin.kubeconfig} $(BIN)/pytest -q -m e2e tests/e2e

bench: k8s-versions k8s-next ## run the benchmarks in bench/ and print their figures
	$(PYTHON) bench/run.py

k8s-versions: ## build kube-apiserver and kube-scheduler of the older releases the DRA driver is tested on (tests/simcluster/k8s-1.*; cached)
	for d in tests/simcluster/k8s-1.*; do K8S_MODULE_DIR=$$d K8S_BINARIES="kube-apiserver kube-scheduler" tests/cluster/build-k8s.sh || exit 1; done

k8s-next: ## build the newer Kubernetes release the scheduling bench compares DRA on (cached; minutes the first time)
	K8S_MODULE_DIR=tests/simcluster/k8s-next K8S_BINARIES="kube-apiserver kube-scheduler" tests/cluster/build-k8s.sh

demo: ## the chart on the real cluster over a simulated node (INSTANCE_TYPE, default trn1.32xlarge): capacity, a pod, its metrics, a hardware error
	tools/demo.sh

chart-docs: ## regenerate the chart's values.schema.json (from values.yaml and the services' flags) and README.md (helm-docs)
	$(PYTHON) tools/chart_schema.py
	$(PYTHON) tools/chart_docs.py

chart-lint: ## chart-testing's ct lint (yamale, yamllint, helm lint --strict) over every ci/*-values.yaml
	source "$$(tests/chart/build-tools.sh)/paths.env"; \
	  "$$CT" lint --config ct.yaml --all --lint-conf "$$CT_ETC/lintconf.yaml" --chart-yaml-schema "$$CT_ETC/chart_schema.yaml"

dra-config: ## regenerate the chart's files/dra-opaque-config.yaml (what its DRA config admission policy checks) from the DRA driver's parser
	$(PYTHON) tools/dra_config.py

npd-rules: ## regenerate the chart's files/npd-rules.yaml from the fault table (neuron_health.faults)
	$(BIN)/neuron-problem-detector --print-default-rules > charts/neuron-helm-chart/files/npd-rules.yaml

dashboards: ## regenerate the Grafana dashboards from tools/dashboards.py
	$(PYTHON) tools/dashboards.py

protos: ## regenerate libs/kubelet-api from the pinned k8s.io/kubelet module's .proto files
	PYTHON=$(CURDIR)/$(PYTHON) libs/kubelet-api/regenerate.sh

clean: ## remove the virtualenv and runtime state (the tool cache outside the clone stays)
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache .hypothesis
