#!/usr/bin/env bash
# Make sure a headless Chromium is installed (Debian package chromium): `make loadtest-report`
# renders the report's HTML page with it and keeps the screenshot (report-html.png). Nothing
# else needs it: without it the report is written and says the screenshot was not taken.
# Idempotent: does nothing where chromium is on PATH.
set -euo pipefail

log() { echo "[ensure-chromium] $*" >&2; }

if command -v chromium >/dev/null 2>&1; then
  log "chromium already installed"
  exit 0
fi
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  log "installing chromium from Debian packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  command -v chromium >/dev/null 2>&1 || { log "chromium still missing after apt-get install"; exit 1; }
  log "installed: $(chromium --version 2>/dev/null | head -n1)"
else
  log "chromium missing: install it (e.g. 'sudo apt-get install --no-install-recommends chromium'); the report is written without its screenshot"
fi
