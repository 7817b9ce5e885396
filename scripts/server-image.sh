#!/usr/bin/env bash
# Builds the server image: the release binary, compiled here on the host, on a small Debian
# bookworm base (docker/server/Dockerfile).
#
#   bash scripts/server-image.sh [--offline] [--tag TAG]
#
# Online the base is debian:bookworm-slim (pulled). With --offline, or when that pull fails, the
# base is the debootstrap rootfs python-code-sandbox-base:bookworm that
# `python-code-sandbox image build --offline` imports (made now if missing; needs root and
# debootstrap). No registry is needed then. The binary links against the host's glibc, so the host
# must not have a newer one than bookworm (2.36): build on Debian bookworm (or older).
set -euo pipefail
cd "$(dirname "$0")/.."

tag=python-code-sandbox-server:latest
offline=0
online_base=debian:bookworm-slim
offline_base=python-code-sandbox-base:bookworm
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) offline=1 ;;
    --tag) tag=${2:?--tag needs a value}; shift ;;
    --tag=*) tag=${1#--tag=} ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "server-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "server-image: $*" >&2; }

# A binary built against a newer glibc than the base's fails to start there.
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$glibc" ] && [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -n 1)" != 2.36 ]; then
  log "this host's glibc is $glibc, newer than bookworm's 2.36: the binary would not run on the image's base."
  log "build on Debian bookworm (or older), e.g. inside a rust:bookworm container."
  exit 1
fi

log "cargo build --release"
cargo build --release --locked --bin python-code-sandbox
bin=target/release/python-code-sandbox

base=$online_base
if [ "$offline" = 0 ] && ! docker image inspect "$base" >/dev/null 2>&1; then
  if ! docker pull --quiet "$base" >&2; then
    log "cannot pull $base: building offline"
    offline=1
  fi
fi
if [ "$offline" = 1 ]; then
  base=$offline_base
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    log "$base is missing: making it (debootstrap) with the sandbox image"
    "$bin" image build --offline
  fi
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp docker/server/Dockerfile "$bin" "$context/"
log "building $tag from $base"
# The classic builder uses local images as they are: an offline base is never looked up remotely.
DOCKER_BUILDKIT=0 docker build --quiet --build-arg BASE="$base" --tag "$tag" "$context" >&2
log "built $tag"
