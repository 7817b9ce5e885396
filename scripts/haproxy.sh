#!/usr/bin/env bash
# Makes HAProxy available on this machine for tests/mcp/test_replicas.py (two servers behind a
# balancer). Installs Debian's `haproxy` when the command is missing; never starts, enables or
# configures a system-wide haproxy service: the test runs its own haproxy process with a
# configuration it writes to a temporary directory.
#
# Idempotent. Exit code 1 with a clear message when haproxy cannot be installed.
set -euo pipefail

log() { echo "haproxy.sh: $*" >&2; }

if command -v haproxy >/dev/null 2>&1; then
  log "$(haproxy -v 2>&1 | head -n 1)"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "haproxy is missing and installing it needs root (apt-get install -y haproxy)"
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  log "haproxy is missing and this machine has no apt-get: install haproxy (2.x) by other means"
  exit 1
fi

# The package's maintainer scripts would start the service through invoke-rc.d: a policy-rc.d
# that answers 101 ("action forbidden") keeps them from it. One that exists already (Docker's
# Debian images ship one) is left as it is.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  added_policy=1
fi
remove_policy() { if [ "$added_policy" = 1 ]; then rm -f "$policy"; fi; }
trap remove_policy EXIT

log "apt-get update"
DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
log "apt-get install haproxy"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy >&2

# On a machine with systemd the unit may have been enabled anyway; this script never wants it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now haproxy.service >/dev/null 2>&1 || true
fi

if ! command -v haproxy >/dev/null 2>&1; then
  log "apt-get installed haproxy but no haproxy command is on PATH"
  exit 1
fi
log "$(haproxy -v 2>&1 | head -n 1)"
