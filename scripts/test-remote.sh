#!/usr/bin/env bash
# CI stage (issue 19): everything the server promises, against a Docker engine on "another machine"
# (scripts/remote-engine.sh: its own dockerd in a network namespace of its own), reached over
# mutual TLS and over SSH. Prints how long each part takes; exits non-zero when a part fails.
#
#   bash scripts/test-remote.sh        # needs root, the server built (target/debug) and
#                                      # .cache/venv-mcp (scripts/test.sh makes both)
#
# PCS_REMOTE_ENGINE_DIR (default /tmp/pcs-remote-ci) is where the engine keeps its state; PCS_BIN
# the server binary. The engine is removed at the end, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The MCP tests' servers choose their runtime themselves: the second engine has no runsc, so runc
# is its fallback, which the tests check (tests/mcp/conftest.py sets runc otherwise).
export PCS_MCP_RUNTIME=default
DIR=${PCS_REMOTE_ENGINE_DIR:-/tmp/pcs-remote-ci}
BIN=${PCS_BIN:-$ROOT/target/debug/python-code-sandbox}
PY=$ROOT/.cache/venv-mcp/bin/python
for needed in "$BIN" "$PY"; do
    [[ -x $needed ]] || { echo "test-remote: $needed is missing (build first: scripts/test.sh)" >&2; exit 2; }
done
export PCS_BIN=$BIN PCS_REMOTE_ENGINE_DIR=$DIR PYTHONDONTWRITEBYTECODE=1
# bollard's ssh connection (the openssh crate) keeps each ssh ControlMaster's socket directory in
# $XDG_STATE_HOME, and a server that exits leaves its pooled connections' masters and directories
# behind: keep them under DIR, removed with the engine (whose sshd's end takes the masters along).
export XDG_STATE_HOME=$DIR/state

# The MCP tests of the original tool set, minus the one inherently about the local daemon:
# test_an_unreachable_engine_... proxies /var/run/docker.sock itself (the local socket), which says
# nothing about a remote engine (test_remote_engine.py covers a refused remote connection).
SERVER_TESTS=(tests/mcp/test_server.py -k "not unreachable_engine")
# Over SSH, the tests that use the engine (starts, streams, interrupts, stops, removal): the rest
# of test_server.py never reaches it, and ran over TLS.
SSH_SERVER_TESTS=(tests/mcp/test_server.py -k "ephemeral_hello or keeps_a_variable or timeout_is or endless_loop or cancelling or idle_session or sigterm or full_pool or fresh_sandboxes")
# Code, files and snapshots travel over the API: a subset that reads no host path of the engine's
# machine. Files come back as content and land in SANDBOX_FILES_DIR on the server's machine;
# snapshots are written and restored by the server. Tests that install dependencies are left out:
# the installer's container must reach PyPI, and nothing routes beyond this engine's namespace
# (the local-engine stage covers them).
TRANSFER_TESTS=(
    "tests/mcp/test_files.py::test_a_csv_is_a_text_resource_and_a_zip_a_blob"
    "tests/mcp/test_files.py::test_persistence_default_custom_and_off"
    "tests/mcp/test_files.py::test_write_then_run_then_read_back"
    "tests/mcp/test_snapshots.py::test_a_fork_and_its_original_diverge_without_touching_each_other"
    "tests/mcp/test_snapshots.py::test_a_new_server_lists_and_restores_a_snapshot_of_an_exited_one"
)
# The suite selects cases by a substring of their description (not the function's name).
RESTART_CASE="the Docker daemon restarted during a session"

failed=()
timings=()
part() { # name command...
    local name=$1 started=$SECONDS status=0
    shift
    echo "=== test-remote: $name" >&2
    "$@" || status=$?
    timings+=("$(printf '%-34s %4ss  %s' "$name" $((SECONDS - started)) "$([[ $status == 0 ]] && echo ok || echo FAILED)")")
    [[ $status == 0 ]] || failed+=("$name")
}

# pytest's temporary directories, under a short path: a test that sets XDG_STATE_HOME to one moves
# the ssh ControlMaster sockets there too, and a socket path over 108 bytes fails every ssh
# connection ("unix_listener: path ... too long for Unix domain socket").
BASETEMP=$(mktemp -d /tmp/pcsr.XXXXXX)

pytest_over() { # transport tests...
    local transport=$1
    shift
    # shellcheck disable=SC1090
    (source "$DIR/$transport.env" && "$PY" -m pytest -q -p no:cacheprovider --basetemp "$BASETEMP/$transport" "$@")
}

# The fault case: the remote dockerd SIGKILLed mid-call (the connection drops) and started again.
restart_over_tls() {
    local log
    log=$(mktemp)
    # shellcheck disable=SC1091
    (source "$DIR/tls.env" &&
        PCS_DOCKERD_RESTART="bash $ROOT/scripts/remote-engine.sh restart $DIR" \
            "$PY" tests/adversarial/suite.py --bin "$BIN" --only "$RESTART_CASE") | tee "$log"
    local status=${PIPESTATUS[0]}
    # A selection that matched nothing would pass with "0 passed": the case must have run and passed.
    grep -q "^PASS  $RESTART_CASE" "$log" || status=1
    rm -f "$log"
    return "$status"
}

