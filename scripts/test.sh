#!/usr/bin/env bash
# Runs every test on this machine, preparing what they need first:
#   1. a Docker engine (scripts/dev-env.sh installs and starts one when none answers),
#   2. the sandbox image (built by the project's own binary; offline when no registry answers),
#   3. cargo fmt/clippy checks and `cargo test` (unit tests and tests against the real engine),
#   4. a final check that no sandbox container or volume was left behind.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/dev-env.sh

echo "== build" >&2
cargo build --locked --all-targets

echo "== sandbox image" >&2
./target/debug/python-code-sandbox image build

echo "== format and lints" >&2
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings

echo "== tests" >&2
cargo test --locked -- --test-threads=2

echo "== leftovers" >&2
# Tests assert this per engine instance; this catches anything a test process did not clean up.
left_containers=$(docker ps -aq --filter label=io.python-code-sandbox.managed=true | wc -l)
left_volumes=$(docker volume ls -q --filter label=io.python-code-sandbox.managed=true | wc -l)
if [ "$left_containers" != 0 ] || [ "$left_volumes" != 0 ]; then
  echo "FAIL: $left_containers sandbox container(s) and $left_volumes volume(s) left behind" >&2
  docker ps -a --filter label=io.python-code-sandbox.managed=true >&2
  exit 1
fi
echo "no sandbox left behind" >&2
