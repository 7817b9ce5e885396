# Execution: the code runs in the runner process, in one globals namespace that lives as long as the
# runner, so a session keeps its variables between executions. Its stdout and stderr are captured
# within the request's cap; a SIGINT (which the supervisor passes on from the host) interrupts it
# with KeyboardInterrupt. The result names the workspace files the execution created or changed and
# carries the matplotlib figures it showed or left open. The value of the code's last expression
# and what it passed to display() come back as outputs in order with its prints (display.py).

import base64
import linecache
import os
import signal
import subprocess
import sys
import time
import traceback

# Called through the module, like protocol.send_frame (see runner.main).
from . import changes as workspace_changes
from . import display as rich
from . import protocol
from .capture import Capture
from .processes import kill_others, other_processes
from .streams import Streams

# Frames of the runner's own code (the loader's and every module's) are named <sandbox-runner...>.
RUNNER_FILENAME_PREFIX = "<sandbox-runner"


def without_runner_frames(te, seen):
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    kept = [frame for frame in te.stack if not frame.filename.startswith(RUNNER_FILENAME_PREFIX)]
    te.stack = traceback.StackSummary.from_list(kept)
    without_runner_frames(te.__cause__, seen)
    without_runner_frames(te.__context__, seen)


def user_traceback(exc):
    """The exception's traceback as Python would print it, without the runner's own frames."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    without_runner_frames(te, set())
    return "".join(te.format())


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


class Executor:
    """The runner's executions: its namespace, the capture thread, and whether code is running.
    Made once per runner, after its standard streams point at /dev/null (`devnull`)."""

    def __init__(self, devnull, figures, display):
        self.pid = os.getpid()
        self.devnull = devnull
        self.figures = figures
        self.display = display
        self.outputs = None
        self.executing = False
        self.counter = 0
        self.capture = Capture()
        self.streams = Streams()
        self.streams.install()
        self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.original_stdin = sys.stdin

    def on_sigint(self, signum, frame):
        # Only the executing code is interrupted; the runner itself ignores a late signal.
        if self.executing and os.getpid() == self.pid:
            raise KeyboardInterrupt

    def kill_strays(self):
        """After an interrupt: stop every other process the code started, and wait, briefly, until
        they are gone (reaped by pid 1 or by us), so the next execution starts clean. The budget
        stays under the host's grace (INTERRUPT_GRACE in sandbox.rs), so the answer comes in time."""
        kill_others(2.0, lambda children: not other_processes(self.pid))

    def run_code(self, code):
        filename = "<run %d>" % self.counter
        # Register the source so tracebacks can show the failing lines.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        body, expression = rich.last_expression_split(code, filename)
        exec(body, self.namespace)
        if expression is not None:
            value = eval(expression, self.namespace)
            if value is not None:
                self.namespace["_"] = value
                self.outputs.display(value, result=True)

    def position(self, job):
        """How many bytes of stdout and stderr the code has written so far, its buffers flushed."""
        if os.getpid() != self.pid:
            # A child the code forked: its outputs never reach the host, and the capture thread's
            # lock may have been held at the fork, forever in this process.
            return [0, 0]
        self.streams.flush(sys.stdout, sys.stderr)
        return job.position()

    def record_error(self, exc, job):
        """The exception as an `error` output and, as before, its traceback on stderr; the
        output records where the traceback's text is, so that it is not shown twice."""
        text = user_traceback(exc)
        at = self.position(job)
        sys.stderr.write(text)
        self.outputs.error(exc, text, at, self.position(job))

    def execute(self, request):
        op = request.get("op")
        cap = int(request.get("max_output", 1 << 20))
        before, _ = workspace_changes.snapshot()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        live = None
        if request.get("live"):
            request_id = request.get("id")

            def live(frame):
                frame["id"] = request_id
                protocol.send_frame(frame)

        job = self.capture.start(out_r, err_r, cap, live)
        if op != "shell":
            self.counter += 1  # the execution count of nbformat, and <run N> in tracebacks
        self.outputs = rich.Outputs(lambda: self.position(job), cap, self.counter)
        self.display.outputs = self.outputs
        self.figures.outputs = self.outputs
        # What the code's threads printed between executions went to /dev/null, as it always has,
        # not into this execution's output.
        with self.streams.lock:
            self.streams.flush()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        self.streams.running.set()
        exit_code = 0
        interrupted = False
        error = None
        started = time.monotonic()
        try:
            self.executing = True
            try:
                if op == "shell":
                    exit_code = run_shell(request["command"])
                else:
                    self.run_code(request["code"])
            finally:
                self.executing = False
        except SystemExit as exc:
            exit_code = exit_status_of(exc)
        except KeyboardInterrupt as exc:
            interrupted = True
            exit_code = 130
            error = {"type": "KeyboardInterrupt", "message": "interrupted"}
            self.record_error(exc, job)
        except BaseException as exc:  # the code's own failure, reported like Python would
            exit_code = 1
            try:
                message = str(exc)[:1000]
            except Exception:  # a __str__ that raises
                message = "(the exception's message could not be read)"
            error = {"type": type(exc).__name__, "message": message}
            self.record_error(exc, job)
        duration = time.monotonic() - started
        if os.getpid() != self.pid:
            # A child the code forked has finished the code: it must not go on as a runner (its
            # prints still in the buffers go out first, as they would at a normal exit).
            self.streams.flush(sys.stdout, sys.stderr)
            os._exit(exit_code & 0xFF)
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and not interrupted:
            self.figures.capture(pyplot, skip_saved=True)
        self.display.outputs = self.figures.outputs = None
        self.streams.running.clear()
        self.streams.flush(sys.stdout, sys.stderr)
        sys.stdin = self.original_stdin
        self.streams.install()
        # Under the flushing thread's lock: its last flush must not land in /dev/null.
        with self.streams.lock:
            self.streams.flush()
            os.dup2(self.devnull, 1)
            os.dup2(self.devnull, 2)
        signal.signal(signal.SIGINT, self.on_sigint)
        if interrupted:
            self.kill_strays()
        job.finish_requested.set()
        job.done.wait()
        after, truncated = workspace_changes.snapshot()
        changed, left_out = workspace_changes.bounded(workspace_changes.changes(before, after))
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
            "files": changed,
            "files_left_out": left_out,
            "files_truncated": truncated,
            "figures": [base64.b64encode(f).decode("ascii") for f in self.figures.take()],
            "outputs": self.outputs.items,
            "outputs_dropped": self.outputs.dropped,
        }
