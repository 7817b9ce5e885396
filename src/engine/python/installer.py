"""Installs a request's packages into the staging volume; runs in the installer sandbox.

The host passes its arguments as one JSON document in the environment (never spliced into this
source, never through a shell): the staging target and build directories, and the argv of each
installer (uv's when the image has uv, pip's otherwise), each requirement its own element.
"""
import json, os, shutil, subprocess, sys

ARGUMENTS = json.loads(os.environ.pop("PCS_INSTALLER_ARGUMENTS"))
target = ARGUMENTS["target"]
build = ARGUMENTS["build"]
os.makedirs(target)
os.makedirs(build)
argv = ARGUMENTS["uv"] if shutil.which("uv") else ARGUMENTS["pip"]
print("installer:", os.path.basename(argv[0]), flush=True)
env = dict(os.environ, TMPDIR=build, PIP_NO_INPUT="1", UV_LINK_MODE="copy")
code = subprocess.run(argv, env=env, cwd=build, stdin=subprocess.DEVNULL).returncode
if code != 0:
    raise SystemExit(code)
print("staged", flush=True)
