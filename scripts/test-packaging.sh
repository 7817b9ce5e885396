#!/usr/bin/env bash
# The packages as users install them. Run from anywhere after `cargo build` and the sandbox image
# exist (scripts/test.sh's "build" and "sandbox image" stages); it installs what it needs itself:
#   1. the PyPI wheel (pyproject.toml: maturin, `bindings = "bin"`), built with the profile
#      PCS_WHEEL_PROFILE (dev, the default, or release) so that it reuses target/: after
#      scripts/server-image.sh (`cargo build --release`), release costs only a link and tests the
#      profile that ships; it must carry both executables and the crate's name and version,
#   2. a fresh virtualenv with the wheel pip-installed (nothing else, from no index),
#   3. tests/packaging (the official MCP Python SDK) against the installed
#      `python-code-sandbox-mcp`, started with no arguments from a directory of its own, as a
#      client config starts it,
#   4. the same tests against `uvx --from WHEEL python-code-sandbox-mcp` (uv from PyPI via pip;
#      offline: the wheel has no dependencies),
#   5. an MCP Inspector CLI smoke call through the installed `python-code-sandbox-mcp`,
#   6. the crate: `cargo package --list` holds every file the binary embeds (the include_str!
#      paths of src/, and every non-Rust file under src/), and `cargo publish --dry-run --locked
#      --no-verify` passes (the package and its manifest; the build of what the package holds is
#      the list's check: CI's time is short),
#   7. `cargo install --path . --locked` (--debug unless PCS_WHEEL_PROFILE=release: the wheel's
#      build is reused) into a temporary root, and the installed binaries run from `/`:
#      --version, `run` of a hello file, `doctor`.
# Temporary directories are removed at the end. Each step's time is printed.
# On a shared development machine:
#   PCS_CARGO_LOCK=/tmp/pcs-cargo.lock PCS_ENGINE_LOCK=/tmp/pcs-engine.lock bash scripts/test-packaging.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

STAGE_LABEL="packaging: "
source scripts/stages.sh
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

work=$(mktemp -d /tmp/pcs-packaging.XXXXXX)
cleanup() {
  rm -rf "$work"
}
trap cleanup EXIT

# Tests that need the engine fail rather than skip; the dependency cache (unused by these tests)
# is the tests' own volume, as in scripts/test.sh.
export PCS_REQUIRE_ENGINE=1
export SANDBOX_DEPS_VOLUME=${SANDBOX_DEPS_VOLUME:-pcs-test-deps}
# Locks shared with other users of target/ and of the engine on a development machine (as
# scripts/test-podman.sh's PCS_ENGINE_LOCK): PCS_CARGO_LOCK for every cargo run, PCS_ENGINE_LOCK
# for what starts sandboxes (the tests check that nothing is left behind). Unset, as in CI, which
# runs alone: no lock.
cargo_locked() { if [ -n "${PCS_CARGO_LOCK:-}" ]; then flock "$PCS_CARGO_LOCK" "$@"; else "$@"; fi; }
engine_locked() { if [ -n "${PCS_ENGINE_LOCK:-}" ]; then flock "$PCS_ENGINE_LOCK" "$@"; else "$@"; fi; }

profile=${PCS_WHEEL_PROFILE:-dev}
case $profile in
  dev) maturin_profile=(--profile dev) install_profile=(--debug) ;;
  release) maturin_profile=(--release) install_profile=() ;;
  *) fail "PCS_WHEEL_PROFILE must be dev or release, not '$profile'" ;;
esac

version=$(cargo_locked cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "python-code-sandbox-mcp"))')

stage "tools (maturin and uv in .cache/venv-packaging, the MCP SDK in .cache/venv-mcp)"
pkgvenv=.cache/venv-packaging
if [ ! -x "$pkgvenv/bin/python" ]; then
  python3 -m venv "$pkgvenv"
fi
"$pkgvenv/bin/pip" install --quiet --disable-pip-version-check -r tests/packaging/requirements.txt
mcpvenv=.cache/venv-mcp
if [ ! -x "$mcpvenv/bin/python" ]; then
  python3 -m venv "$mcpvenv"
