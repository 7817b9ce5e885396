#!/usr/bin/env bash
# The fidelity suite's reference run (tests/mcp/test_fidelity.py): a virtual environment with real
# nbclient and ipykernel, the sandbox runner's IPython and the packages the suite's sessions get
# (tests/mcp/nbcompare.py), all pinned, in .cache/venv-fidelity; then every notebook of the corpus
# run with nbclient, its outputs written to tests/data/fidelity-reference.json.
#
#   bash scripts/fidelity-reference.sh                       # every notebook
#   bash scripts/fidelity-reference.sh nbval/tests/exceptions.ipynb   # only these, merged in
#
# Needs CPython 3.11 (the sandbox image's; PYTHON to name another interpreter) and PyPI (pip's own
# configuration: PIP_INDEX_URL, a CA bundle). Re-runnable: the environment is made again when its
# pins change; the JSON is written in a stable order.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.cache/venv-fidelity
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "the sandbox image has CPython 3.11; set PYTHON"'

pins=$("$PYTHON" scripts/fidelity_reference.py --requirements)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: -r <(printf '%s\n' "$pins")
  "$VENV/bin/python" -m pip check
  printf '%s' "$pins" >"$VENV/.pins"
fi

exec "$VENV/bin/python" scripts/fidelity_reference.py "$@"
