# The sandbox runner: the one long-lived Python process in a sandbox that executes code for the host.
#
# The host starts the container with a tiny bootstrap (see protocol.rs) that reads this file from
# stdin and executes it. From then on stdin carries requests and stdout carries replies, each a frame:
# a 4-byte big-endian length, then a UTF-8 JSON object. Nothing else is ever written to the protocol
# stream: the code's own stdout/stderr (fds 1 and 2) are pipes read by a capture thread, and between
# executions they point at /dev/null.
#
# Requests:  {"op": "exec", "id": N, "code": str, "max_output": bytes}
#            {"op": "shell", "id": N, "command": str, "max_output": bytes}
# Replies:   {"type": "ready", ...} once, then one {"type": "result", "id": N, ...} per request.
#
# The code runs in this process, in one globals namespace that lives as long as the runner, so a
# session keeps its variables between executions. The host interrupts an execution with SIGINT
# (KeyboardInterrupt in the code); it kills the whole sandbox when that does not work. The host
# treats every byte this process sends as untrusted: the code can reach this process's memory.

import base64
import json
import linecache
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

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
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    data = struct.pack(">I", len(body)) + body
    view = memoryview(data)
    while view:
        written = os.write(PROTO_OUT, view)
        view = view[written:]


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


def kill_strays():
    """After an interrupt: stop every other process the code started (kill(-1) spares pid 1, the
    container's init, and this process). Forks are blocked while the kernel walks the task list,
    so a fork bomb is stopped by one round; a few more rounds cover stragglers."""
    for _ in range(5):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        except OSError:
            break
        time.sleep(0.01)
    try:
        while os.waitpid(-1, os.WNOHANG) != (0, 0):
            pass
    except ChildProcessError:
        pass


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
        send_frame(execute(request))


main()
