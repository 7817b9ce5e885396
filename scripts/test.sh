#!/usr/bin/env bash
# Runs every test on this machine, preparing what they need first:
#   1. a Docker engine (scripts/dev-env.sh installs and starts one when none answers), with gVisor
#      registered as the runtime `runsc` (scripts/runsc.sh),
#   2. the sandbox image (built by the project's own binary; offline when no registry answers),
#      and the server image (scripts/server-image.sh --offline: the release binary on the local
#      debootstrap base); then the README's quick-start lines as written (scripts/test-readme.py),

#   3. cargo fmt/clippy checks and `cargo test` (unit tests and tests against the real engine; the
#      engine-free ones' host runner gets the runner's IPython from scripts/ipython-set.sh), in two
#      lanes side by side after the one test that rebuilds the default image, the egress's tests
#      again under runc,
#   4. the MCP integration suite: the server binary driven by the official MCP Python SDK (pytest)
#      over stdio and streamable HTTP, and the server image driven the same way through `docker run`
#      (its servers under runc, but for the original tool set's tests, the load tests' gVisor half
#      and the server image, which run under the default, gVisor: tests/mcp/conftest.py says why),
#   5. a smoke call through the MCP Inspector CLI, a second real client, and MCP conformance
#      (scripts/conformance.sh: the official server conformance suite over HTTP, without
#      authentication against tests/conformance/expected-failures.yml and with principals against
#      tests/conformance/expected-failures-principals.yml, and mcp-conform over stdio and HTTP),
#   5b. the packages as users install them (scripts/test-packaging.sh): the PyPI wheel (maturin)
#      installed with pip and run through uvx, driven by the MCP SDK and the Inspector; the crate
#      through cargo package, publish --dry-run and cargo install, run from `/`,
#   6. beside the MCP suite from its start, each the only user of its engine, the engines beside
#      the local Docker: rootful Podman (scripts/test-podman.sh: engine tests, the original
#      tool set's MCP tests and the attack list; the refusal under rootless Podman), and a second
#      Docker engine in a network namespace reached over mutual TLS and over SSH
#      (scripts/test-remote.sh),
#   7. once they are done, the adversarial and fault suite (tests/adversarial/suite.py): first
#      alone the case that restarts dockerd, then attacks and faults under the default runtime
#      (gVisor, registered by scripts/runsc.sh) and beside them the attacks again under runc, and
#      again with SANDBOX_NETWORK=allowlist (gVisor through its networked entry, runsc-net, in
#      host-network mode here),
#   8. a final check that no sandbox container or volume was left behind.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's wall-clock time, printed as a table at the end (and so in CI's log).
source scripts/stages.sh

stage "engine and host tools (scripts/dev-env.sh)"
bash scripts/dev-env.sh
bash scripts/haproxy.sh  # HAProxy for tests/mcp/test_replicas.py (never started as a service)

# PyPI is reachable from containers here only through the host's CA bundle (an intercepting
# proxy); the tests configure it, the code never assumes it. The dependency cache of the tests is
# a volume of their own, removed at the end.
if [ -z "${SANDBOX_CA_BUNDLE:-}" ] && [ -s /etc/ssl/certs/ca-certificates.crt ]; then
  export SANDBOX_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
fi
export SANDBOX_DEPS_VOLUME=pcs-test-deps
# The installer's egress proxy refuses index hosts that resolve to non-public addresses; behind
# this machine's intercepting proxy PyPI's names do, so the tests allow them explicitly.
if [ -z "${SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE:-}" ] && python3 -c '
import ipaddress, socket, sys
a = {i[4][0] for h in ("pypi.org", "files.pythonhosted.org") for i in socket.getaddrinfo(h, 443)}
sys.exit(0 if any(not ipaddress.ip_address(x).is_global for x in a) else 1)' 2>/dev/null; then
  export SANDBOX_DEPS_EGRESS_ALLOW_PRIVATE=pypi.org,files.pythonhosted.org
fi
# Downloads are cached in a host directory (uid 1000 writes it), so the engine keeps no volume.
export PIP_CACHE_PATH="$PWD/.cache/download-cache"
mkdir -p "$PIP_CACHE_PATH"
chown 1000:1000 "$PIP_CACHE_PATH" 2>/dev/null || chmod 0777 "$PIP_CACHE_PATH"
# The runner's IPython for the engine-free tests' host runner (scripts/ipython-set.sh: host pip,
# from the lock, again only when it changed).
PCS_TEST_IPYTHON=$(bash scripts/ipython-set.sh)
export PCS_TEST_IPYTHON
release_build=""
podman_job=""
remote_job=""
suite_job=""
lane_job=""
on_exit() {
  # A stage that failed while the release build or another engine's tests ran in the
  # background: they go too (the remote engine's script stops its engine as it exits).
  for job in "$release_build" "$podman_job" "$remote_job" "$suite_job" "$lane_job"; do
    [ -z "$job" ] || { pkill -P "$job" 2>/dev/null; kill "$job" 2>/dev/null; } || true
  done
  docker volume ls -q | grep -E '^pcs-test-deps' | xargs -r docker volume rm >/dev/null 2>&1 || true
}
trap on_exit EXIT

