#!/usr/bin/env bash
# Podman for the sandbox server: installs Debian's podman and starts its Docker-compatible API.
#
#   scripts/podman.sh              install podman (idempotent) and start the rootful API service
#                                  on unix:///run/podman/podman.sock; prints the DOCKER_HOST
#   scripts/podman.sh --rootless   the same, plus an unprivileged user (pcs-rootless) with its own
#                                  subuid/subgid ranges and its own service; prints both hosts
#   scripts/podman.sh --stop       stops the services this script started (and nothing else)
#
# Output: lines `DOCKER_HOST=...` (rootful) and `PCS_PODMAN_ROOTLESS_HOST=...` (with --rootless),
# suitable for `eval`. Everything else goes to stderr. Exit 1 with a reason on failure.
#
# Runs as root (apt, the rootful service, creating the user). Services run in the background, not
# under systemd (CI machines have none); their logs and pid files live in $PCS_PODMAN_STATE.
set -euo pipefail

STATE=${PCS_PODMAN_STATE:-/run/pcs-podman}
ROOTFUL_SOCK=/run/podman/podman.sock
ROOTLESS_USER=${PCS_PODMAN_ROOTLESS_USER:-pcs-rootless}
# How long a service may take to answer its first ping: it creates its storage on first start.
WAIT_SECONDS=${PCS_PODMAN_WAIT_SECONDS:-60}

die() {
    echo "podman.sh: $*" >&2
    exit 1
}
say() { echo "podman.sh: $*" >&2; }

mode=start
rootless=0
for arg in "$@"; do
    case "$arg" in
        --rootless) rootless=1 ;;
        --stop) mode=stop ;;
        -h | --help)
            sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument '$arg' (expected --rootless, --stop)" ;;
    esac
done

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts the rootful service)"

# Does the API on this socket answer? (`/_ping` is part of the Docker API Podman serves.)
answers() {
    curl -sf --max-time 5 --unix-socket "$1" http://d/_ping >/dev/null 2>&1
}

# Waits, bounded, for a socket to answer; on failure shows the service's log.
wait_for() {
    local sock=$1 log=$2 pid=$3 i
    for ((i = 0; i < WAIT_SECONDS * 4; i++)); do
        answers "$sock" && return 0
        kill -0 "$pid" 2>/dev/null || {
            tail -n 20 "$log" >&2 || true
            die "the service (pid $pid) exited before answering on $sock; log: $log"
        }
        sleep 0.25
    done
    tail -n 20 "$log" >&2 || true
    die "no answer on $sock within ${WAIT_SECONDS}s; log: $log"
}

# Stops the service whose pid this script recorded, and only that process.
stop_one() {
    local name=$1 pidfile=$STATE/$1.pid pid i
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for ((i = 0; i < 40; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
        say "stopped the $name service (pid $pid)"
    fi
    rm -f "$pidfile"
}

if [ "$mode" = stop ]; then
    stop_one rootless
    stop_one rootful
    exit 0
fi

mkdir -p "$STATE"

# --- install ---------------------------------------------------------------------------------
# uidmap (newuidmap/newgidmap), slirp4netns and fuse-overlayfs are what rootless Podman needs;
# without recommends so that no dbus/systemd user session is pulled in. runc is already there
# (Docker's), and podman accepts it in place of crun.
packages=(podman uidmap slirp4netns fuse-overlayfs)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # One installer at a time: CI runs this beside scripts/remote-engine.sh, which may install too.
    apt_one() { flock /var/lock/pcs-apt.lock apt-get "$@"; }
    apt_one install -y --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1 || {
        # A fresh machine may not have package lists yet.
        apt_one update >>"$STATE/apt.log" 2>&1 || true
        apt_one install -y --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 ||
            { tail -n 20 "$STATE/apt.log" >&2; die "apt-get install ${missing[*]} failed; log: $STATE/apt.log"; }
    }
fi
command -v podman >/dev/null || die "podman is not on PATH after installing it"

# Starts `podman system service` in the background unless its socket already answers.
# $1 name, $2 socket, then the command prefix that runs podman (as root or as the user).
start_service() {
    local name=$1 sock=$2 log=$STATE/$1.log pid
    shift 2
    if answers "$sock"; then
        say "the $name service already answers on $sock"
        return 0
    fi
    stop_one "$name"
    # A socket file left by a killed service would make the new one fail to bind.
    rm -f "$sock"
    # setsid: the service outlives this script and its terminal; --time=0: it never exits idle.
    setsid "$@" podman system service --time=0 "unix://$sock" </dev/null >"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$STATE/$name.pid"
    wait_for "$sock" "$log" "$pid"
    say "the $name service answers on $sock (pid $pid, log $log)"
}

mkdir -p "$(dirname "$ROOTFUL_SOCK")"
start_service rootful "$ROOTFUL_SOCK" env
echo "DOCKER_HOST=unix://$ROOTFUL_SOCK"

[ "$rootless" = 1 ] || exit 0

# --- rootless --------------------------------------------------------------------------------
if ! id -u "$ROOTLESS_USER" >/dev/null 2>&1; then
    say "creating user $ROOTLESS_USER"
    useradd --create-home --shell /usr/sbin/nologin "$ROOTLESS_USER" ||
        die "useradd $ROOTLESS_USER failed"
fi
home=$(getent passwd "$ROOTLESS_USER" | cut -d: -f6)
# useradd gives new users subordinate ids from /etc/login.defs; a user made otherwise may have
# none. Rootless Podman maps the container's uids into these ranges (uid 1000 in a sandbox is a
# subordinate id on the host, not the user itself).
for kind in uid gid; do
    if ! grep -q "^$ROOTLESS_USER:" "/etc/sub$kind"; then
        # A range far above the login.defs ones, unlikely to collide with other users'.
        usermod "--add-sub${kind}s" 600200000-600265535 "$ROOTLESS_USER" ||
            die "could not give $ROOTLESS_USER subordinate ${kind}s"
    fi
done
# Without systemd-logind nobody makes /run/user/UID; a runtime directory of our own, owned by
# the user, is what XDG_RUNTIME_DIR must name (Podman keeps its socket and state there).
runtime_dir=$STATE/rootless-run
mkdir -p "$runtime_dir/podman"
chown "$ROOTLESS_USER:" "$runtime_dir" "$runtime_dir/podman"
chmod 0700 "$runtime_dir"
rootless_sock=$runtime_dir/podman/podman.sock
# runuser (not su/sudo): no PAM session or password is needed; the environment is set explicitly
# so that root's never leaks in. Root can still reach the socket (it can read any directory).
start_service rootless "$rootless_sock" \
    runuser -u "$ROOTLESS_USER" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$home" \
    USER="$ROOTLESS_USER" XDG_RUNTIME_DIR="$runtime_dir"
echo "PCS_PODMAN_ROOTLESS_HOST=unix://$rootless_sock"
