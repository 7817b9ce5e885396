# `pip` inside the sandbox goes through the server's installer: the code has no network, so pip
# itself could install nothing. During an execution the runner sends the host
#     {"type": "pip", "id": <the execution's id>, "line": "install seaborn==0.13"}
# and the host, after validating the line and installing the session's set with the new
# requirements outside the sandbox, answers on the runner's stdin
#     {"type": "pip_reply", "id": <same>, "ok": bool, "text": str, "add": [dir], "remove": [dir]}
# The runner prints `text` (stdout when ok, stderr when not), puts `add` first on sys.path, takes
# `remove` off and invalidates the import caches: the code's next line can import the package.
#
# Three ways in: `run(line)` (the `%pip` magic and `!pip`, on the main thread); and a `pip`/`pip3`
# shim first on the code's PATH (`install_shim`) that `subprocess`, `os.system` and the shell run,
# which asks a runner thread over a unix socket in a private directory; that thread forwards the
# same frame. One exchange at a time (a lock), and only while an execution runs (`during`): after
# its result no pip frame is ever sent.

import importlib
import json
import os
import signal
import socket
import stat
import sys
import threading

from . import prepared, protocol
from .processes import current_pid

# Held for a whole exchange (frame out, reply in) and by `during` while it ends an execution.
LOCK = threading.Lock()
# The executing request's id while one runs, and the runner's pid (a child the code forks has no
# protocol streams).
CURRENT = None
RUNNER_PID = None
# The most a shim's request may be, in bytes (the host's bound on a line is 4 KiB).
SHIM_REQUEST_MAX = 16 * 1024
# The shim's directory, once made.
SHIM_DIR = None


def during(request, execute):
    """Runs `execute(request)` with pip requests allowed for its id; returns what it returns once
    no exchange is in flight."""
    global CURRENT, RUNNER_PID
    with LOCK:
        CURRENT = request.get("id")
        RUNNER_PID = current_pid()
    try:
        return execute(request)
    finally:
        with LOCK:
            CURRENT = None


def apply(reply):
    """Puts the reply's sets on sys.path; returns the directories that were not there."""
    for path in reply.get("remove") or []:
        while path in sys.path:
            sys.path.remove(path)
    missing = []
    for path in reversed(reply.get("add") or []):
        if not isinstance(path, str) or not os.path.isdir(path):
            missing.append(str(path))
        elif path not in sys.path:
            sys.path.insert(0, path)
            prepared.use_set(path)
    importlib.invalidate_caches()
    return missing


def exchange(line):
    """Sends one pip request for the running execution and returns the host's reply (a dict with
    "ok" and "text"), applied to sys.path. Never raises for a refusal."""
    with LOCK:
        if CURRENT is None or current_pid() != RUNNER_PID:
            return {"ok": False, "text": "pip: only code that is running can ask for packages\n"}
        request_id = CURRENT
        # A SIGINT on the main thread waits until the reply is read whole: raising in the middle
        # of it would leave the rest of the frame to be read as the next request.
        on_main = threading.current_thread() is threading.main_thread()
        interrupted = []
        previous = None
        if on_main:
            previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        try:
            protocol.send_frame({"type": "pip", "id": request_id, "line": str(line)})
            while True:
                reply = protocol.read_frame()
                if reply is None:
                    reply = {"ok": False, "text": "pip: the host went away\n"}
                    break
                if reply.get("type") == "pip_reply" and reply.get("id") == request_id:
                    break
        finally:
            if on_main:
                signal.signal(signal.SIGINT, previous)
        missing = apply(reply) if reply.get("ok") else []
        if missing:
            reply = dict(reply)
            reply["ok"] = False
            reply["text"] = str(reply.get("text", "")) + (
                "pip: the installed set is not visible in this sandbox: %s\n" % ", ".join(missing)
            )
    if interrupted and callable(previous):
        previous(signal.SIGINT, None)
    return reply


def run(line):
    """`%pip LINE` / `!pip LINE`: asks the host, prints what it said (stdout when it worked,
    stderr when it was refused or failed). Returns nothing; a refusal raises nothing."""
    reply = exchange(line)
    text = str(reply.get("text", ""))
    stream = sys.stdout if reply.get("ok") else sys.stderr
    stream.write(text if text.endswith("\n") or not text else text + "\n")
    stream.flush()


SHIM = """#!%(python)s -I
# pip in this sandbox goes through the server's installer (the sandbox has no network).
import json, shlex, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(%(socket)r)
except OSError as e:
    sys.stderr.write("pip: the sandbox's installer is not reachable (%%s)\\n" %% e)
    sys.exit(1)
s.sendall(json.dumps({"line": " ".join(shlex.quote(a) for a in sys.argv[1:])}).encode() + b"\\n")
s.shutdown(socket.SHUT_WR)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
try:
    reply = json.loads(data.decode("utf-8"))
except ValueError:
    reply = {"ok": False, "text": "pip: no answer from the sandbox's installer\\n"}
(sys.stdout if reply.get("ok") else sys.stderr).write(str(reply.get("text", "")))
sys.exit(0 if reply.get("ok") else 1)
"""


def serve_shim(listener):
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with connection:
            try:
                connection.settimeout(10)
                data = b""
                while len(data) <= SHIM_REQUEST_MAX:
                    chunk = connection.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if len(data) > SHIM_REQUEST_MAX:
                    reply = {"ok": False, "text": "pip: the request is too long\n"}
                else:
                    line = json.loads(data.decode("utf-8", "replace")).get("line", "")
                    connection.settimeout(None)
                    reply = exchange(line)
                text = str(reply.get("text", ""))
                answer = {"ok": bool(reply.get("ok")), "text": text if text.endswith("\n") or not text else text + "\n"}
                connection.sendall(json.dumps(answer).encode("utf-8"))
            except (OSError, ValueError, AttributeError):
                continue


def install_shim():
    """Makes `pip` and `pip3` on the code's PATH ask the host (see the top of this file): a private
    directory under /tmp (0700) with the two scripts and the socket a runner thread serves."""
    global SHIM_DIR
    import tempfile

    try:
        directory = tempfile.mkdtemp(prefix="pcs-pip-")
        os.chmod(directory, stat.S_IRWXU)
        path = os.path.join(directory, "installer.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(4)
        listener.set_inheritable(False)
        script = SHIM % {"python": sys.executable, "socket": path}
        for name in ("pip", "pip3"):
            shim = os.path.join(directory, name)
            with open(shim, "w") as f:
                f.write(script)
            os.chmod(shim, stat.S_IRWXU)
    except OSError:
        return None  # no writable /tmp: pip stays what the image has
    os.environ["PATH"] = directory + os.pathsep + os.environ.get("PATH", os.defpath)
    threading.Thread(target=serve_shim, args=(listener,), name="pip-shim", daemon=True).start()
    SHIM_DIR = directory
    return directory
