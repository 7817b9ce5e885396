"""Installs a request's packages into the staging volume; runs in the installer sandbox.

The host passes its arguments as one JSON document in the environment (never spliced into this
source, never through a shell): the staging target and build directories, and the argv of each
installer (uv's when the image has uv, pip's otherwise), each requirement its own element; or,
for a lock file (the runner's own pinned, hashed set), the file's text and where to write it in the
build directory, which both argvs read with `-r`.

After a failure it adds what the host needs to tell why, after a line `pcs-installer-diagnosis`:
when uv failed, pip's answer to the same request in a dry run (pip names the versions that exist);
then the lines of pip's verbose log that say what each index answered and why links were skipped.
The host classifies all of it (see `engine::deps::failure`); nothing here decides.
"""
import json, os, shutil, subprocess, sys

ARGUMENTS = json.loads(os.environ.pop("PCS_INSTALLER_ARGUMENTS"))
target = ARGUMENTS["target"]
build = ARGUMENTS["build"]
os.makedirs(target)
os.makedirs(build)
lock = ARGUMENTS.get("lock")
if lock is not None:
    with open(lock["path"], "x", encoding="utf-8") as f:
        f.write(lock["text"])
uv = shutil.which("uv") is not None
argv = ARGUMENTS["uv"] if uv else ARGUMENTS["pip"]
print("installer:", os.path.basename(argv[0]), flush=True)
env = dict(os.environ, TMPDIR=build, PIP_NO_INPUT="1", UV_LINK_MODE="copy")
code = subprocess.run(argv, env=env, cwd=build, stdin=subprocess.DEVNULL).returncode
if code == 0:
    print("staged", flush=True)
    raise SystemExit(0)

# The log lines that say why: what an index answered, why a link was skipped.
LOG_SIGNS = ("Could not fetch URL", "Client Error", "Server Error", "SSLError", "CERTIFICATE_VERIFY",
             "ProxyError", "Tunnel connection failed", "No sources permitted", "none of the wheel's tags")
LOG_MAX_BYTES = 8 << 20
LOG_MAX_LINES = 40
SKIPPED_MAX_LINES = 10
LINE_MAX = 400


def log_lines():
    try:
        with open(ARGUMENTS["log"], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOG_MAX_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    seen, answers, skipped = set(), [], []
    for line in text.splitlines():
        if not any(sign in line for sign in LOG_SIGNS):
            continue
        # pip's log lines start with a timestamp.
        line = line.split(" ", 1)[1] if line[:4].isdigit() and " " in line else line
        line = line[:LINE_MAX]
        if line in seen:
            continue
        seen.add(line)
        bucket, bound = (skipped, SKIPPED_MAX_LINES) if "Skipping link" in line else (answers, LOG_MAX_LINES)
        if len(bucket) < bound:
            bucket.append(line)
    return answers + skipped


sys.stdout.flush()
sys.stderr.flush()
print("pcs-installer-diagnosis", flush=True)
if uv:
    try:
        answer = subprocess.run(ARGUMENTS["diagnose"], env=env, cwd=build, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300).stdout
    except (OSError, subprocess.SubprocessError) as e:
        answer = ("pip could not be asked: %s\n" % type(e).__name__).encode()
    sys.stdout.write(answer[-(64 << 10):].decode("utf-8", "replace"))
for line in log_lines():
    print("log:", line)
sys.stdout.flush()
raise SystemExit(code)
