#!/usr/bin/env bash
# Make sure NATS (with JetStream) and Redis answer on localhost; start them when they do not.
# Idempotent: does nothing where they already run (this machine kind starts both before a session).
set -euo pipefail
NATS_PORT="${NATS_PORT:-4222}"
REDIS_PORT="${REDIS_PORT:-6379}"
STATE="${LLMLAB_STATE_DIR:-$HOME/.local/state/llm-inference-lab}"
mkdir -p "$STATE/nats" "$STATE/logs"

log() { echo "[ensure-infra] $*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing $2 from Debian packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  else
    log "$1 not found: install $2 (e.g. 'sudo apt-get install $2') or run 'make compose-up'"; exit 1
  fi
}

if port_open "$NATS_PORT"; then
  log "NATS already on :$NATS_PORT"
else
  need nats-server nats-server
  log "starting nats-server -js on :$NATS_PORT (store $STATE/nats)"
  nohup nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$STATE/nats" >"$STATE/logs/nats.log" 2>&1 &
fi
if port_open "$REDIS_PORT"; then
  log "Redis already on :$REDIS_PORT"
else
  need redis-server redis-server
  log "starting redis-server on :$REDIS_PORT"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$STATE" \
    --appendonly yes --logfile "$STATE/logs/redis.log"
fi
for i in $(seq 1 50); do
  if port_open "$NATS_PORT" && port_open "$REDIS_PORT"; then exit 0; fi
  sleep 0.1
done
log "NATS or Redis did not come up; see $STATE/logs"; exit 1
