# Tests only: the fake backend (src/engine/testing) runs the runner as a plain host process and
# passes `--host-test-workspace=DIR` after the bootstrap (a sandbox's command never has it). DIR is
# then the workspace, and nothing kills "every other process", since kill(-1) there would reach the
# host's own processes.

import sys

WORKSPACE = next((a.partition("=")[2] for a in sys.argv[1:] if a.startswith("--host-test-workspace=")), None)
