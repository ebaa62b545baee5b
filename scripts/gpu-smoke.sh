#!/usr/bin/env bash
# GPU smoke test: the REAL engines (vLLM, SGLang) behind our worker and gateway.
#
# UNVERIFIED: written without a GPU; it has not been run yet.
#
# For a machine WITH an NVIDIA GPU (nvidia-smi works) and the engines installed:
#   pip install vllm              # provides `vllm serve`
#   pip install "sglang[all]"     # provides `python -m sglang.launch_server`
# either in the repo venv or each in its own venv (point VLLM_BIN / SGLANG_PYTHON at it), plus the
# services (`make install`, the repo .venv) and NATS: LLMLAB_NATS_URL, or a server on
# 127.0.0.1:4222, or `nats-server` on PATH (then one is started for the run).
#
# For each engine in GPU_SMOKE_ENGINES (default "vllm sglang"), one after the other so each has
# the whole GPU:
#   1. start the real server on a free port, launched with the serving pipeline's flags
#      (configs/pipelines/, GPU_SMOKE_PIPELINE: the argv comes from
#      `python -m llmlab_experiments.pipelines argv --pipeline P --engine E --model M --port N`);
#   2. wait until GET /health answers 200 (download + load + CUDA graphs: up to STARTUP_TIMEOUT_S);
#   3. run the worker contract + gateway streaming checks against it:
#        pytest -m gpu tests/gpu   with LLMLAB_GPU_ENGINE, LLMLAB_GPU_ENGINE_URL, LLMLAB_GPU_MODEL;
#   4. stop the server (its whole process group).
# Then it writes results/gpu-smoke-<UTC time>.json (engine versions, GPU from nvidia-smi,
# pass/fail per engine) and exits non-zero if anything failed. Logs: results/tmp/gpu-smoke-<time>/.
#
# Flags checked against the documentation (2026-12); the pipeline flags are checked in
# experiments/llmlab_experiments/pipelines.py (KNOWN_FLAGS, with sources) and configs/pipelines/*.yaml:
#   vLLM:   https://docs.vllm.ai/en/stable/cli/serve/ and .../cli/ (`vllm serve MODEL`, model
#           positional; --served-model-name, --host, --port, --max-model-len,
#           --gpu-memory-utilization are engine arguments, vllm/engine/arg_utils.py); GET /health.
#   SGLang: https://docs.sglang.io/advanced_features/server_arguments.html (--model-path,
#           --served-model-name, --host, --port, --enable-metrics [without it no /metrics],
#           --mem-fraction-static); GET /health.
#
# Environment (all optional):
#   GPU_SMOKE_ENGINES   engines to test, in order            (default: "vllm sglang")
#   GPU_SMOKE_PIPELINE  serving pipeline whose flags launch each engine: A, B, C, D or
#                       throughput, latency, long_context, experimental (default: B, the latency pipeline:
#                       --max-model-len 4096 --gpu-memory-utilization 0.85 for vLLM, --mem-fraction-static 0.8
#                       --enable-metrics for SGLang, as before, plus its batch/queue limits; C needs 2 GPUs)
#   VLLM_MODEL          HF id or path for vLLM                 (default: Qwen/Qwen2.5-1.5B-Instruct)
#   VLLM_NAME           its served model name                  (default: gpu-smoke/vllm)
#   SGLANG_MODEL        HF id or path for SGLang               (default: Qwen/Qwen2.5-1.5B-Instruct)
#   SGLANG_NAME         its served model name                  (default: gpu-smoke/sglang)
#   VLLM_BIN            the vllm CLI                            (default: vllm)
#   VLLM_PYTHON         python that imports vllm (version)      (default: next to VLLM_BIN, else python3)
#   SGLANG_PYTHON       python that imports sglang              (default: python3)
#   PYTHON              python of the services and pytest       (default: <repo>/.venv/bin/python)
#   STARTUP_TIMEOUT_S   per engine                              (default: 1800)
#   HF_TOKEN            for gated models (Llama); read by both engines from the environment
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

GPU_SMOKE_ENGINES="${GPU_SMOKE_ENGINES:-vllm sglang}"
GPU_SMOKE_PIPELINE="${GPU_SMOKE_PIPELINE:-B}"
VLLM_MODEL="${VLLM_MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
VLLM_NAME="${VLLM_NAME:-gpu-smoke/vllm}"
SGLANG_MODEL="${SGLANG_MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
SGLANG_NAME="${SGLANG_NAME:-gpu-smoke/sglang}"
VLLM_BIN="${VLLM_BIN:-vllm}"
SGLANG_PYTHON="${SGLANG_PYTHON:-python3}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
STARTUP_TIMEOUT_S="${STARTUP_TIMEOUT_S:-1800}"

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RESULTS_DIR="$REPO/results"
RESULT_JSON="$RESULTS_DIR/gpu-smoke-$STAMP.json"
LOG_DIR="$RESULTS_DIR/tmp/gpu-smoke-$STAMP"
ENGINE_RESULTS="$LOG_DIR/engines.jsonl"  # one JSON object per engine, assembled at the end
mkdir -p "$LOG_DIR"
: > "$ENGINE_RESULTS"

