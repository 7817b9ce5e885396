# The runner proper: the process the supervisor forks. It protects pid 1 from the code, takes the
# protocol streams for itself, and answers the host's requests one at a time (protocol.py).

import importlib
import os
import signal
import sys

from . import display, figures, importer, pip, prepared, protocol, snapshot
from . import shell as sandbox_shell
from .execute import Executor
from .seccomp import forbid_targeting_init
from .workspace import list_directory, read_file, write_file

# What the host asks of the runner besides executions and reads (a listing, a file's chunk, a
# snapshot's chunk: the host copies files out after an execution): after any of these the next
# execution walks the workspace again rather than start from the last one's walk.
HOST_OPS = frozenset(("paths", "preload", "write", "snapshot", "restore_write", "restore", "snapshot_discard"))


def update_paths(request):
    """Puts installed dependency sets first on sys.path (and takes replaced ones off)."""
    for path in request.get("remove") or []:
        while path in sys.path:
            sys.path.remove(path)
    missing = []
    for path in reversed(request.get("add") or []):
        if not os.path.isdir(path):
            missing.append(path)
        elif path not in sys.path:
            sys.path.insert(0, path)
            prepared.use_set(path)
    importlib.invalidate_caches()
    return {"type": "paths", "id": request.get("id"), "missing": missing}


def start_shell():
    """(the IPython shell, None) or (None, why there is none)."""
    IPython, why = importer.load_ipython()
    if IPython is None:
        return None, why
    try:
        shell = sandbox_shell.create(IPython)
        display.install(shell)
        sandbox_shell.warm(shell)
    except Exception as exc:  # IPython imported but its shell failed: the host is told why
        return None, "IPython's shell could not be made: %s: %s" % (type(exc).__name__, str(exc)[:500])
    return shell, None


def prepare():
    """What every runner of this sandbox starts from, made before any code runs (by the supervisor,
    once, so each runner it forks has it at once): (shell, why there is none, whether this sandbox
    runs the server's own scripts). IPython's import and its shell are paid here, before the
    runner says ready (a pooled sandbox pays them before any call comes)."""
    # Told of no set: a sandbox of the server's own scripts (installer, preparer, maintenance).
    scripts = not os.environ.get("PCS_IPYTHON")
    shell, why = (None, "no IPython set was given") if scripts else start_shell()
    return shell, why, scripts


def main(start):
    # Frames go through the protocol module's attributes, not names bound here: code that rewrites
    # protocol.send_frame in the runner's memory (the tests of a lying runner do) changes what the
    # runner really sends.
    init_protected = forbid_targeting_init()
    protocol.take_over_streams()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    ready = {
        "type": "ready",
        "pid": os.getpid(),
        "uid": os.getuid(),
        "python": sys.version.split()[0],
        "init_protected": init_protected,
    }
    shell, why, scripts = start
    if shell is not None:
        ready["ipython"] = sys.modules["IPython"].__version__
    else:
        ready["ipython_error"] = why
    executor = Executor(devnull, figures.install(shell), shell, why, scripts)
    signal.signal(signal.SIGINT, executor.on_sigint)
    sys.argv = [""]
    pip.install_shim()
    protocol.send_frame(ready)
    while True:
        request = protocol.read_frame()
        if request is None:
            return
        if request.get("type") == "pip_reply":
            continue  # the answer to a pip request whose wait an interrupt ended (pip.py)
        if request.get("op") in HOST_OPS:
            executor.forget_walk()
        if request.get("op") == "paths":
            protocol.send_frame(update_paths(request))
        elif request.get("op") == "preload":
            protocol.send_frame(prepared.preload(request))
        elif request.get("op") == "list":
            listing = list_directory(str(request.get("path", "")))
            listing.update({"type": "listing", "id": request.get("id")})
            protocol.send_frame(listing)
        elif request.get("op") == "read":
            protocol.send_frame(read_file(request))
        elif request.get("op") == "write":
            protocol.send_frame(write_file(request))
        elif request.get("op") == "snapshot":
            protocol.send_frame(executor.interruptible(
                request, "snapshot",
                lambda: snapshot.snapshot(request, executor.namespace, executor.hidden_names()),
                snapshot.remove_snapshot_quietly))
        elif request.get("op") == "snapshot_read":
            protocol.send_frame(snapshot.snapshot_read(request))
        elif request.get("op") == "restore_write":
            protocol.send_frame(snapshot.restore_write(request, protocol.read_raw_frame()))
        elif request.get("op") == "restore":
            protocol.send_frame(executor.interruptible(
                request, "restored",
                lambda: snapshot.restore(request, executor.namespace, executor.hidden_names()),
                snapshot.remove_upload_quietly))
        elif request.get("op") == "snapshot_discard":
            protocol.send_frame(snapshot.discard(request))
        else:
            protocol.send_frame(pip.during(request, executor.execute))
