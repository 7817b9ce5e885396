#!/usr/bin/env bash
# A second Docker engine that looks like a remote machine, for the remote-engine tests (issue 19).
#
#   scripts/remote-engine.sh start   DIR   # start it (stopping a previous one in DIR first)
#   scripts/remote-engine.sh stop    DIR   # remove everything it made; idempotent
#   scripts/remote-engine.sh restart DIR   # SIGKILL its dockerd (connections drop mid-call), start it again
#
# It lives in a network namespace of its own (NETNS, a veth pair: 10.231.0.1/30 on the host,
# 10.231.0.2/30 inside, no route beyond), with its own state under DIR:
#   - dockerd with its own --data-root, --exec-root, pidfile, managed containerd (own namespace) and
#     an empty daemon.json of its own (so no runsc: the server must fall back to runc), listening on
#     unix://DIR/docker.sock and, with mutual TLS, on tcp://10.231.0.2:2376;
#   - sshd on 10.231.0.2:22 (root by key only), whose sessions have DOCKER_HOST=unix://DIR/docker.sock
#     so that `docker system dial-stdio` on the "far side" reaches this engine;
#   - certificates made with openssl: a test CA, the server's (SAN IP:10.231.0.2), a client's, and an
#     unrelated CA with its own client certificate (which the engine must refuse);
#   - the sandbox image, copied from the main engine with `docker save | docker load` (nothing pulled).
# It writes DIR/tls.env, DIR/ssh.env and DIR/wrong-ca.env (export lines). DIR/bin/ssh wraps
# /usr/bin/ssh with DIR/ssh_config (key, pinned host key): put DIR/bin first on PATH (ssh.env does)
# and both the server (bollard's ssh connector runs `ssh` from PATH) and the docker CLI use it; the
# user's ~/.ssh is never read or written.
#
# Only one remote engine at a time (the namespace and addresses are fixed). Needs root.
set -euo pipefail

NETNS=pcs-remote
HOST_IF=pcsr-host
PEER_IF=pcsr-peer
HOST_IP=10.231.0.1
REMOTE_IP=10.231.0.2
IMAGE=${PCS_REMOTE_IMAGE:-python-code-sandbox:py3.11}
PROXY_IMAGE=python-code-sandbox-proxy:bookworm
MAIN_SOCK=unix:///var/run/docker.sock
OWNER=/run/pcs-remote-engine.dir # which DIR the namespace belongs to (one engine at a time)
MARKER=.pcs-remote-engine # stop removes DIR only when this file says the script made it

