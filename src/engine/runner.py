# The sandbox runner: the one long-lived Python process in a sandbox that executes code for the host.
#
# The host starts the container with a tiny bootstrap (see protocol.rs) that reads this file from
# stdin and executes it. From then on stdin carries requests and stdout carries replies, each a frame:
# a 4-byte big-endian length, then a UTF-8 JSON object. Nothing else is ever written to the protocol
# stream: the code's own stdout/stderr (fds 1 and 2) are pipes read by a capture thread, and between
# executions they point at /dev/null.
#
# Two processes run this file. The bootstrap is the container's pid 1: it becomes the supervisor
# (below), which forks the runner proper and starts a new one whenever the runner dies (killed by the
# kernel for memory, by the code itself, or on the host's request after an interrupt went
# unanswered). The container, and so the workspace, outlive the runner: a session loses its
# variables, never its files. The supervisor runs no user code and reads nothing from the host; it
# only writes one frame per runner death:
#            {"type": "exited", "status": int (negative: killed by that signal), "oom": bool|null,
#             "requested": bool}
#
# Requests:  {"op": "exec", "id": N, "code": str, "max_output": bytes}
#            {"op": "shell", "id": N, "command": str, "max_output": bytes}
#            {"op": "list", "id": N, "path": str}          (a directory of the workspace)
#            {"op": "paths", "id": N, "add": [dir], "remove": [dir]}   (installed dependencies)
# Replies:   {"type": "ready", ...} once per runner, then per request one {"type": "result", "id":
#            N, ...} (exec, shell), {"type": "listing", "id": N, ...} (list) or {"type": "paths",
#            "id": N, "missing": [dir]} (paths: directories that do not exist are not added).
#
# After each execution the result names the workspace files the execution created or changed
# (found by comparing two walks that never follow links), and carries the matplotlib figures it
# showed or left open, as PNG. The host copies the files out itself and checks everything again.
#
# The code runs in the runner process, in one globals namespace that lives as long as the runner,
# so a session keeps its variables between executions. The host interrupts an execution with SIGINT
# to pid 1, which passes it on (KeyboardInterrupt in the code); when that does not work it sends
# SIGUSR1, on which the supervisor kills every other process. SIGTERM (`docker stop`, an engine
# shutting down) ends the sandbox. The host treats every byte either
# process sends as untrusted: the code can reach the runner's memory, and signal the supervisor.

import json
import os
import select
import signal
import struct
import sys
import time


def write_frame(fd, obj):
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def oom_kill_count():
    """How many processes the kernel has killed in this sandbox's memory cgroup (v1 or v2), or
    None where the runtime does not show it."""
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kill_others(seconds, gone):
    """Kills every process but pid 1 and the caller (what kill(-1) spares) and reaps the caller's
    children, in rounds, until gone(children_left) says so. Forks are blocked while the kernel
    walks the task list, so one round stops a fork bomb; more rounds cover stragglers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        children = True
        try:
            while os.waitpid(-1, os.WNOHANG) != (0, 0):
                pass
        except ChildProcessError:
            children = False
        try:
            if gone(children):
                return
        except OSError:
            return
        time.sleep(0.01)


def host_hung_up():
    """The host closed the protocol: nobody will ever talk to a new runner."""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    return any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in poller.poll(0))


def supervise():
    """Pid 1: returns only in a freshly forked runner; never returns in the supervisor itself."""
    runner = [0]
    requested = [False]

    def forward_interrupt(signum, frame):
        if runner[0]:
            try:
                os.kill(runner[0], signal.SIGINT)
            except OSError:
                pass

    def kill_everything_else(signum, frame):
        requested[0] = True
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass

    def stop(signum, frame):
        # `docker stop` or an engine shutting down: end the sandbox, do not start a new runner.
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, forward_interrupt)
    signal.signal(signal.SIGUSR1, kill_everything_else)
    signal.signal(signal.SIGTERM, stop)
    while True:
        oom_before = oom_kill_count()
        try:
            pid = os.fork()
        except OSError:  # the process limit, briefly: every other process is being killed
            time.sleep(0.05)
            continue
        if pid == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            return
        runner[0] = pid
        started = time.monotonic()
        while True:
            try:
                done, status = os.wait()  # also reaps the orphans the code leaves behind
            except ChildProcessError:
                done, status = pid, 0
            if done == pid:
                break
        runner[0] = 0
        # Every process of the sandbox descends from pid 1: none is left once it has no children.
        kill_others(5.0, lambda children: not children)
        if host_hung_up():
            os._exit(0)
        oom_after = oom_kill_count()
        oom = None if oom_before is None or oom_after is None else oom_after > oom_before
        write_frame(
            1,
            {
                "type": "exited",
                "status": os.waitstatus_to_exitcode(status),
                "oom": oom,
                "requested": requested[0],
            },
        )
        requested[0] = False
        if time.monotonic() - started < 1.0:
            time.sleep(0.2)  # a runner that cannot start must not spin


if os.getpid() == 1:
    supervise()

# From here on: the runner.

import base64
import importlib
import importlib.abc
import io
import linecache
import queue
import stat
import subprocess
import threading
import traceback
import warnings

RUNNER_FILENAME = "<sandbox-runner>"
RUNNER_PID = os.getpid()

# The protocol streams move to private descriptors that executed code does not inherit (os.dup makes
# them non-inheritable), and which a forked child closes at once, so it can neither steal requests
# nor write replies.
PROTO_IN = os.dup(0)
PROTO_OUT = os.dup(1)
DEVNULL = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(DEVNULL, _fd)


def _close_protocol_in_child():
    for fd in (PROTO_IN, PROTO_OUT):
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_close_protocol_in_child)


def read_exact(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(PROTO_IN, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def read_frame():
    header = read_exact(4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    body = read_exact(length)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def send_frame(obj):
    write_frame(PROTO_OUT, obj)


WORKSPACE = "/workspace"
# Entries walked per snapshot; past it, changes are reported as incomplete.
TRACK_LIMIT = 10000
MAX_FIGURES = 8
MAX_FIGURES_BYTES = 16 << 20


def kind_of(mode):
    """What an lstat mode is, in the words the host uses."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