# The parts of the current stage that failed, each named as it fails: a stage whose parts run
# side by side lets every part finish and show its log before the run ends.
failed=()
failed_part() { failed+=("$1"); }
# Waits for a job started beside the stage's own work (JOB, a pid), then prints its log (LOG)
# whole under TITLE (beside the stage, its lines would have mixed with the stage's); a failure is
# noted as WHAT.
join_job() {
  wait "$1" || failed_part "$4"
  echo "== $3: its log" >&2
  cat "$2" >&2
}
# Ends the run when a part of the stage failed, naming each.
end_if_failed() {
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAIL: %s\n' "${failed[@]}" >&2
    exit 1
  fi
}

# gVisor, for the tests that run sandboxes under another runtime.
stage "gVisor (scripts/runsc.sh)"
bash scripts/runsc.sh
export PCS_TEST_RUNTIME=runsc
# Tests that need the engine fail, rather than skip, when it does not answer.
export PCS_REQUIRE_ENGINE=1

stage "build"
# Once per profile: this debug build (default features, what the tests and the MCP suites run) is
# what `cargo test` reuses; clippy checks every target and feature (the benchmark's too) apart.
cargo build --locked --all-targets

# The release build (the server image, the README's `cargo run --release`, the wheel) runs beside
# the stages that wait on the engine more than on the CPU; the server image stage waits for it.
release_log=.cache/release-build.log
mkdir -p .cache
nice -n 10 cargo build --release --locked --bin python-code-sandbox >"$release_log" 2>&1 &
release_build=$!

stage "sandbox image"
./target/debug/python-code-sandbox image build

stage "format and lints"
cargo fmt --all -- --check
cargo clippy --locked --all-targets --all-features -- -D warnings
# Each module depends only downward: no circle between modules (nor between engine parts).
python3 scripts/module-graph.py
# Every relative link of README.md and docs/ leads to a file and a heading that exist.
python3 scripts/check-doc-links.py

