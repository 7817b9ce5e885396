#!/usr/bin/env bash
# Makes a Docker engine available on this machine, and the host tools the project's scripts use.
#
# Idempotent: when a daemon already answers, it does nothing to the engine. Otherwise it installs
# Debian's docker.io (if dockerd is missing) and starts dockerd in the background, then waits, for a
# bounded time, until the daemon answers. Exit code 1 with a clear message when that fails.
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

if daemon_answers; then
  log "docker daemon answers (API $(docker version --format '{{.Server.APIVersion}}'))"
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
