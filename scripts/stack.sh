#!/usr/bin/env bash
# Run the whole stack as native processes (no Docker needed): two simulated engines (vLLM and
# SGLang flavours), one worker per engine, the budget and accounting services, the router, the
# gateway, and Prometheus + Alertmanager where they can be installed. `up` is idempotent; `down` drains them with SIGTERM. Logs and pids under .run/. Ports can be changed with the variables below.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
RUN="${LLMLAB_RUN_DIR:-.run}"
GATEWAY_PORT="${GATEWAY_PORT:-8080}"
BUDGET_PORT="${BUDGET_PORT:-8085}"
ACCOUNTING_PORT="${ACCOUNTING_PORT:-8086}"
ROUTER_PORT="${ROUTER_PORT:-8087}"
SIM_VLLM_PORT="${SIM_VLLM_PORT:-8001}"
SIM_SGLANG_PORT="${SIM_SGLANG_PORT:-8002}"
WORKER_VLLM_PORT="${WORKER_VLLM_PORT:-8091}"
WORKER_SGLANG_PORT="${WORKER_SGLANG_PORT:-8092}"
PROMETHEUS_PORT="${PROMETHEUS_PORT:-9090}"
ALERTMANAGER_PORT="${ALERTMANAGER_PORT:-9093}"
SIM_TTFT_MS="${SIM_TTFT_MS:-100}"
SIM_ITL_MS="${SIM_ITL_MS:-30}"
export LLMLAB_NAMESPACE="${LLMLAB_NAMESPACE:-llmlab}"
# A local stack with the documented dev keys: dev unless the caller says otherwise (unset is prod).
export LLMLAB_ENV="${LLMLAB_ENV:-dev}"
mkdir -p "$RUN/logs"

log() { echo "[stack] $*" >&2; }

alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

launch() {  # name env... -- cmd...: start it in the background unless it runs already
  local name=$1; shift
  local envs=()
  while [[ $1 != "--" ]]; do envs+=("$1"); shift; done; shift
  if alive "$name"; then log "$name already running (pid $(cat "$RUN/$name.pid"))"; return; fi
  env "${envs[@]}" nohup "$@" >"$RUN/logs/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
}

await_ready() {  # name ready_url [seconds]
  local name=$1 ready=$2 tries=$(( ${3:-30} * 5 ))
  for _ in $(seq 1 "$tries"); do
    if curl -fsS "$ready" >/dev/null 2>&1; then log "$name ready ($ready)"; return; fi
    if ! alive "$name"; then log "$name exited; last log lines:"; tail -20 "$RUN/logs/$name.log" >&2; exit 1; fi
    sleep 0.2
  done
  log "$name not ready after ${3:-30} s; see $RUN/logs/$name.log"; exit 1
}

start() {  # name ready_url env... -- cmd...
  local name=$1 ready=$2; shift 2
  launch "$name" "$@"
  await_ready "$name" "$ready"
}

# The services start together (each spends seconds importing, mostly on one core) and are awaited
# after: the workers once their engines answer, the budget before its demo keys are written.
up() {
  bash scripts/ensure-infra.sh
  launch sim-vllm LLMLAB_LOG_LEVEL=WARNING -- \
    $PY -m llmlab_engine_sim --flavor vllm --port "$SIM_VLLM_PORT" --model meta-llama/Llama-3.1-8B-Instruct \
    --ttft-ms "$SIM_TTFT_MS" --itl-ms "$SIM_ITL_MS" --max-num-seqs 512 --output-len 128
  launch sim-sglang LLMLAB_LOG_LEVEL=WARNING -- \
    $PY -m llmlab_engine_sim --flavor sglang --port "$SIM_SGLANG_PORT" --model Qwen/Qwen3-32B \
    --ttft-ms "$SIM_TTFT_MS" --itl-ms "$SIM_ITL_MS" --max-num-seqs 512 --output-len 128
  launch budget LLMLAB_BUDGET_PORT="$BUDGET_PORT" -- $PY -m llmlab_budget
  # Accounting owns its chdb directory (one process per directory; a second one is refused).
  launch accounting LLMLAB_ACCOUNTING_PORT="$ACCOUNTING_PORT" \
    LLMLAB_ACCOUNTING_DATA_DIR="$RUN/accounting/chdb" -- $PY -m llmlab_accounting
  launch router LLMLAB_ROUTER_PORT="$ROUTER_PORT" \
    LLMLAB_ROUTER_DECISION_LOG="$RUN/router-decisions.jsonl" -- $PY -m llmlab_router
  launch gateway LLMLAB_GATEWAY_PORT="$GATEWAY_PORT" \
    LLMLAB_GATEWAY_AUTH=budget LLMLAB_GATEWAY_ROUTER=service \
    LLMLAB_GATEWAY_DECISION_LOG="$RUN/gateway-decisions.jsonl" -- $PY -m llmlab_gateway
  # Everything above starts at once: on 2 cores the last one ready may take longer than one alone.
  await_ready sim-vllm "http://127.0.0.1:$SIM_VLLM_PORT/health" 60
  await_ready sim-sglang "http://127.0.0.1:$SIM_SGLANG_PORT/health" 60
  launch worker-vllm LLMLAB_WORKER_PORT="$WORKER_VLLM_PORT" \
    LLMLAB_WORKER_POOL=gpu-vllm LLMLAB_WORKER_ENGINE_URL="http://127.0.0.1:$SIM_VLLM_PORT" \
    LLMLAB_WORKER_MAX_CONCURRENCY=512 -- $PY -m llmlab_worker_vllm
  launch worker-sglang LLMLAB_WORKER_PORT="$WORKER_SGLANG_PORT" \
    LLMLAB_WORKER_POOL=gpu-sglang LLMLAB_WORKER_ENGINE_URL="http://127.0.0.1:$SIM_SGLANG_PORT" \
    LLMLAB_WORKER_MAX_CONCURRENCY=512 -- $PY -m llmlab_worker_sglang
  await_ready budget "http://127.0.0.1:$BUDGET_PORT/ready" 60
  # A demo tenant and API key (kept across restarts while it still authenticates).
  $PY -m llmlab_budget.bootstrap --tenant demo --plan enterprise --key-file "$RUN/api-key"
  # ... and one with a 100-token daily budget, to show a refusal before any worker sees it.
  $PY -m llmlab_budget.bootstrap --tenant demo-tiny --plan free --key-file "$RUN/api-key-tiny" \
    --limit daily_tokens=100
  await_ready accounting "http://127.0.0.1:$ACCOUNTING_PORT/ready" 60
  await_ready router "http://127.0.0.1:$ROUTER_PORT/ready" 60
  await_ready gateway "http://127.0.0.1:$GATEWAY_PORT/ready" 60
  await_ready worker-vllm "http://127.0.0.1:$WORKER_VLLM_PORT/ready" 60
  await_ready worker-sglang "http://127.0.0.1:$WORKER_SGLANG_PORT/ready" 60
  monitoring_up
  log "up: gateway at http://127.0.0.1:$GATEWAY_PORT/v1 (API key in $RUN/api-key), budget admin API at" \
    "http://127.0.0.1:$BUDGET_PORT/admin/v1 (dev admin key sk-admin-dev), namespace $LLMLAB_NAMESPACE"
}