log() { printf '[gpu-smoke] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# -- cleanup: whatever this script started, by process group id --------------------------------
SERVER_PID=""
NATS_PID=""
stop_group() {  # stop_group PID NAME: SIGTERM the process group, SIGKILL after 60 s
  local pid="$1" name="$2"
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping $name (process group $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name ignored SIGTERM for 60 s; killing"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then stop_group "$SERVER_PID" "engine server"; fi
  if [[ -n "$NATS_PID" ]]; then stop_group "$NATS_PID" "nats-server"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# -- preflight ------------------------------------------------------------------------------------
[[ -x "$PY" ]] || die "no python at $PY: run \`make install\` (or set PYTHON)"
"$PY" -c 'import llmlab_gateway, llmlab_worker_vllm, llmlab_worker_sglang, llmlab_testkit, llmlab_experiments, openai' \
  || die "the services are not installed in $PY: run \`make install\`"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU"
GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)" \
  || die "nvidia-smi failed: no usable GPU"
log "GPU: ${GPU_INFO//$'\n'/; }"

# NATS for the worker and the gateway (the tests' Stack reads LLMLAB_NATS_URL).
if [[ -z "${LLMLAB_NATS_URL:-}" ]]; then
  if "$PY" -c 'import socket; socket.create_connection(("127.0.0.1", 4222), timeout=1)' 2>/dev/null; then
    export LLMLAB_NATS_URL="nats://127.0.0.1:4222"
    log "using the NATS server already on 127.0.0.1:4222"
  else
    command -v nats-server >/dev/null || die "no NATS: set LLMLAB_NATS_URL, start one on :4222, or install nats-server"
    nats_port="$(free_port)"
    mkdir -p "$LOG_DIR/nats-store"
    setsid nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$LOG_DIR/nats-store" >"$LOG_DIR/nats.log" 2>&1 &
    NATS_PID=$!
    export LLMLAB_NATS_URL="nats://127.0.0.1:$nats_port"
    for _ in $(seq 1 50); do
      "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $nats_port), timeout=1)" 2>/dev/null && break
      kill -0 "$NATS_PID" 2>/dev/null || die "nats-server exited: $(tail -5 "$LOG_DIR/nats.log")"
      sleep 0.2
    done
    log "started nats-server -js on 127.0.0.1:$nats_port (pid $NATS_PID)"
  fi
fi

# -- per engine -------------------------------------------------------------------------------------
record() {  # record ENGINE STATUS REASON VERSION MODEL NAME STARTUP_S PYTEST_RC
  "$PY" - "$@" >>"$ENGINE_RESULTS" <<'PYEOF'
import json, sys
engine, status, reason, version, model, name, startup_s, pytest_rc = sys.argv[1:9]
print(json.dumps({
    "engine": engine, "status": status, "reason": reason or None, "version": version or None,
    "model": model, "served_model_name": name,
    "startup_s": float(startup_s) if startup_s else None,
    "pytest_exit_code": int(pytest_rc) if pytest_rc else None,
}))
PYEOF
}

engine_version() {  # engine_version ENGINE: prints the version, or fails
  case "$1" in
    vllm)
      local vpy="${VLLM_PYTHON:-}"
      if [[ -z "$vpy" ]]; then
        local vbin
        vbin="$(command -v "$VLLM_BIN" 2>/dev/null || true)"
        if [[ -n "$vbin" && -x "$(dirname "$vbin")/python" ]]; then vpy="$(dirname "$vbin")/python"; else vpy=python3; fi
      fi
      "$vpy" -c 'import vllm; print(vllm.__version__)'
      ;;
    sglang)
      "$SGLANG_PYTHON" -c 'import sglang; print(sglang.__version__)'
      ;;
  esac
}

wait_health() {  # wait_health URL PID LOG: 0 once /health is 200; 1 on exit or timeout
  local url="$1" pid="$2" logf="$3" start=$SECONDS next_report=$((SECONDS + 60))
  while (( SECONDS - start < STARTUP_TIMEOUT_S )); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "server exited during startup; last lines of $logf:"
      tail -30 "$logf" >&2 || true
      return 1
    fi
    if "$PY" -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('$url/health', timeout=5).status == 200 else 1)" 2>/dev/null; then
      return 0
    fi
    if (( SECONDS >= next_report )); then
      log "  still waiting for $url/health ($((SECONDS - start)) s; log: $logf)"
      next_report=$((SECONDS + 60))
    fi
    sleep 5
  done
  log "no healthy server at $url after ${STARTUP_TIMEOUT_S} s; last lines of $logf:"
  tail -30 "$logf" >&2 || true
  return 1
}

