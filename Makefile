# pai: build, test and run the platform on this machine.
#
# The runtime (Redis, a Docker engine, the test image) comes from
# scripts/runtime.sh and scripts/build-test-image.sh, which install Debian's
# packages when missing and root, and record what they chose in .run/env
# (DOCKER_HOST, PAI_DOCKER_HOST, PAI_REDIS_URL); the targets below source it.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
RUNTIME := scripts/runtime.sh
TEST_IMAGE := scripts/build-test-image.sh
# Run a command with the runtime's settings exported.
WITH_ENV := set -a; [ ! -f .run/env ] || . .run/env; set +a;
PYTEST_ARGS ?=

.PHONY: help install test lint up down demo bench bench-sim clean runtime-test runtime-up \
	image offline-images compose-test test-chaos test-cluster

help: ## list the targets
	@echo "usage: make TARGET"
	@awk -F':.*## ' '/^[a-z-]+:.*## / { printf "  %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

install: $(STAMP) ## create .venv and install pai (server and CLI) with its dev tools

# The server (pyproject.toml) and the CLI (cli/pyproject.toml), both editable:
# .venv runs them from this checkout. A .venv from before the two were split
# still holds the old `pai` distribution, which is removed first.
$(STAMP): pyproject.toml cli/pyproject.toml
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV) || { \
	    echo "could not create $(VENV): install Python's venv module (Debian/Ubuntu: apt-get install python3-venv)"; exit 1; }
	@! $(VENV)/bin/python -m pip show --quiet pai >/dev/null 2>&1 || \
	    $(VENV)/bin/python -m pip uninstall --quiet --yes pai
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' -e ./cli
	@touch $@

runtime-test: install
	@$(RUNTIME) redis-binary
	@$(RUNTIME) prometheus-binary
	@$(RUNTIME) cluster-tools
	@$(RUNTIME) docker
	@$(WITH_ENV) $(TEST_IMAGE)

runtime-up: install
	@$(RUNTIME) redis
	@$(RUNTIME) docker
	@$(WITH_ENV) $(TEST_IMAGE)

# Tests start their own Redis: never point them at the one `make up` runs.
# The suite in two runs. First everything but the chaos suite and the
# multi-host tier, on PYTEST_WORKERS processes (pytest-xdist; a file's tests
# stay on one worker): each worker has a Redis of its own, removes only the
# containers of its own session and takes its own ports. Then those two
# alone: they kill services, load both cores and build network namespaces
# and iptables rules of fixed names. Both run, whatever the first gives.
# PYTEST_ARGS are options of both runs (to run some tests only, call
# .venv/bin/pytest with them).
PYTEST_WORKERS ?= 2
SERIAL_TESTS := tests/chaos tests/cluster
test: runtime-test ## the whole suite on a real Redis and Docker engine
	$(WITH_ENV) unset PAI_REDIS_URL; \
	    $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile \
	        $(addprefix --ignore=,$(SERIAL_TESTS)) $(PYTEST_ARGS); parallel=$$?; \
	    $(VENV)/bin/pytest $(SERIAL_TESTS) $(PYTEST_ARGS); serial=$$?; \
	    [ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

# Three seeds, longer runs and more jobs than the bounded run inside `make test`.
CHAOS_SEEDS ?= 101 202 303
test-chaos: runtime-test ## kill -9 every service, lose a node: nothing lost, doubled or leaked
	$(WITH_ENV) unset PAI_REDIS_URL; CHAOS_SEEDS="$(CHAOS_SEEDS)" CHAOS_JOBS=$${CHAOS_JOBS:-200} \
	    CHAOS_SECONDS=$${CHAOS_SECONDS:-120} $(VENV)/bin/pytest -s tests/chaos $(PYTEST_ARGS)

# A control plane and three node hosts in network namespaces (root): the
# faults of `make test`, with the partitions held 150 s and the outages 5 minutes.
test-cluster: runtime-test ## pai across test hosts: partitions, outages, loss, skew, hangs
	$(WITH_ENV) unset PAI_REDIS_URL; \
	    PAI_CLUSTER_FAULT_SECONDS=$${PAI_CLUSTER_FAULT_SECONDS:-150} \
	    PAI_CLUSTER_OUTAGE_SECONDS=$${PAI_CLUSTER_OUTAGE_SECONDS:-300} \
	    PAI_CLUSTER_AGENT_SECONDS=$${PAI_CLUSTER_AGENT_SECONDS:-120} \
	    $(VENV)/bin/pytest -s --timeout 1200 tests/cluster $(PYTEST_ARGS)

lint: install ## ruff, mypy, and mypy --strict on the pure domain (shared/domain)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict shared/domain

up: runtime-up ## the platform as local processes, logs under .run/
	@if [ -f scripts/up.sh ]; then $(WITH_ENV) bash scripts/up.sh; \
	else echo "Redis and Docker are up; the services arrive with the job lifecycle"; fi

down: ## stop what `make up` (or `make test`) started
	@if [ -f scripts/down.sh ]; then $(WITH_ENV) bash scripts/down.sh; fi
	@$(RUNTIME) stop

demo: up ## run examples/hello-world.json to SUCCEEDED and print its log
	@if [ -f scripts/demo.sh ]; then $(WITH_ENV) bash scripts/demo.sh; \
	else echo "the demo arrives with the job lifecycle"; fi

bench: runtime-test ## the benchmarks in bench/
	@if [ -f bench/__main__.py ]; then $(WITH_ENV) unset PAI_REDIS_URL; $(VENV)/bin/python -m bench; \
	else echo "the benchmarks arrive with bench/__main__.py"; fi

bench-sim: ## replay a synthetic trace through the scheduling policy: one JSON line per policy
	$(VENV)/bin/python -m bench.sim

clean: down ## stop everything and remove .run/
	rm -rf .run

# The container image (Dockerfile); docker compose builds the same one.
# BASE_IMAGE / EXTRA_CA as build arguments when set (see the Dockerfile).
PAI_IMAGE ?= pai:latest
image: ## build the pai container image (PAI_IMAGE, default pai:latest)
	$(WITH_ENV) docker build --network host -t $(PAI_IMAGE) \
	    $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	    $(if $(EXTRA_CA),--build-arg EXTRA_CA=$(EXTRA_CA)) .

offline-images: runtime-test ## build compose's third-party images from Debian's packages (no registry)
	@$(WITH_ENV) scripts/compose-offline-images.sh

compose-test: runtime-test ## only the docker compose end-to-end test (a part of `make test`)
	$(WITH_ENV) unset PAI_REDIS_URL; $(VENV)/bin/pytest -m compose $(PYTEST_ARGS)