usage() {
    echo "usage: $0 start|stop|restart DIR" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
ACTION=$1
DIR=$(realpath -m "$2")
SOCK=$DIR/docker.sock
# Unix socket paths are limited to 108 bytes; containerd's lives under the exec root.
if (( ${#DIR} > 60 )); then
    echo "remote-engine: DIR must be a short path (containerd's socket lives under it): $DIR" >&2
    exit 2
fi

log() { echo "remote-engine: $*" >&2; }

# The docker CLI pointed at this engine (its unix socket), never at whatever DOCKER_HOST says.
rdocker() { env -u DOCKER_TLS_VERIFY -u DOCKER_CERT_PATH -u DOCKER_CONTEXT DOCKER_HOST="unix://$SOCK" docker "$@"; }

ensure_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
    command -v ssh >/dev/null || missing+=(openssh-client)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v ip >/dev/null || missing+=(iproute2)
    if (( ${#missing[@]} )); then
        log "installing ${missing[*]}"
        # One installer at a time: CI runs this beside scripts/podman.sh, which may install too.
        flock /var/lock/pcs-apt.lock apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive flock /var/lock/pcs-apt.lock \
            apt-get install -y --no-install-recommends "${missing[@]}" >&2
    fi
}

in_netns() { nsenter --net="/run/netns/$NETNS" "$@"; }

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() { # seconds description command...
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if (( SECONDS >= deadline )); then
            log "timed out after ${seconds}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

make_certs() {
    local d=$DIR/pki
    mkdir -p "$d" "$DIR/tls-client" "$DIR/tls-wrong-ca"
    cd "$d"
    # EC P-256 keys in PKCS#8: what both dockerd (Go) and bollard (rustls) read.
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
    ca() { # name subject
        key "$1-key.pem"
        openssl req -x509 -new -key "$1-key.pem" -sha256 -days 30 -subj "/CN=$2" -out "$1.pem" \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    }
    leaf() { # name subject ca extfile-lines
        key "$1-key.pem"
        openssl req -new -key "$1-key.pem" -subj "/CN=$2" -out "$1.csr"
        printf '%s\n' "$4" >"$1.ext"
        openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3-key.pem" -CAcreateserial -sha256 -days 30 \
            -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    }
    ca ca "pcs remote engine test CA"
    leaf server "$REMOTE_IP" ca "subjectAltName=IP:$REMOTE_IP
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment"
    leaf client "pcs test client" ca "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
    ca other-ca "an unrelated CA"
    leaf other-client "pcs test client" other-ca "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
    # DOCKER_CERT_PATH layouts (ca.pem, cert.pem, key.pem). The wrong one trusts the right server
    # (so the only thing wrong is the client's certificate).
    cp ca.pem "$DIR/tls-client/ca.pem"
    cp client.pem "$DIR/tls-client/cert.pem"
    cp client-key.pem "$DIR/tls-client/key.pem"
    cp ca.pem "$DIR/tls-wrong-ca/ca.pem"
    cp other-client.pem "$DIR/tls-wrong-ca/cert.pem"
    cp other-client-key.pem "$DIR/tls-wrong-ca/key.pem"
    chmod 600 "$DIR"/tls-*/key.pem ./*-key.pem
    cd - >/dev/null
}

make_ssh() {
    local d=$DIR/ssh
    mkdir -p "$d"
    ssh-keygen -q -t ed25519 -N '' -C "pcs remote engine host" -f "$d/host_key"
    ssh-keygen -q -t ed25519 -N '' -C "pcs remote engine client" -f "$d/client_key"
    cp "$d/client_key.pub" "$d/authorized_keys"
    # The host key pinned: the client accepts this engine's sshd and nothing else.
    echo "$REMOTE_IP $(cut -d' ' -f1,2 "$d/host_key.pub")" >"$d/known_hosts"
    # StrictModes off: DIR may sit under /tmp (world-writable), which sshd's ownership walk refuses.
    cat >"$d/sshd_config" <<EOF
ListenAddress $REMOTE_IP:22
HostKey $d/host_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
AcceptEnv none
SetEnv DOCKER_HOST=unix://$SOCK
MaxSessions 100
MaxStartups 100:30:200
EOF
    cat >"$DIR/ssh_config" <<EOF
Host *
    IdentityFile $d/client_key
    IdentitiesOnly yes
    UserKnownHostsFile $d/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 10
    ServerAliveInterval 10
EOF
    mkdir -p "$DIR/bin"
    cat >"$DIR/bin/ssh" <<EOF
#!/bin/sh
exec /usr/bin/ssh -F $DIR/ssh_config "\$@"
EOF
    chmod 755 "$DIR/bin/ssh"
}

write_env() {
    cat >"$DIR/tls.env" <<EOF
export DOCKER_HOST=tcp://$REMOTE_IP:2376
export DOCKER_TLS_VERIFY=1
export DOCKER_CERT_PATH=$DIR/tls-client
EOF
    cat >"$DIR/wrong-ca.env" <<EOF
export DOCKER_HOST=tcp://$REMOTE_IP:2376
export DOCKER_TLS_VERIFY=1
export DOCKER_CERT_PATH=$DIR/tls-wrong-ca
EOF
    cat >"$DIR/ssh.env" <<EOF
export DOCKER_HOST=ssh://root@$REMOTE_IP
unset DOCKER_TLS_VERIFY DOCKER_CERT_PATH
export PATH=$DIR/bin:\$PATH
EOF
}

setup_netns() {
    if ! ip netns list | grep -qw "^$NETNS"; then
        ip netns add "$NETNS"
    fi
    if ! ip link show "$HOST_IF" >/dev/null 2>&1; then
        ip link add "$HOST_IF" type veth peer name "$PEER_IF"
        ip link set "$PEER_IF" netns "$NETNS"
        ip addr add "$HOST_IP/30" dev "$HOST_IF"
        ip link set "$HOST_IF" up
        ip netns exec "$NETNS" ip addr add "$REMOTE_IP/30" dev "$PEER_IF"
        ip netns exec "$NETNS" ip link set "$PEER_IF" up
        ip netns exec "$NETNS" ip link set lo up
    fi
}

start_dockerd() {
    mkdir -p "$DIR/data" "$DIR/exec"
    [[ -f $DIR/daemon.json ]] || echo '{}' >"$DIR/daemon.json"
    # Inside the network namespace: its bridge, iptables rules and listeners are the namespace's,
    # and its own containerd (under the exec root, namespace pcs-remote) never meets the main
    # engine's. nsenter, not `ip netns exec`: the latter also remounts /sys in a mount namespace of
    # its own, which hides /sys/fs/cgroup from dockerd. setsid: the engine outlives this script.
    in_netns setsid dockerd \
        --config-file "$DIR/daemon.json" \
        --data-root "$DIR/data" \
        --exec-root "$DIR/exec" \
        --pidfile "$DIR/dockerd.pid" \
        --containerd-namespace pcs-remote \
        --containerd-plugins-namespace pcs-remote-plugins \
        --cgroup-parent /pcs-remote \
        --bip 172.31.231.1/24 \
        -H "unix://$SOCK" \
        -H "tcp://$REMOTE_IP:2376" \
        --tlsverify \
        --tlscacert "$DIR/pki/ca.pem" \
        --tlscert "$DIR/pki/server.pem" \
        --tlskey "$DIR/pki/server-key.pem" \
        </dev/null >>"$DIR/dockerd.log" 2>&1 &
    wait_for 120 "the remote dockerd (see $DIR/dockerd.log)" rdocker version
}

start_sshd() {
    pid_alive "$DIR/sshd.pid" && return 0
    mkdir -p /run/sshd # its privilege separation directory (made by the service unit otherwise)
    in_netns /usr/sbin/sshd -f "$DIR/ssh/sshd_config" -E "$DIR/sshd.log"
    wait_for 30 "sshd" pid_alive "$DIR/sshd.pid"
}

load_image() {
    # The egress proxy's image too, where the main engine has it: setup's dependency step starts
    # the proxy, which would otherwise be made here from scratch (debootstrap, a minute or two).
    local image
    for image in "$IMAGE" "$PROXY_IMAGE"; do
        if rdocker image inspect "$image" >/dev/null 2>&1; then
            continue
        fi
        if [ "$image" = "$PROXY_IMAGE" ] &&
            ! DOCKER_HOST=$MAIN_SOCK docker image inspect "$image" >/dev/null 2>&1; then
            continue
        fi
        log "copying $image from the main engine"
        DOCKER_HOST=$MAIN_SOCK docker save "$image" | rdocker load >/dev/null
    done
}

kill_dockerd() { # signal
    if pid_alive "$DIR/dockerd.pid"; then
        local pid
        pid=$(cat "$DIR/dockerd.pid")
        kill "-$1" "$pid" 2>/dev/null || true
        wait_for 60 "dockerd $pid to exit" bash -c "! kill -0 $pid"
    fi
}

# Every process of this engine (dockerd, its containerd, shims, container processes, sshd and its
# sessions) runs inside the namespace: killing what `ip netns pids` lists ends them all.
kill_namespace_processes() {
    ip netns list | grep -qw "^$NETNS" || return 0
    local pids
    pids=$(ip netns pids "$NETNS" 2>/dev/null || true)
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    wait_for 30 "the namespace's processes to exit" bash -c "[ -z \"\$(ip netns pids $NETNS)\" ]"
}

do_start() {
    ensure_packages
    if [[ -f $OWNER && $(cat "$OWNER") != "$DIR" ]] && ip netns list | grep -qw "^$NETNS"; then
        log "a remote engine from $(cat "$OWNER") holds $NETNS: stop it first ($0 stop $(cat "$OWNER"))"
        exit 1
    fi
    do_stop
    echo "$DIR" >"$OWNER"
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    touch "$DIR/$MARKER"
    make_certs
    make_ssh
    write_env
    setup_netns
    start_dockerd
    start_sshd
    load_image
    log "ready: over TLS source $DIR/tls.env, over SSH source $DIR/ssh.env"
}

# Processes of this engine's containers: they run in network namespaces of their own (so `ip netns
# pids` misses them) but all under the cgroup parent /pcs-remote.
kill_container_processes() {
    local procs
    procs=$(cat /sys/fs/cgroup/pids/pcs-remote/*/cgroup.procs 2>/dev/null || true)
    # shellcheck disable=SC2086
    [[ -z $procs ]] || kill -9 $procs 2>/dev/null || true
}

do_stop() {
    if [[ -d $DIR && ! -f $DIR/$MARKER ]] && [[ -n $(ls -A "$DIR") ]]; then
        log "$DIR is not a remote engine's directory (no $MARKER): refusing to remove it"
        exit 1
    fi
    if [[ -S $SOCK ]] && pid_alive "$DIR/dockerd.pid"; then
        # Its containers first, while the engine can still remove them cleanly.
        local ids
        ids=$(rdocker ps -aq 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $ids ]] || rdocker rm -f -v $ids >/dev/null 2>&1 || true
        kill_dockerd TERM || true
    fi
    if [[ -f $OWNER && $(cat "$OWNER") != "$DIR" ]]; then
        log "the namespace $NETNS belongs to $(cat "$OWNER"): leaving it"
    else
        kill_namespace_processes
        kill_container_processes
        ip link del "$HOST_IF" 2>/dev/null || true
        ip netns del "$NETNS" 2>/dev/null || true
        rm -f "$OWNER"
    fi
    if [[ -f $DIR/sshd.pid ]] && pid_alive "$DIR/sshd.pid"; then kill "$(cat "$DIR/sshd.pid")" || true; fi
    # A dockerd that was killed leaves its mounts (overlays, the namespaces' bind mounts) under
    # DIR: unmount them, deepest first, before removing DIR.
    if [[ -d $DIR ]]; then
        awk -v d="$DIR/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
            xargs -r -n1 umount -l 2>/dev/null || true
        rm -rf "$DIR"
    fi
    # The containers' cgroups (cgroup v1: one directory per controller).
    local group
    for group in /sys/fs/cgroup/*/pcs-remote; do
        if [[ -d $group ]]; then find "$group" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    done
}

do_restart() {
    [[ -f $DIR/daemon.json ]] || { log "no remote engine in $DIR (start it first)"; exit 1; }
    # SIGKILL: the engine vanishes mid-call, as a remote machine's would (its containers die with
    # their shims only if the kernel takes them; the restarted engine finds and cleans them).
    kill_dockerd KILL
    # Its containerd dies with it (the parent-death signal dockerd gives it), but not at once: a
    # dockerd started meanwhile finds it "still running" and waits for a socket that never comes.
    # Kill it too, as the machine's crash would, and wait until it is gone.
    local pidfile=$DIR/exec/containerd/containerd.pid
    if pid_alive "$pidfile"; then
        local pid
        pid=$(cat "$pidfile")
        kill -KILL "$pid" 2>/dev/null || true
        wait_for 60 "containerd $pid to exit" bash -c "! kill -0 $pid"
    fi
    rm -f "$pidfile"
    start_dockerd
}

case $ACTION in
    start) do_start ;;
    stop) do_stop ;;
    restart) do_restart ;;
    *) usage ;;
esac