# `setup` on the second engine through its unix socket (a local engine to setup): without runsc
# it says the code runs under runc and gives the exact command for gVisor; `setup --gvisor` then
# registers runsc and runsc-net in that dockerd's own daemon.json (keeping its other keys, with
# one backup), reloads it, probes runsc-net (gVisor's own network stack, or host-network mode
# where runsc refuses it, as on these machines), and the doctor and the hello world run under
# gVisor. The engine's empty
# daemon.json is put back and reloaded afterwards (the other parts expect runc there).
setup_gvisor() {
    local sock=unix://$DIR/docker.sock out status=0
    local before
    before=$(cat "$DIR/daemon.json")
    printf '{"log-level": "info"}\n' >"$DIR/daemon.json"
    kill -HUP "$(cat "$DIR/dockerd.pid")"
    out=$(cd / && DOCKER_HOST=$sock "$BIN" setup 2>&1) || status=$?
    printf '%s\n' "$out"
    [[ $status == 0 ]] || { echo "FAIL: setup exited $status" >&2; return 1; }
    grep -q "^   the agent's code runs under runc: gVisor (runsc) is not registered" <<<"$out" &&
        grep -q "for its stronger isolation: run \`sudo python-code-sandbox setup --gvisor\`" <<<"$out" ||
        { echo "FAIL: setup did not say runc and how to get gVisor" >&2; return 1; }
    out=$(cd / && DOCKER_HOST=$sock "$BIN" setup --gvisor 2>&1) || status=$?
    printf '%s\n' "$out"
    [[ $status == 0 ]] || { echo "FAIL: setup --gvisor exited $status" >&2; status=1; }
    local expected
    for expected in "ok: gVisor (runsc) registered" \
        "dockerd (pid $(cat "$DIR/dockerd.pid")) reads $DIR/daemon.json" \
        "the agent's code runs under runsc (gVisor)" \
        "ok   runtime: the agent's code runs under runsc (gVisor)" \
        "runsc-net starts networked sandboxes with" \
        "Hello from the sandbox"; do
        grep -qF "$expected" <<<"$out" || { echo "FAIL: setup --gvisor did not say: $expected" >&2; status=1; }
    done
    python3 - "$DIR/daemon.json" <<'PY' || status=1
import glob, json, sys
config = json.load(open(sys.argv[1]))
assert config["log-level"] == "info", config
assert config["runtimes"]["runsc"]["runtimeArgs"] == ["--network=none"], config
assert config["runtimes"]["runsc-net"]["runtimeArgs"] in ([], ["--network=host"]), config
backups = glob.glob(sys.argv[1] + ".backup-*")
assert len(backups) == 1 and json.load(open(backups[0])) == {"log-level": "info"}, backups
PY
    # A networked entry with gVisor's own stack on this host (where runsc refuses it) is refused
    # at start with the fix, never run under a weaker runtime.
    python3 - "$DIR/daemon.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["runtimes"]["runsc-net"]["runtimeArgs"] = []
json.dump(config, open(sys.argv[1], "w"))
PY
    kill -HUP "$(cat "$DIR/dockerd.pid")"
    sleep 2
    local refused=0
    out=$(cd / && DOCKER_HOST=$sock SANDBOX_NETWORK=bridge "$BIN" run "$ROOT/examples/hello.py" 2>&1) || refused=$?
    printf '%s\n' "$out"
    if [[ $refused == 0 ]] || ! grep -qF "runsc refuses on this host" <<<"$out" ||
        ! grep -qF "register it in host-network mode" <<<"$out"; then
        echo "FAIL: a networked sandbox under gVisor's own refused stack was not refused with the fix" >&2
        status=1
    fi
    rm -f "$DIR"/daemon.json.backup-*
    printf '%s\n' "$before" >"$DIR/daemon.json"
    kill -HUP "$(cat "$DIR/dockerd.pid")"
    return "$status"
}

cleanup() {
    bash "$ROOT/scripts/remote-engine.sh" stop "$DIR" || true
    rm -rf "$BASETEMP"
}
trap cleanup EXIT

total_started=$SECONDS
part "start the remote engine" bash scripts/remote-engine.sh start "$DIR"
if [[ ${#failed[@]} == 0 ]]; then
    part "tls: server tests" pytest_over tls "${SERVER_TESTS[@]}"
    part "tls: transfer tests" pytest_over tls "${TRANSFER_TESTS[@]}"
    part "ssh: server tests that use the engine" pytest_over ssh "${SSH_SERVER_TESTS[@]}"
    part "ssh: transfer tests" pytest_over ssh "${TRANSFER_TESTS[@]}"
    # Each of these sets its own engine variables (TLS, SSH, the wrong CA): one run covers both.
    part "remote engine tests" pytest_over tls tests/mcp/test_remote_engine.py
    part "tls: engine restart mid-call" restart_over_tls
    part "setup --gvisor on the second engine" setup_gvisor
fi
cleanup
trap - EXIT

echo "test-remote: times" >&2
printf '  %s\n' "${timings[@]}" >&2
echo "test-remote: $((SECONDS - total_started))s in all" >&2
if (( ${#failed[@]} )); then
    echo "test-remote: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test-remote: all passed" >&2
