# The runner proper: the process the supervisor forks. It protects pid 1 from the code, takes the
# protocol streams for itself, and answers the host's requests one at a time (protocol.py).

import importlib
import os
import signal
import sys

from . import figures
from .execute import Executor
from .protocol import Channel
from .seccomp import forbid_targeting_init
from .workspace import list_directory, read_file, write_file


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
    importlib.invalidate_caches()
    return {"type": "paths", "id": request.get("id"), "missing": missing}


def main():
    init_protected = forbid_targeting_init()
    channel = Channel()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    executor = Executor(devnull, figures.install())
    signal.signal(signal.SIGINT, executor.on_sigint)
    sys.argv = [""]
    channel.send(
        {
            "type": "ready",
            "pid": executor.pid,
            "uid": os.getuid(),
            "python": sys.version.split()[0],
            "init_protected": init_protected,
        }
    )
    while True:
        request = channel.read()
        if request is None:
            return
        if request.get("op") == "paths":
            channel.send(update_paths(request))
        elif request.get("op") == "list":
            listing = list_directory(str(request.get("path", "")))
            listing.update({"type": "listing", "id": request.get("id")})
            channel.send(listing)
        elif request.get("op") == "read":
            channel.send(read_file(request))
        elif request.get("op") == "write":
            channel.send(write_file(request))
        else:
            channel.send(executor.execute(request))