fi
"$mcpvenv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
inspector=.cache/inspector
if [ ! -x "$inspector/node_modules/.bin/mcp-inspector" ]; then
  mkdir -p "$inspector"
  npm install --silent --no-audit --no-fund --prefix "$inspector" @modelcontextprotocol/inspector@2.12.0 >&2
fi

stage "1. wheel (maturin build, $profile profile)"
cargo_locked "$pkgvenv/bin/maturin" build "${maturin_profile[@]}" --locked --out "$work/wheels" >&2
wheels=("$work/wheels"/python_code_sandbox_mcp-"$version"-*.whl)
[ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel of version $version in $work/wheels"
wheel=${wheels[0]}
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))" >&2
python3 - "$wheel" "$version" <<'EOF'
import sys, zipfile
wheel, version = sys.argv[1], sys.argv[2]
names = zipfile.ZipFile(wheel).namelist()
data = f"python_code_sandbox_mcp-{version}.data/scripts/"
for exe in ("python-code-sandbox", "python-code-sandbox-mcp"):
    if data + exe not in names:
        sys.exit(f"FAIL: the wheel does not carry {exe} ({data}{exe}); it has: {names}")
meta = zipfile.ZipFile(wheel).read(f"python_code_sandbox_mcp-{version}.dist-info/METADATA").decode()
for line in ("Name: python-code-sandbox-mcp", f"Version: {version}", "License-Expression: MIT"):
    if line not in meta.splitlines():
        sys.exit(f"FAIL: the wheel's METADATA lacks {line!r}")
print("wheel carries python-code-sandbox and python-code-sandbox-mcp", file=sys.stderr)
EOF

stage "2. fresh virtualenv, pip install WHEEL"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index "$wheel"
installed="$work/venv/bin/python-code-sandbox-mcp"
for exe in python-code-sandbox python-code-sandbox-mcp; do
  [ -x "$work/venv/bin/$exe" ] || fail "pip install of the wheel gave no $work/venv/bin/$exe"
  got=$(cd / && "$work/venv/bin/$exe" --version)
  [ "$got" = "python-code-sandbox $version" ] || [ "$got" = "python-code-sandbox-mcp $version" ] ||
    fail "$exe --version said '$got', expected version $version"
done
echo "installed: $installed ($(cd / && "$installed" --version))" >&2

stage "3. tests/packaging against the installed python-code-sandbox-mcp (official MCP Python SDK)"
PCS_PACKAGED_COMMAND="$installed" PCS_PACKAGED_VERSION="$version" PYTHONDONTWRITEBYTECODE=1 \
  engine_locked "$mcpvenv/bin/python" -m pytest -q -p no:cacheprovider tests/packaging

stage "4. tests/packaging against uvx --from WHEEL python-code-sandbox-mcp"
# uv's own state in the temporary directory; no interpreter downloads, no index (offline).
export UV_CACHE_DIR="$work/uv-cache" UV_TOOL_DIR="$work/uv-tools" UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1
uvx_command="$root/$pkgvenv/bin/uvx --offline --from $wheel python-code-sandbox-mcp"
# Resolved once outside the client's timeout (uv unpacks the wheel into its cache).
(cd / && $uvx_command --version) >&2
PCS_PACKAGED_COMMAND="$uvx_command" PCS_PACKAGED_VERSION="$version" PYTHONDONTWRITEBYTECODE=1 \
  engine_locked "$mcpvenv/bin/python" -m pytest -q -p no:cacheprovider tests/packaging
# Run through uvx, `setup` writes the client config that names the package, not uv's cache path.
(cd / && $uvx_command setup --config-only --client claude-desktop) >"$work/setup-uvx.txt"
python3 - "$work/setup-uvx.txt" <<'EOF' || fail "setup run through uvx did not print the uvx client config"
import json, sys
text = open(sys.argv[1]).read()
entry = json.loads(text[text.index("{"):text.rindex("}") + 1])["mcpServers"]["python-sandbox"]
assert entry["command"] == "uvx" and entry["args"] == ["python-code-sandbox-mcp"], entry
print("setup through uvx prints:", json.dumps(entry), file=sys.stderr)
EOF

