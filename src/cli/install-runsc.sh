#!/usr/bin/env bash
# Installs gVisor's runsc, or upgrades an older one, to the newest version Debian's archive offers
# this machine. The one approach of scripts/runsc.sh and `setup --gvisor` (which embeds this file):
#
# - on Debian bookworm, whose own runsc is 0.0~20221219 (ptrace only), bookworm-backports is added
#   as a source when no configured source names it (deb822 where the machine's sources are deb822,
#   else a one-line .list; the mirror is the one the machine already uses), with an apt preferences
#   file that lets only runsc come from backports: runsc at the release's priority (the newer of
#   the two versions wins), everything else at backports' usual 100, which never replaces a
#   package of the release;
# - on any other release (trixie and later carry a newer runsc than bookworm-backports), the
#   release's own package.
#
# Idempotent: the source and the pin are written only when missing or different, the package lists
# are updated only when a source changed or they are a day old, and an up-to-date runsc is left
# alone. Bounded: every apt call runs under `timeout` (RUNSC_APT_TIMEOUT seconds, 600 by default).
#
# stdout, on success, is key=value lines for the caller:
#   path=      the runsc to register (the package's binary)
#   version=   what `runsc --version` says of it
#   from=      where it came from (the archive suite and mirror, or "not apt's")
#   previous=  the version before, empty when there was none
#   changed=   yes when this run installed or upgraded it, else no
# stderr says each step. Exit status, each also said on stderr:
#   10 not root; 11 no runsc and no apt-get to install it; 12 apt-get update failed;
#   13 the archive offers this machine no runsc; 14 apt-get install failed;
#   15 cannot write apt's configuration.
set -euo pipefail
log() { echo "install-runsc: $*" >&2; }

APT_TIMEOUT=${RUNSC_APT_TIMEOUT:-600}
# The one release whose backports carry a newer runsc than the release itself.
BACKPORTS_RELEASES="bookworm"
SOURCE_NAME=python-code-sandbox-backports
PIN_FILE=/etc/apt/preferences.d/python-code-sandbox-runsc

runsc_version() {
  # `runsc --version` says "runsc version 0.0~20240729.0" on its first line.
  timeout 20 "$1" --version 2>/dev/null | awk 'NR == 1 && $2 == "version" { print $3 }' || true
}

report() { # path version from previous changed
  printf 'path=%s\nversion=%s\nfrom=%s\nprevious=%s\nchanged=%s\n' "$@"
}

current=$(command -v runsc || true)
previous=""
[ -z "$current" ] || previous=$(runsc_version "$current")

if ! command -v apt-get >/dev/null 2>&1; then
  if [ -n "$current" ]; then
    log "no apt-get: cannot look for a newer runsc; $current (${previous:-version unknown}) is kept"
    report "$current" "$previous" "not apt's" "$previous" no
    exit 0
  fi
  log "runsc is not installed and this machine has no apt-get to install it"
  exit 11
fi
if [ "$(id -u)" != 0 ]; then
  log "installing or upgrading runsc needs root"
  exit 10
fi

apt_get() {
  DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT" apt-get -q \
    -o Acquire::http::Timeout=30 -o Acquire::Retries=2 -o DPkg::Lock::Timeout=120 "$@" >&2
}

codename=""
distro=""
if [ -r /etc/os-release ]; then
  distro=$(. /etc/os-release && echo "${ID:-}")
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
fi