def snapshot(root=WORKSPACE):
    """The workspace's entries, without following links: path -> (kind, size, mtime, inode)."""
    entries = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                for entry in it:
                    if len(entries) >= TRACK_LIMIT:
                        return entries, True
                    path = rel + "/" + entry.name if rel else entry.name
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(path)
                        continue
                    entries[path] = (kind_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            pass
    return entries, False


def changes(before, after):
    changed = []
    for path in sorted(after):
        if before.get(path) != after[path]:
            kind, size = after[path][0], after[path][1]
            changed.append({"path": path, "kind": kind, "size": size})
    return changed


def list_directory(rel):
    """One directory of the workspace, for sandbox_list_files; never follows links."""
    path = os.path.normpath(os.path.join(WORKSPACE, rel))
    if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        return {"error": "the path is outside /workspace"}
    try:
        st = os.lstat(path)
    except OSError as e:
        return {"error": "%s: %s" % (rel or ".", e.strerror)}
    if not stat.S_ISDIR(st.st_mode):
        return {"error": "%s is not a directory" % (rel or ".")}
    entries = []
    truncated = False
    try:
        with os.scandir(path) as it:
            for entry in it:
                if len(entries) >= 1000:
                    truncated = True
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append({"name": entry.name, "kind": kind_of(st.st_mode), "size": st.st_size})
    except OSError as e:
        return {"error": "%s: %s" % (rel or ".", e.strerror)}
    entries.sort(key=lambda e: e["name"])
    return {"entries": entries, "truncated": truncated}


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


class Figures:
    """Matplotlib figures an execution showed (plt.show) or left open, as PNG bytes."""

    def __init__(self):
        self.captured = []
        self.size = 0

    def capture(self, pyplot, skip_saved=False):
        try:
            for number in pyplot.get_fignums():
                if len(self.captured) >= MAX_FIGURES:
                    break
                figure = pyplot.figure(number)
                if skip_saved and getattr(figure, "_sandbox_saved", False):
                    continue  # already written to a file, which comes back as such
                buffer = io.BytesIO()
                figure.savefig(buffer, format="png")
                data = buffer.getvalue()
                if self.size + len(data) <= MAX_FIGURES_BYTES:
                    self.captured.append(data)
                    self.size += len(data)
            pyplot.close("all")
        except Exception:
            pass

    def take(self):
        captured, self.captured, self.size = self.captured, [], 0
        return captured


FIGURES = Figures()


class PyplotHook(importlib.abc.MetaPathFinder):
    """When the code imports matplotlib.pyplot, make plt.show() hand the figures to the host
    (the Agg backend cannot show anything). Nothing happens when matplotlib is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                original = spec.loader.exec_module

                def exec_module(module, original=original):
                    original(module)
                    module.show = lambda *args, **kwargs: FIGURES.capture(module)
                    # Remember which figures the code saved itself (they are not sent twice).
                    figure_class = sys.modules["matplotlib.figure"].Figure
                    savefig = figure_class.savefig

                    def marking_savefig(self, *args, **kwargs):
                        self._sandbox_saved = True
                        return savefig(self, *args, **kwargs)

                    figure_class.savefig = marking_savefig

                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, PyplotHook())
warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")


class CaptureJob:
    """Reads one execution's stdout and stderr pipes, keeping at most `cap` bytes of both."""

    def __init__(self, out_fd, err_fd, cap):
        self.fds = {out_fd: 0, err_fd: 1}
        self.kept = [bytearray(), bytearray()]
        self.dropped = [0, 0]
        self.room = cap
        self.finish_requested = threading.Event()
        self.done = threading.Event()

    def run(self):
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        give_up_at = None
        try:
            while self.fds:
                if self.finish_requested.is_set() and give_up_at is None:
                    # A process the code left running may hold the pipes open: read what is
                    # already there, briefly, then stop listening to it.
                    give_up_at = time.monotonic() + 0.1
                if give_up_at is not None and time.monotonic() > give_up_at:
                    break
                for fd, _event in poller.poll(50):
                    stream = self.fds.get(fd)
                    if stream is None:
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        poller.unregister(fd)
                        del self.fds[fd]
                        os.close(fd)
                        continue
                    keep = min(len(chunk), self.room)
                    if keep:
                        self.kept[stream] += chunk[:keep]
                        self.room -= keep
                    self.dropped[stream] += len(chunk) - keep
        finally:
            for fd in self.fds:
                os.close(fd)
            self.fds = {}
            self.done.set()


class Capture:
    """One thread for the runner's whole life: an execution never needs a new thread, so capture
    keeps working when the code has used up the sandbox's process limit."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="capture", daemon=True).start()

    def _loop(self):
        while True:
            self.jobs.get().run()

    def start(self, out_fd, err_fd, cap):
        job = CaptureJob(out_fd, err_fd, cap)
        self.jobs.put(job)
        return job


class State:
    executing = False
    counter = 0


STATE = State()
CAPTURE = Capture()
NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}
ORIGINAL_STREAMS = (sys.stdin, sys.stdout, sys.stderr)


def on_sigint(signum, frame):
    # Only the executing code is interrupted; the runner itself ignores a late signal.
    if STATE.executing and os.getpid() == RUNNER_PID:
        raise KeyboardInterrupt


def without_runner_frames(te, seen):
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    kept = [frame for frame in te.stack if frame.filename != RUNNER_FILENAME]
    te.stack = traceback.StackSummary.from_list(kept)
    without_runner_frames(te.__cause__, seen)
    without_runner_frames(te.__context__, seen)


def user_traceback(exc):
    """The exception's traceback as Python would print it, without the runner's own frames."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    without_runner_frames(te, set())
    return "".join(te.format())


def other_processes():
    """Pids in this sandbox other than init (1) and the runner, zombies included."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, RUNNER_PID):
            pids.append(int(name))
    return pids


def kill_strays():
    """After an interrupt: stop every other process the code started, and wait, briefly, until
    they are gone (reaped by pid 1 or by us), so the next execution starts clean."""
    kill_others(2.0, lambda children: not other_processes())


def run_code(code):
    STATE.counter += 1
    filename = "<run %d>" % STATE.counter
    # Register the source so tracebacks can show the failing lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exec(compile(code, filename, "exec"), NAMESPACE)


def run_shell(command):
    completed = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL)
    return completed.returncode


def exit_status_of(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def execute(request):
    op = request.get("op")
    cap = int(request.get("max_output", 1 << 20))
    before, _ = snapshot()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job = CAPTURE.start(out_r, err_r, cap)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    exit_code = 0
    interrupted = False
    error = None
    started = time.monotonic()
    try:
        STATE.executing = True
        try:
            if op == "shell":
                exit_code = run_shell(request["command"])
            else:
                run_code(request["code"])
        finally:
            STATE.executing = False
    except SystemExit as exc:
        exit_code = exit_status_of(exc)
    except KeyboardInterrupt as exc:
        interrupted = True
        exit_code = 130
        error = {"type": "KeyboardInterrupt", "message": "interrupted"}
        sys.stderr.write(user_traceback(exc))
    except BaseException as exc:  # the code's own failure, reported like Python would
        exit_code = 1
        error = {"type": type(exc).__name__, "message": str(exc)[:1000]}
        sys.stderr.write(user_traceback(exc))
    duration = time.monotonic() - started
    if os.getpid() != RUNNER_PID:
        # A child the code forked has finished the code: it must not go on as a runner.
        os._exit(exit_code & 0xFF)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and not interrupted:
        FIGURES.capture(pyplot, skip_saved=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    sys.stdin, sys.stdout, sys.stderr = ORIGINAL_STREAMS
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.dup2(DEVNULL, 1)
    os.dup2(DEVNULL, 2)
    signal.signal(signal.SIGINT, on_sigint)
    if interrupted:
        kill_strays()
    job.finish_requested.set()
    job.done.wait()
    after, truncated = snapshot()
    return {
        "type": "result",
        "id": request.get("id"),
        "exit_code": exit_code,
        "stdout": base64.b64encode(bytes(job.kept[0])).decode("ascii"),
        "stderr": base64.b64encode(bytes(job.kept[1])).decode("ascii"),
        "stdout_dropped": job.dropped[0],
        "stderr_dropped": job.dropped[1],
        "duration_ms": duration * 1000.0,
        "interrupted": interrupted,
        "error": error,
        "files": changes(before, after),
        "files_truncated": truncated,
        "figures": [base64.b64encode(f).decode("ascii") for f in FIGURES.take()],
    }


def main():
    signal.signal(signal.SIGINT, on_sigint)
    sys.argv = [""]
    send_frame(
        {
            "type": "ready",
            "pid": RUNNER_PID,
            "uid": os.getuid(),
            "python": sys.version.split()[0],
        }
    )
    while True:
        request = read_frame()
        if request is None:
            return
        if request.get("op") == "paths":
            send_frame(update_paths(request))
        elif request.get("op") == "list":
            listing = list_directory(str(request.get("path", "")))
            listing.update({"type": "listing", "id": request.get("id")})
            send_frame(listing)
        else:
            send_frame(execute(request))


main()
