#!/usr/bin/env bash
# Registers gVisor (Debian's runsc) with the local Docker engine as the runtime `runsc`, for the
# tests that run sandboxes under it. Idempotent; exit 1 with a message when it cannot.
#
# gVisor is given `--network=none`: sandboxes of the agent's code have no network anyway, and on
# these machines runsc refuses to start a sandbox whose network it would have to set up.
set -euo pipefail
log() { echo "runsc: $*" >&2; }

registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

# Registered is not enough: the binary it names may have been removed since (a purged package).
if registered && command -v runsc >/dev/null 2>&1; then
  log "already registered"
  exit 0
fi
if ! command -v runsc >/dev/null 2>&1; then
  log "installing Debian's runsc"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2 \
    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2; }
fi
mkdir -p /etc/docker
python3 - "$(command -v runsc)" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
config = {}
if os.path.exists(path):
    with open(path) as f:
        config = json.load(f)
config.setdefault("runtimes", {})["runsc"] = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
PY
pid=$(pidof dockerd || true)
if [ -z "$pid" ]; then
  log "no local dockerd to reload"; exit 1
fi
kill -HUP $pid
for _ in $(seq 1 20); do
  registered && { log "registered"; exit 0; }
  sleep 0.5
done
log "dockerd did not register runsc"
exit 1
