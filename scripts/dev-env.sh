#!/usr/bin/env bash
# Makes a Docker engine available on this machine, with gVisor registered, and the host tools the
# project's scripts use.
#
# Idempotent: when a daemon already answers, it does nothing to start one. Otherwise it installs
# Debian's docker.io (if dockerd is missing) and starts dockerd in the background, then waits, for a
# bounded time, until the daemon answers. Exit code 1 with a clear message when that fails.
# Then gVisor: where this machine can (root, apt-get, a local dockerd), scripts/runsc.sh installs
# the newest runsc Debian's archive offers it (bookworm: bookworm-backports, pinned to runsc
# alone; trixie and later: the release's own), upgrading an older one, and registers it (runsc
# without a network, runsc-net with one), so the agent's code runs under gVisor, the server's
# default when it is registered, whatever its network policy. Where it cannot, it
# says why and how, and the engine stays usable (runc).
# SKIP_GVISOR=1 leaves the runtimes alone.
set -euo pipefail

WAIT_SECONDS=${DOCKER_WAIT_SECONDS:-60}
LOG=${DOCKERD_LOG:-/var/log/dockerd.log}

log() { echo "dev-env: $*" >&2; }

daemon_answers() { timeout 5 docker version --format '{{.Server.APIVersion}}' >/dev/null 2>&1; }

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need root to install $* (apt-get install -y $*)"; exit 1
  fi
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    apt_updated=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# Host tools: debootstrap builds the sandbox image offline (no registry is needed).
if [ "${SKIP_HOST_TOOLS:-0}" != 1 ] && ! command -v debootstrap >/dev/null 2>&1; then
  apt_install debootstrap
fi
# pip makes the runner's IPython for the engine-free tests (scripts/ipython-set.sh).
if [ "${SKIP_HOST_TOOLS:-0}" != 1 ] && ! python3 -m pip --version >/dev/null 2>&1; then
  apt_install python3-pip
fi

register_gvisor() {
  if [ "${SKIP_GVISOR:-0}" = 1 ]; then
    log "SKIP_GVISOR=1: gVisor not registered"
    return 0
  fi
  local why=""
  if [ "$(id -u)" != 0 ]; then
    why="not root"
  elif ! command -v apt-get >/dev/null 2>&1 && ! command -v runsc >/dev/null 2>&1; then
    why="no runsc and no apt-get to install it"
  elif [ -z "$(pidof dockerd || true)" ]; then
    why="the engine is not a dockerd on this machine"
  fi
  if [ -z "$why" ] && bash "$(dirname "$0")/runsc.sh"; then
    log "gVisor (runsc) registered: the agent's code runs under it"
    return 0
  fi
  log "gVisor not registered (${why:-scripts/runsc.sh failed}): the agent's code runs under runc."
  log "for gVisor: sudo bash scripts/runsc.sh, or python-code-sandbox setup --gvisor as root"
}

if daemon_answers; then
  log "docker daemon answers (API $(docker version --format '{{.Server.APIVersion}}'))"
  register_gvisor
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  apt_install docker.io
fi
# docker.io brings the client too; a machine may have a client only.
command -v docker >/dev/null 2>&1 || apt_install docker.io

if ! daemon_answers; then
  log "starting dockerd in the background (log: $LOG)"
  nohup dockerd >"$LOG" 2>&1 &
  for _ in $(seq 1 "$WAIT_SECONDS"); do
    daemon_answers && break
    sleep 1
  done
fi

if ! daemon_answers; then
  log "dockerd did not answer within ${WAIT_SECONDS}s; last lines of $LOG:"
  tail -n 20 "$LOG" >&2 || true
  exit 1
fi
log "docker daemon answers (API $(docker version --format '{{.Server.APIVersion}}'))"
register_gvisor
