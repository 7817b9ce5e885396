#!/usr/bin/env bash
# Makes the runner's IPython for the engine-free tests: the fake backend runs the runner as a host
# process and passes it `PCS_TEST_IPYTHON` as `PCS_IPYTHON` (in a container the server installs
# the same lock into its dependency cache). Host pip installs the lock, src/engine/python/ipython-
# set.txt, exactly as pinned and hashed into .cache/ipython-set, again only when the lock changed
# (its sha256 is kept beside it). Prints the directory; `export PCS_TEST_IPYTHON=$(bash $0)`.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=src/engine/python/ipython-set.txt
dir=.cache/ipython-set
sum=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$dir.sha256" 2>/dev/null || true)" != "$sum" ] || [ ! -d "$dir" ]; then
  rm -rf "$dir" "$dir.sha256"
  mkdir -p .cache
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "ipython-set: host pip is missing (scripts/dev-env.sh installs python3-pip)" >&2
    exit 1
  fi
  echo "ipython-set: installing the runner's IPython into $dir" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-input --require-hashes \
    --no-deps --only-binary :all: --target "$dir.tmp" -r "$lock" >&2
  mv "$dir.tmp" "$dir"
  echo "$sum" >"$dir.sha256"
fi
echo "$PWD/$dir"