run_engine() {  # run_engine ENGINE
  local engine="$1" model name port version logf rc start startup_s
  case "$engine" in
    vllm) model="$VLLM_MODEL"; name="$VLLM_NAME" ;;
    sglang) model="$SGLANG_MODEL"; name="$SGLANG_NAME" ;;
    *) log "unknown engine '$engine' (vllm | sglang)"; record "$engine" fail "unknown engine" "" "" "" "" ""; return 1 ;;
  esac
  log "=== $engine: $model served as $name ==="

  if ! version="$(engine_version "$engine" 2>"$LOG_DIR/$engine-version.err")"; then
    log "$engine is not importable: $(tail -1 "$LOG_DIR/$engine-version.err")"
    record "$engine" fail "engine not installed" "" "$model" "$name" "" ""
    return 1
  fi
  log "$engine version $version"

  port="$(free_port)"
  logf="$LOG_DIR/$engine-server.log"
  # setsid: the server (and the worker processes it spawns) get their own process group, which
  # stop_group ends as a whole.
  local exe argv_out
  case "$engine" in
    vllm) exe="$VLLM_BIN" ;;
    sglang) exe="$SGLANG_PYTHON" ;;
  esac
  # The launch command is the pipeline's (configs/pipelines/), one argument per line.
  if ! argv_out="$("$PY" -m llmlab_experiments.pipelines argv --pipeline "$GPU_SMOKE_PIPELINE" --engine "$engine" \
      --model "$model" --port "$port" --host 127.0.0.1 --served-model-name "$name" --exe "$exe" 2>"$LOG_DIR/$engine-argv.err")"; then
    log "no launch argv for pipeline $GPU_SMOKE_PIPELINE: $(tail -1 "$LOG_DIR/$engine-argv.err")"
    record "$engine" fail "bad pipeline $GPU_SMOKE_PIPELINE" "$version" "$model" "$name" "" ""
    return 1
  fi
  local -a argv
  mapfile -t argv <<<"$argv_out"
  log "pipeline $GPU_SMOKE_PIPELINE: ${argv[*]}"
  setsid "${argv[@]}" >"$logf" 2>&1 &
  SERVER_PID=$!
  log "started $engine server (pid $SERVER_PID) on 127.0.0.1:$port; log $logf"

  start=$SECONDS
  if ! wait_health "http://127.0.0.1:$port" "$SERVER_PID" "$logf"; then
    stop_group "$SERVER_PID" "$engine server"; SERVER_PID=""
    record "$engine" fail "server did not become healthy" "$version" "$model" "$name" "" ""
    return 1
  fi
  startup_s=$((SECONDS - start))
  log "$engine healthy after ${startup_s} s; running pytest -m gpu tests/gpu"

  if LLMLAB_GPU_ENGINE="$engine" LLMLAB_GPU_ENGINE_URL="http://127.0.0.1:$port" LLMLAB_GPU_MODEL="$name" \
     "$PY" -m pytest tests/gpu -m gpu -v -p no:cacheprovider \
       --junitxml="$LOG_DIR/$engine-junit.xml" 2>&1 | tee "$LOG_DIR/$engine-pytest.log" >&2; then
    rc=0
  else
    rc=${PIPESTATUS[0]}
  fi

  stop_group "$SERVER_PID" "$engine server"; SERVER_PID=""
  if [[ "$rc" == 0 ]]; then
    log "$engine: PASS"
    record "$engine" pass "" "$version" "$model" "$name" "$startup_s" "$rc"
    return 0
  fi
  log "$engine: FAIL (pytest exit $rc)"
  record "$engine" fail "pytest failed" "$version" "$model" "$name" "$startup_s" "$rc"
  return 1
}

failed=0
for engine in $GPU_SMOKE_ENGINES; do
  run_engine "$engine" || failed=1
done

# -- results ----------------------------------------------------------------------------------------
"$PY" - "$RESULT_JSON" "$ENGINE_RESULTS" "$GPU_INFO" "$STAMP" "$LOG_DIR" "$GPU_SMOKE_PIPELINE" <<'PYEOF'
import json, subprocess, sys
out, engines_file, gpu_info, stamp, log_dir, pipeline = sys.argv[1:7]
engines = [json.loads(line) for line in open(engines_file) if line.strip()]
try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
except (OSError, subprocess.CalledProcessError):
    commit = None
gpus = []
for line in gpu_info.splitlines():
    parts = [p.strip() for p in line.split(",")]
    gpus.append({"name": parts[0], "driver_version": parts[1] if len(parts) > 1 else None,
                 "memory_total": parts[2] if len(parts) > 2 else None})
result = {
    "run": stamp,
    "git_commit": commit,
    "gpus": gpus,
    "pipeline": pipeline,
    "nvidia_smi": gpu_info,
    "engines": {e["engine"]: e for e in engines},
    "passed": bool(engines) and all(e["status"] == "pass" for e in engines),
    "logs": log_dir,
}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
PYEOF
log "results: $RESULT_JSON"
"$PY" - "$RESULT_JSON" >&2 <<'PYEOF'
import json, sys
for e in json.load(open(sys.argv[1]))["engines"].values():
    print(f"[gpu-smoke]   {e['engine']:7s} {e['status'].upper():4s} version {e['version'] or '-'}  {e['reason'] or ''}")
PYEOF

if [[ "$failed" != 0 ]]; then
  log "FAILED"
  exit 1
fi
log "all engines passed"
