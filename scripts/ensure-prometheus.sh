#!/usr/bin/env bash
# Make sure Prometheus and Alertmanager's binaries are installed: prometheus and promtool
# (Debian package prometheus), prometheus-alertmanager and amtool (prometheus-alertmanager).
# The rule tests (tests/infra/test_prometheus_rules.py: promtool check/test rules, amtool
# check-config) and the alerting end-to-end test (tests/e2e/test_alerting.py) run them; nothing
# here starts them. Idempotent: does nothing where all four are on PATH.
set -euo pipefail

log() { echo "[ensure-prometheus] $*" >&2; }

missing=()
for bin in prometheus promtool prometheus-alertmanager amtool; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "prometheus, promtool, prometheus-alertmanager and amtool already installed"
  exit 0
fi

PACKAGES=(prometheus prometheus-alertmanager)
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  log "missing ${missing[*]}: installing ${PACKAGES[*]} from Debian packages"
  # The packages' postinst scripts start their services; in a container without an init system
  # that cannot work and is not wanted (the tests start their own processes). A policy-rc.d that
  # answers 101 tells invoke-rc.d not to start anything; it is removed again unless it was there.
  own_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  trap '[[ -n "$own_policy" ]] && rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  for bin in "${missing[@]}"; do
    command -v "$bin" >/dev/null 2>&1 || { log "$bin still missing after installing ${PACKAGES[*]}"; exit 1; }
  done
  log "installed: $(prometheus --version 2>&1 | head -n1); $(prometheus-alertmanager --version 2>&1 | head -n1)"
else
  log "missing ${missing[*]}: install ${PACKAGES[*]} (e.g. 'sudo apt-get install --no-install-recommends ${PACKAGES[*]}'), or run this script as root"
  exit 1
fi