# Prometheus (Debian's, scripts/ensure-prometheus.sh) scraping the native stack with the project's
# rules, and Alertmanager: optional, skipped with a note where they cannot be installed.
prometheus_config() {
  local repo; repo=$(pwd)
  cat <<EOF
# Written by scripts/stack.sh for the native stack (docker compose uses infra/prometheus/prometheus.yml).
global: {scrape_interval: 5s, scrape_timeout: 4s, evaluation_interval: 5s}
rule_files: ["$repo/infra/prometheus/rules/*.yml"]
alerting:
  alertmanagers: [{static_configs: [{targets: ["127.0.0.1:$ALERTMANAGER_PORT"]}]}]
scrape_configs:
  - {job_name: gateway, static_configs: [{targets: ["127.0.0.1:$GATEWAY_PORT"]}]}
  - {job_name: workers, static_configs: [{targets: ["127.0.0.1:$WORKER_VLLM_PORT", "127.0.0.1:$WORKER_SGLANG_PORT"]}]}
  - {job_name: engines, static_configs: [{targets: ["127.0.0.1:$SIM_VLLM_PORT", "127.0.0.1:$SIM_SGLANG_PORT"], labels: {source: sim}}]}
  - {job_name: budget, static_configs: [{targets: ["127.0.0.1:$BUDGET_PORT"]}]}
  - {job_name: router, static_configs: [{targets: ["127.0.0.1:$ROUTER_PORT"]}]}
  - {job_name: accounting, static_configs: [{targets: ["127.0.0.1:$ACCOUNTING_PORT"]}]}
EOF
}

monitoring_up() {
  if ! bash scripts/ensure-prometheus.sh >/dev/null 2>&1; then
    log "Prometheus/Alertmanager not installed (scripts/ensure-prometheus.sh needs root or apt): no dashboard snapshot"
    return
  fi
  mkdir -p "$RUN/prometheus" "$RUN/alertmanager"
  prometheus_config >"$RUN/prometheus.yml"
  start alertmanager "http://127.0.0.1:$ALERTMANAGER_PORT/-/ready" -- prometheus-alertmanager \
    --config.file=infra/alertmanager/alertmanager.yml --storage.path="$RUN/alertmanager" \
    --web.listen-address="127.0.0.1:$ALERTMANAGER_PORT" --cluster.listen-address=
  start prometheus "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" -- prometheus \
    --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/prometheus" \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT"
  log "Prometheus at http://127.0.0.1:$PROMETHEUS_PORT (rules loaded), Alertmanager at http://127.0.0.1:$ALERTMANAGER_PORT"
}

down() {
  for name in prometheus alertmanager gateway router budget accounting worker-vllm worker-sglang sim-vllm sim-sglang; do
    if alive "$name"; then
      kill -TERM "$(cat "$RUN/$name.pid")"
      for _ in $(seq 1 100); do alive "$name" || break; sleep 0.1; done
      alive "$name" && kill -KILL "$(cat "$RUN/$name.pid")"
      log "$name stopped"
    fi
    rm -f "$RUN/$name.pid"
  done
}

status() {
  for name in sim-vllm sim-sglang worker-vllm worker-sglang budget accounting router gateway alertmanager prometheus; do
    if alive "$name"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