stage "5. MCP Inspector CLI smoke call through the installed python-code-sandbox-mcp"
smoke=$(engine_locked "$inspector/node_modules/.bin/mcp-inspector" --cli -e LOG_LEVEL=warn \
  -e SANDBOX_DEPS_VOLUME="$SANDBOX_DEPS_VOLUME" "$installed" \
  --method tools/call --tool-name run_python_ephemeral --tool-arg 'code=print(6 * 7)' 2>/dev/null) || true
if ! printf '%s' "$smoke" | grep -q '"stdout": "42\\n"'; then
  printf '%s\n' "$smoke" >&2
  fail "the MCP Inspector CLI did not get 42 back from $installed"
fi
echo "inspector: ok" >&2

stage "6. cargo package --list (everything the binary embeds) and cargo publish --dry-run --locked --no-verify"
# --allow-dirty: a checkout with uncommitted work packages as it is (CI's tree is clean anyway).
cargo_locked cargo package --list --locked --allow-dirty >"$work/package-list"
# The files of src/ as git sees them (tracked, or new and not ignored: no __pycache__).
git ls-files --cached --others --exclude-standard -- src >"$work/src-files"
python3 - "$work/package-list" "$work/src-files" <<'EOF'
import os, re, sys
listed = set(open(sys.argv[1]).read().split())
needed = set()
# Every non-Rust file under src/ (the runner, the installer scripts, the Dockerfile, ...).
for path in open(sys.argv[2]).read().split():
    if not path.endswith(".rs") and os.path.isfile(path):
        needed.add(path)
# Every include_str!/include_bytes! of src/: a literal path, or a macro's concat! of a literal
# prefix and suffix around a name (runner_module!("x") -> python/runner/x.py).
literal = re.compile(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)')
concat = re.compile(r'include_(?:str|bytes)!\(\s*concat!\(\s*"([^"]*)"\s*,\s*\$(\w+)\s*,\s*"([^"]*)"\s*\)\s*\)')
for base, _, files in os.walk("src"):
    for name in files:
        if not name.endswith(".rs"):
            continue
        path = os.path.join(base, name)
        text = open(path, encoding="utf-8").read()
        for rel in literal.findall(text):
            needed.add(os.path.normpath(os.path.join(base, rel)))
        for prefix, _var, suffix in concat.findall(text):
            # The macro's uses in the same file: name!("x").
            for macro in re.findall(r'macro_rules!\s*(\w+)', text):
                for arg in re.findall(macro + r'!\(\s*"([^"]+)"\s*\)', text):
                    needed.add(os.path.normpath(os.path.join(base, prefix + arg + suffix)))
missing = sorted(p for p in needed if p not in listed)
if missing:
    sys.exit("FAIL: cargo package leaves out files the binary embeds: " + ", ".join(missing))
for path in ("LICENSE", "README.md", "Cargo.lock"):
    if path not in listed:
        sys.exit(f"FAIL: cargo package leaves out {path}")
print(f"cargo package: {len(listed)} files, all {len(needed)} embedded/needed files of src/ included", file=sys.stderr)
EOF
# The package and its manifest as crates.io would take them; not built again (about two minutes
# of CI's time): the list above holds every file the build reads.
cargo_locked cargo publish --dry-run --locked --allow-dirty --no-verify >&2

stage "7. cargo install --path . --locked ${install_profile[*]}, run from /"
# CARGO_TARGET_DIR: reuse target/ (the wheel's build) instead of cargo install's own temporary one.
CARGO_TARGET_DIR="$root/target" cargo_locked cargo install --path . --locked "${install_profile[@]}" --root "$work/cargo-root" >&2
bin="$work/cargo-root/bin"
for exe in python-code-sandbox python-code-sandbox-mcp; do
  [ -x "$bin/$exe" ] || fail "cargo install gave no $bin/$exe"
done
cp examples/hello.py "$work/hello.py"
(
  cd /
  "$bin/python-code-sandbox" --version
  "$bin/python-code-sandbox-mcp" --version
) >&2
out=$(cd / && engine_locked "$bin/python-code-sandbox" run "$work/hello.py")
printf '%s\n' "$out" >&2
printf '%s' "$out" | grep -q '^Hello from the sandbox!$' || fail "cargo-installed run of hello.py did not print its greeting"
(cd / && engine_locked "$bin/python-code-sandbox" doctor) >&2 || fail "cargo-installed doctor failed"

stage_times "packaging: stage times"
echo "total: $SECONDS s" >&2
