#!/usr/bin/env bash
# Installs the newest runsc Debian's archive offers this machine (on bookworm: from
# bookworm-backports, pinned so that only runsc comes from there; on trixie and later: the
# release's own), upgrading an older one, and registers it with the local Docker engine twice,
# for the tests that run sandboxes under it:
#   runsc      --network=none: sandboxes without a network (the default policy);
#   runsc-net  networked sandboxes (SANDBOX_NETWORK=allowlist|bridge) and installers: gVisor's own
#              network stack where runsc accepts it on this host, else host-network mode
#              (--network=host: the sandbox's sockets served by the host kernel inside the
#              container's own network namespace), as src/cli/probe-runsc-network.sh finds.
# The install step (src/cli/install-runsc.sh) and the probe are the ones
# `python-code-sandbox setup --gvisor` runs. runtimeArgs an administrator gave an entry are kept.
# Idempotent; exit 1 with a message naming the cause when it cannot.
set -euo pipefail
log() { echo "runsc: $*" >&2; }

# The engine's entry for runtime $1 ("<path> <args...>"), empty when it lists none.
registered_entry() {
  docker info --format '{{json .Runtimes}}' 2>/dev/null | python3 -c '
import json, sys
entry = json.load(sys.stdin).get(sys.argv[1])
if entry:
    print(" ".join([entry.get("path", "")] + entry.get("runtimeArgs", [])))' "$1" 2>/dev/null || true
}
# The same entry as daemon.json has it.
written_entry() {
  python3 -c '
import json, sys
entry = (json.load(open("/etc/docker/daemon.json")).get("runtimes") or {}).get(sys.argv[1])
if entry:
    print(" ".join([entry.get("path", "")] + entry.get("runtimeArgs", [])))' "$1" 2>/dev/null || true
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

offline=$(registered_entry runsc)
networked=$(registered_entry runsc-net)
if [ "$changed" = no ] && [ "${offline%% *}" = "$path" ] && [ "${networked%% *}" = "$path" ]; then
  log "already registered: runsc ($offline), runsc-net ($networked)"
  exit 0
fi
pid=$(pidof dockerd || true)
if [ -z "$pid" ]; then
  log "no local dockerd to register runsc with"; exit 1
fi
mkdir -p /etc/docker

# Writes the entries into daemon.json (MODE for runsc-net: keep, its own arguments or gVisor's own
# network stack; host, --network=host; remove), reloads dockerd (containers started since run the
# new runsc) and waits until the engine lists what the file says.
register() {
  python3 -c '
import json, os, sys
path, mode = sys.argv[1], sys.argv[2]
name = "/etc/docker/daemon.json"
config = {}
if os.path.exists(name):
    with open(name) as f:
        config = json.load(f)
runtimes = config.setdefault("runtimes", {})
old = runtimes.get("runsc") or {}
runtimes["runsc"] = {"path": path, "runtimeArgs": old.get("runtimeArgs", ["--network=none"])}
old = runtimes.get("runsc-net") or {}
if mode == "remove":
    runtimes.pop("runsc-net", None)
else:
    args = ["--network=host"] if mode == "host" else old.get("runtimeArgs", [])
    runtimes["runsc-net"] = {"path": path, "runtimeArgs": args}
with open(name + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(name + ".tmp", name)' "$path" "$1"
  kill -HUP "$pid"
  for _ in $(seq 1 20); do
    if [ "$(registered_entry runsc)" = "$(written_entry runsc)" ] &&
      [ "$(registered_entry runsc-net)" = "$(written_entry runsc-net)" ]; then
      return 0
    fi
    sleep 0.5
  done
  log "dockerd did not register runsc"
  exit 1
}
probe() {
  bash "$(dirname "$0")/../src/cli/probe-runsc-network.sh" runsc-net || echo "failed the probe could not run"
}

register keep
result=$(probe)
if [ "$result" = netstack-refused ]; then
  log "runsc-net: runsc refuses gVisor's own network stack on this host (\"cannot run with network enabled in root network namespace\"): host-network mode instead"
  register host
  result=$(probe)
fi
if [ "$result" != works ]; then
  log "runsc-net starts no networked sandbox here (${result#failed }): removed, so networked sandboxes run under runc"
  register remove
  log "registered: runsc ($(registered_entry runsc)); new sandboxes run runsc $version"
  exit 0
fi
log "registered: runsc ($(registered_entry runsc)) for sandboxes without a network, runsc-net ($(registered_entry runsc-net)) for networked ones and installers; new sandboxes run runsc $version"