changed_sources=0
suite=""
if [ "$distro" = debian ] && [ -n "$codename" ] && [[ " $BACKPORTS_RELEASES " == *" $codename "* ]]; then
  suite="$codename-backports"
  # Every configured source, whatever its format, as apt reads them: suite and repository.
  targets=$(apt-get indextargets --format '$(RELEASE) $(REPO_URI) $(TARGET_OF) $(COMPONENT)' 2>/dev/null | sort -u)
  if echo "$targets" | awk -v s="$suite" '$1 == s && $3 == "deb" { found = 1 } END { exit !found }'; then
    log "$suite is already a source"
  else
    mirror=$(echo "$targets" | awk -v s="$codename" '$1 == s && $3 == "deb" && $4 == "main" { print $2; exit }')
    mirror=${mirror:-http://deb.debian.org/debian/}
    mirror=${mirror%/}
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
      file=/etc/apt/sources.list.d/$SOURCE_NAME.sources
      {
        echo "# Added by python-code-sandbox for gVisor's runsc only (see $PIN_FILE)."
        echo "Types: deb"
        echo "URIs: $mirror"
        echo "Suites: $suite"
        echo "Components: main"
        [ ! -f "$keyring" ] || echo "Signed-By: $keyring"
      } >"$file.tmp" || { log "cannot write $file"; exit 15; }
    else
      file=/etc/apt/sources.list.d/$SOURCE_NAME.list
      {
        echo "# Added by python-code-sandbox for gVisor's runsc only (see $PIN_FILE)."
        if [ -f "$keyring" ]; then
          echo "deb [signed-by=$keyring] $mirror $suite main"
        else
          echo "deb $mirror $suite main"
        fi
      } >"$file.tmp" || { log "cannot write $file"; exit 15; }
    fi
    mv "$file.tmp" "$file" || { log "cannot write $file"; exit 15; }
    log "added $suite ($mirror) as a source: $file"
    changed_sources=1
  fi
  pin="# Written by python-code-sandbox: of $suite, only runsc is taken by default (the newer of
# the release's and backports' versions wins); every other package of $suite keeps backports'
# usual priority, which never replaces a package of $codename.
Package: runsc
Pin: release n=$suite
Pin-Priority: 500

Package: *
Pin: release n=$suite
Pin-Priority: 100"
  if [ "$(cat "$PIN_FILE" 2>/dev/null || true)" != "$pin" ]; then
    mkdir -p "$(dirname "$PIN_FILE")"
    { printf '%s\n' "$pin" >"$PIN_FILE.tmp" && mv "$PIN_FILE.tmp" "$PIN_FILE"; } ||
      { log "cannot write $PIN_FILE"; exit 15; }
    log "pinned: only runsc comes from $suite ($PIN_FILE)"
    changed_sources=1
  fi
fi

# Lists to read: after a change, when the suite's are missing, or when they are a day old.
stale=1
if [ "$changed_sources" = 0 ] && [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*_InRelease' -mmin -1440 2>/dev/null | head -n 1)" ]; then
  stale=0
  if [ -n "$suite" ] && [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name "*_dists_${suite}_InRelease" 2>/dev/null | head -n 1)" ]; then
    stale=1
  fi
fi
if [ "$stale" = 1 ]; then
  log "apt-get update"
  apt_get update || { log "apt-get update failed (exit $?): see its output above"; exit 12; }
fi

candidate=$(apt-cache policy runsc 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
  log "the package archive offers this machine (${distro:-unknown} ${codename:-}) no runsc"
  exit 13
fi
installed=$(dpkg-query -W -f '${Status} ${Version}' runsc 2>/dev/null | awk '$3 == "installed" { print $4 }' || true)
changed=no
if [ "$installed" = "$candidate" ]; then
  log "runsc $installed is the newest the archive offers"
else
  log "apt-get install runsc=$candidate${installed:+ (replacing $installed)}"
  apt_get install -y --no-install-recommends "runsc=$candidate" ||
    { log "apt-get install runsc=$candidate failed (exit $?): see its output above"; exit 14; }
  changed=yes
fi

# The package's binary, whatever else is on the PATH.
path=$(dpkg-query -L runsc 2>/dev/null | awk '/\/bin\/runsc$/ { print; exit }')
path=${path:-$(command -v runsc || true)}
if [ -n "$current" ] && [ "$current" != "$path" ] && [ "$(readlink -f "$current")" != "$(readlink -f "$path")" ]; then
  log "note: $current comes first on the PATH but is not the package's; $path is the one to register"
fi
version=$(runsc_version "$path")
# madison: "runsc | <version> | <mirror> <suite>/<component> <arch> Packages"
from=$(apt-cache madison runsc 2>/dev/null |
  awk -F'|' -v v="$candidate" '{ gsub(/ /, "", $2) } $2 == v { split($3, a, " "); sub(/\/.*/, "", a[2]); print a[2] " (" a[1] ")"; exit }')
from=${from:-the package archive}
if [ "$changed" = yes ]; then
  log "installed runsc ${version:-$candidate} (package $candidate) from $from${previous:+, replacing $previous}"
else
  log "runsc ${version:-$candidate} (package $candidate, from $from) is already installed"
fi
report "$path" "$version" "$from" "$previous" "$changed"