stage "tests (two lanes: the image builds and installs beside the rest)"
# First, alone: the one test that takes the default image away and builds it again (every other
# test binary starts sandboxes from it).
alone_test=with_an_engine_but_no_image_setup_builds_it_and_writes_the_client_config
cargo test --locked --test setup -- --exact "$alone_test"
# Then two lanes side by side, each test binary with its engine instance of its own (tests check
# what their instance left, never the whole engine); both wait on the engine or the index much of
# the time. The first lane holds the binaries that build images or install sets (the flavour and
# image-build tests check for first-stage images of any build; deps and engine_ipython build the
# same plain image), the second every other target, found from tests/*.rs.
lane_a=(setup flavour image_build deps engine_ipython)
lane_b=()
for file in tests/*.rs; do
  name=$(basename "$file" .rs)
  case " ${lane_a[*]} " in
    *" $name "*) ;;
    *) lane_b+=(--test "$name") ;;
  esac
done
lane_log=.cache/side-by-side/cargo-test-lane-a.log
mkdir -p .cache/side-by-side
cargo test --locked $(printf -- '--test %s ' "${lane_a[@]}") -- --test-threads=2 --skip "$alone_test" >"$lane_log" 2>&1 &
lane_job=$!
cargo test --locked --lib --bins "${lane_b[@]}" -- --test-threads=2 || failed_part "cargo test: the second lane"
cargo test --locked --doc || failed_part "cargo test: the doc tests"
# The egress's tests again under runc (they run under gVisor's networked entry above): secrets
# brokered and isolation held under both runtimes.
PCS_ENGINE_RUNTIME=runc cargo test --locked --test egress -- --test-threads=2 || failed_part "cargo test: the egress tests under runc"
join_job "$lane_job" "$lane_log" "cargo test, the first lane (${lane_a[*]})" "cargo test: the first lane (${lane_a[*]})"
lane_job=""
end_if_failed

stage "server image (after the release build started with the build stage)"
if ! wait "$release_build"; then
  echo "FAIL: cargo build --release failed:" >&2
  tail -n 40 "$release_log" >&2
  exit 1
fi
release_build=""
bash scripts/server-image.sh --offline

stage "README quick start, as a newcomer types it (scripts/test-readme.py --clean-env)"
# The README's own lines, read from it: dev-env.sh (engine and gVisor, both already there),
# `cargo run --release` (the release build above is reused) running the example, then setup.
# As on a newcomer's machine: no sandbox or proxy image (the first run builds them, through this
# network's TLS interception with the host's CA bundle), and each line in a login shell started
# from an empty environment (none of the SANDBOX_* settings exported above).
for image in python-code-sandbox:py3.11 python-code-sandbox-proxy:bookworm; do
  if docker image inspect "$image" >/dev/null 2>&1; then
    docker image rm -f "$image" >/dev/null
  fi
done
python3 scripts/test-readme.py --clean-env quickstart

stage "MCP integration tests (official Python SDK); beside them, Podman (scripts/test-podman.sh) and a remote engine over TLS and SSH (scripts/test-remote.sh)"
venv=.cache/venv-mcp
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
# Two engines of their own run their tests beside this engine's suites (which mostly wait on the
# engine): rootful Podman (engine tests, the original tool set's MCP tests, the attack list; the
# refusal under rootless Podman) and a second Docker engine in a network namespace reached over
# mutual TLS and over SSH. Each looks only at its own engine; both end before the fault suite
# restarts this engine's dockerd. Their logs follow the conformance stage, each whole once it is done.
side=.cache/side-by-side
rm -rf "$side" && mkdir -p "$side"
bash scripts/test-podman.sh >"$side/podman.log" 2>&1 &
podman_job=$!
bash scripts/test-remote.sh >"$side/remote.log" 2>&1 &
remote_job=$!
PCS_BIN="$PWD/target/debug/python-code-sandbox" "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=20 tests/mcp

stage "MCP Inspector CLI smoke test"
inspector=.cache/inspector
if [ ! -x "$inspector/node_modules/.bin/mcp-inspector" ]; then
  mkdir -p "$inspector"
  npm install --silent --no-audit --no-fund --prefix "$inspector" @modelcontextprotocol/inspector@2.12.0 >&2
fi
smoke=$("$inspector/node_modules/.bin/mcp-inspector" --cli -e LOG_LEVEL=warn -e SANDBOX_DEPS_VOLUME="$SANDBOX_DEPS_VOLUME" \
  "$PWD/target/debug/python-code-sandbox" \
  --method tools/call --tool-name run_python_ephemeral --tool-arg 'code=print(6 * 7)' 2>/dev/null)
if ! printf '%s' "$smoke" | grep -q '"stdout": "42\\n"'; then
  echo "FAIL: the MCP Inspector CLI did not get 42 back:" >&2
  printf '%s\n' "$smoke" >&2
  exit 1
fi
echo "inspector: ok" >&2

stage "packages: the PyPI wheel through pip and uvx, the crate through cargo package, publish --dry-run and install (scripts/test-packaging.sh)"
# Release: the wheel reuses the server image's release build (only links) and is what would ship.
PCS_WHEEL_PROFILE=release bash scripts/test-packaging.sh

stage "MCP conformance (the official suite, mcp-conform)"
bash scripts/conformance.sh "$PWD/target/debug/python-code-sandbox"

stage "Podman and the remote engine, started beside the MCP suite: the rest of their run"
join_job "$podman_job" "$side/podman.log" "podman, beside the MCP suite" "Podman (scripts/test-podman.sh)"
podman_job=""
join_job "$remote_job" "$side/remote.log" "remote, beside the MCP suite" "the remote engine (scripts/test-remote.sh)"
remote_job=""
end_if_failed

suite=(tests/adversarial/suite.py --bin "$PWD/target/debug/python-code-sandbox")
stage "adversarial: dockerd restarted during a session (the engine alone)"
# The one case that restarts dockerd: after the MCP suites and the other engines, with no other
# user of this engine.
"$venv/bin/python" "${suite[@]}" --engine-restart-only

stage "adversarial and fault suite (the default runtime, gVisor); beside it, the attack list under runc, then with the allowlist (gVisor, runsc-net)"
# Every other case looks only at its own servers' sandboxes, so the passes share the engine (each
# waits on it about half the time). Beside the default pass: the attack list under runc, then
# again with the code's sandboxes on the egress network under gVisor's networked entry
# (runsc-net); the faults, and the server's own defences (the same under any runtime and
# network), run in the default pass only.
side_suite="$side/adversarial.log"
( "$venv/bin/python" "${suite[@]}" --no-default --runtime runc --no-faults \
  && "$venv/bin/python" "${suite[@]}" --network allowlist --no-faults --no-server-only ) >"$side_suite" 2>&1 &
suite_job=$!
"$venv/bin/python" "${suite[@]}" --no-engine-restart || failed_part "the adversarial suite: the default pass"
join_job "$suite_job" "$side_suite" "the attack list under runc, then with the allowlist" "the adversarial suite: the runc or allowlist pass"
suite_job=""
end_if_failed

stage "leftovers"
# Tests assert this per engine instance; this catches anything a test process did not clean up.
left_containers=$(docker ps -aq --filter label=io.python-code-sandbox.managed=true | wc -l)
left_volumes=$(docker volume ls -q --filter label=io.python-code-sandbox.managed=true | wc -l)
if [ "$left_containers" != 0 ] || [ "$left_volumes" != 0 ]; then
  echo "FAIL: $left_containers sandbox container(s) and $left_volumes volume(s) left behind" >&2
  docker ps -a --filter label=io.python-code-sandbox.managed=true >&2
  exit 1
fi
echo "no sandbox left behind" >&2
stage_times "stage times"
echo "total: $SECONDS s" >&2
