#!/usr/bin/env bash
# Which network gVisor can give a sandbox on this machine: starts one container under the runtime
# named by $1 (registered with the engine the `docker` CLI speaks to, DOCKER_HOST honoured) on the
# engine's default bridge, and says how it went. The one probe of scripts/runsc.sh and
# `setup --gvisor` (which embeds this file).
#
# gVisor's own network stack (netstack, runsc's default) copies the container's interfaces into
# the sandbox; on some hosts runsc refuses it ("cannot run with network enabled in root network
# namespace"), and the networked entry is then registered in host-network mode (--network=host:
# the sandbox's sockets are served by the host kernel, inside the container's own namespace).
#
# The container is made from a tiny image of the host's own /bin/true and the libraries it needs
# (PROBE_IMAGE, imported once with `docker import`), so no registry and no sandbox image is
# needed. It has no capabilities and is removed at once.
#
# stdout is one line:
#   works              the container started and /bin/true ran
#   netstack-refused   runsc refused gVisor's own network stack on this host
#   failed REASON      anything else (REASON is the engine's last line, bounded)
# Exit status 0 in all three cases; 2 when the probe itself cannot run (no docker CLI, no runtime
# named), said on stderr.
set -euo pipefail
runtime=${1:-}
PROBE_IMAGE=python-code-sandbox-runsc-probe:1
if [ -z "$runtime" ]; then
  echo "usage: probe-runsc-network.sh RUNTIME" >&2
  exit 2
fi
if ! command -v docker >/dev/null 2>&1; then
  echo "probe-runsc-network: no docker CLI to start the probe with" >&2
  exit 2
fi

if ! docker image inspect "$PROBE_IMAGE" >/dev/null 2>&1; then
  # /bin/true and the libraries the dynamic linker loads for it, as the image's only files.
  files=(bin/true)
  while read -r lib; do
    files+=("${lib#/}")
  done < <(ldd /bin/true 2>/dev/null | grep -o '/[^ ]*' | sort -u)
  if ! tar -C / -ch "${files[@]}" 2>/dev/null |
      docker import --change 'CMD ["/bin/true"]' - "$PROBE_IMAGE" >/dev/null; then
    echo "failed cannot make the probe image from the host's /bin/true"
    exit 0
  fi
fi

out=$(timeout 120 docker run --rm --network bridge --cap-drop ALL --runtime "$runtime" \
  --label io.python-code-sandbox.kind=runsc-probe "$PROBE_IMAGE" /bin/true 2>&1) && {
  echo works
  exit 0
}
if printf '%s' "$out" | grep -q "cannot run with network enabled in root network namespace"; then
  echo netstack-refused
else
  echo "failed $(printf '%s' "$out" | tr -d '\r' | grep -v '^$' | grep -v "docker run --help" | tail -n 1 | tr -cd '[:print:]' | cut -c1-300)"
fi
