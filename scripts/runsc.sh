#!/usr/bin/env bash
# Installs the newest runsc Debian's archive offers this machine (on bookworm: from
# bookworm-backports, pinned so that only runsc comes from there; on trixie and later: the
# release's own), upgrading an older one, and registers it with the local Docker engine as the
# runtime `runsc`, for the tests that run sandboxes under it. The install step is
# src/cli/install-runsc.sh, the same one `python-code-sandbox setup --gvisor` runs.
# Idempotent; exit 1 with a message naming the cause when it cannot.
#
# gVisor is given `--network=none`: sandboxes of the agent's code have no network anyway, and on
# these machines runsc refuses to start a sandbox whose network it would have to set up.
set -euo pipefail
log() { echo "runsc: $*" >&2; }

# The engine's runsc entry ("<path> <args...>"), empty when it lists none.
registered_entry() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | python3 -c '
import json, sys
entry = json.load(sys.stdin).get("runsc")
if entry:
    print(" ".join([entry.get("path", "")] + entry.get("runtimeArgs", [])))' 2>/dev/null || true
}

status=0
out=$(bash "$(dirname "$0")/../src/cli/install-runsc.sh") || status=$?
if [ "$status" != 0 ]; then
  case $status in
    10) why="installing runsc needs root (sudo bash scripts/runsc.sh)" ;;
    11) why="no runsc, and no apt-get to install it: see https://gvisor.dev/docs/user_guide/install/" ;;
    12) why="apt-get update failed (the mirror or a source is unreachable or broken; its output is above)" ;;
    13) why="Debian's archive offers this machine no runsc: see https://gvisor.dev/docs/user_guide/install/" ;;
    14) why="apt-get install runsc failed (its output is above)" ;;
    15) why="cannot write apt's configuration under /etc/apt" ;;
    *) why="src/cli/install-runsc.sh failed (exit $status)" ;;
  esac
  log "$why"
  exit 1
fi
field() { echo "$out" | sed -n "s/^$1=//p"; }
path=$(field path)
version=$(field version)
from=$(field from)
changed=$(field changed)
log "runsc ${version:-(version unknown)} at $path, from $from"

entry=$(registered_entry)
if [ "$changed" = no ] && [ "${entry%% *}" = "$path" ]; then
  log "already registered: $entry"
  exit 0
fi
mkdir -p /etc/docker
# The path is (re)written; runtimeArgs an administrator gave are kept, else --network=none.
python3 - "$path" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
config = {}
if os.path.exists(path):
    with open(path) as f:
        config = json.load(f)
runtimes = config.setdefault("runtimes", {})
old = runtimes.get("runsc") or {}
runtimes["runsc"] = {"path": sys.argv[1], "runtimeArgs": old.get("runtimeArgs", ["--network=none"])}
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
PY
pid=$(pidof dockerd || true)
if [ -z "$pid" ]; then
  log "no local dockerd to reload"; exit 1
fi
# A reload makes the engine read the entry again; containers started since run the new runsc.
kill -HUP $pid
for _ in $(seq 1 20); do
  entry=$(registered_entry)
  if [ "${entry%% *}" = "$path" ]; then
    if [ "$changed" = yes ]; then
      log "registered, dockerd reloaded: new sandboxes run runsc $version ($entry)"
    else
      log "registered: $entry"
    fi
    exit 0
  fi
  sleep 0.5
done
log "dockerd did not register runsc"
exit 1
