#!/usr/bin/env bash
# make test: every tier that runs here, in two phases, each tier its own pytest process.
#
# Phase 1: the real-vLLM tier (vllm_cpu: engines that keep about 1.5 of the 2 cores busy) beside the
# unit and integration tiers (short tests, under one core), whose output is shown when they end.
# Phase 2: the end-to-end tier (e2e) alone: its tests time whole stacks and load ladders, so nothing
# runs beside them. Measured on a 2-core host (2026-12-07): one pytest process kept 1.01 cores busy
# on average over its 31 minutes; the vllm_cpu tier took 602 s at 1.46 cores, unit and integration
# 246 s at 0.9, e2e 1,014 s at 0.77.
#
# Usage: scripts/test-tiers.sh [pytest args...]; TEST_MARKERS (default "not gpu") narrows every
# tier; PY is the interpreter. A tier that selects nothing (pytest's exit 5) counts as passed; the
# exit status is the first failing tier's, or 5 when no tier selected a test.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MARKERS=${TEST_MARKERS:-not gpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tier() { # name, marker expression, pytest args...
  local name=$1 expr=$2
  shift 2
  "$PY" -m pytest -m "($MARKERS) and ($expr)" --basetemp "$work/$name" "$@"
}

status=0
ran=0
account() { # tier name, its exit status
  case $2 in
    0) ran=1 ;;
    5) echo "== tier $1: no test selected" ;;
    *) ran=1; echo "== tier $1 FAILED (exit $2)"; [ "$status" -ne 0 ] || status=$2 ;;
  esac
}

echo "== phase 1: tier vllm_cpu here; tiers unit and integration beside it (their output follows)"
# The cache plugin off beside: two sessions would write .pytest_cache at once.
tier light "not vllm_cpu and not e2e" -p no:cacheprovider "$@" > "$work/light.log" 2>&1 &
light_pid=$!
tier vllm_cpu "vllm_cpu" "$@"
vllm_rc=$?
light_rc=0
wait "$light_pid" || light_rc=$?
echo "== tiers unit and integration (run beside vllm_cpu)"
cat "$work/light.log"
account vllm_cpu "$vllm_rc"
account "unit and integration" "$light_rc"

echo "== phase 2: tier e2e alone"
tier e2e "e2e and not vllm_cpu" "$@"
account e2e $?

if [ "$status" -eq 0 ] && [ "$ran" -eq 0 ]; then status=5; fi
exit "$status"
