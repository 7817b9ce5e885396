# Execution: the code runs in the runner process through IPython's run_cell (shell.py), in the
# shell's namespace, which lives as long as the runner, so a session keeps its variables between
# executions. Its stdout and stderr are captured within the request's cap; a SIGINT (which the
# supervisor passes on from the host) interrupts it with KeyboardInterrupt. An uncaught exception
# ends it with exit code 1 and IPython's traceback as an `error` output; a SystemExit(n) with exit
# code n and, as ipykernel shows it, an `error` output and IPython's warning on stderr (a project
# script's is only its exit status, as for a script); exit(n) and quit(n) with n, quietly. The
# result names the workspace files the execution created or changed and carries the matplotlib
# figures it showed or left open. The last expression's value and what the code displayed come
# back as outputs in order with its prints (display.py).

import base64
import os
import signal
import subprocess
import sys
import time
import warnings

# Called through the module, like protocol.send_frame (see runner.main).
from . import changes as workspace_changes
from . import display as rich
from . import protocol
from .capture import Capture
from .processes import current_pid, kill_others, other_processes
from .shell import Exited
from .streams import Streams


def run_shell(command):
    completed = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL)
    return completed.returncode


def message_of(exc):
    try:
        return str(exc)[:1000]
    except Exception:  # a __str__ that raises
        return "(the exception's message could not be read)"


def hidden_names(namespace, hidden):
    """IPython's names in `namespace`: those it keeps in user_ns_hidden (where they still hold
    IPython's value), the output cache's _, __, ___, _N and the input cache's _i, _ii, _iii, _iN,
    and _exit_code."""
    names = set()
    for name, value in list(namespace.items()):
        if not isinstance(name, str):
            continue
        if name in hidden and hidden[name] is value:
            names.add(name)
        elif name in ("_", "__", "___", "_i", "_ii", "_iii", "_exit_code"):
            names.add(name)
        elif name.startswith("_i") and name[2:].isdigit() or name.startswith("_") and name[1:].isdigit():
            names.add(name)
    return frozenset(names)


# IPython's warning after a SystemExit (a terminal would have exited).
EXIT_ADVICE = "To exit: use 'exit', 'quit', or Ctrl-D."


def exit_status_of(exc, show=True):
    """A SystemExit's (or exit()'s) status, as Python's own exit makes it: a message is status 1,
    printed on stderr when `show` (IPython's error output shows it instead)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        # Beyond a C long Python's own exit gives -1 (status 255); the result carries a 64-bit one.
        return code if -(1 << 63) <= code < (1 << 63) else -1
    if show:
        print(code, file=sys.stderr)
    return 1


class Executor:
    """The runner's executions: its shell (its namespace is the session's), the capture thread,
    and whether code is running. Made once per runner, after its standard streams point at
    /dev/null (`devnull`). `shell` is None when IPython could not be imported (`why`): code is
    then refused, with that reason, unless the runner was given no IPython at all (`scripts`):
    the server's own installer, preparer and maintenance sandboxes, which run only the project's
    scripts (plain Python, no cells)."""

    def __init__(self, devnull, figures, shell, why=None, scripts=False):
        self.pid = current_pid()
        self.devnull = devnull
        self.figures = figures
        self.shell = shell
        self.why = why
        self.scripts = scripts and shell is None
        self.outputs = None
        self.job = None
        self.error = None
        self.executing = False
        self.capture = Capture()
        self.streams = Streams()
        self.streams.install()
        if shell is not None:
            self.namespace = shell.user_ns
            shell.on_traceback = self.record_traceback
        else:
            self.namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        self.original_stdin = sys.stdin
        # The workspace as the last execution left it (its walk after the code), the next one's
        # "before": one walk an execution instead of two. Anything but reads the host asks of
        # the runner (a file written, a snapshot restored) forgets it (forget_walk), so only the
        # code's own changes are reported; what the code's processes changed between two
        # executions is reported by the next one.
        self.walked = None

    def forget_walk(self):
        """The host asked for something that may change the workspace: the next execution walks it
        again."""
        self.walked = None

    def on_sigint(self, signum, frame):
        # Only the executing code is interrupted; the runner itself ignores a late signal.
        if self.executing and current_pid() == self.pid:
            raise KeyboardInterrupt

    def interruptible(self, request, reply_type, work, clean):
        """Host work that runs the session's own code (a snapshot's pickling runs its values'
        __reduce__, a restore's unpickling and imports theirs): interrupted as an execution is when
        the host's time for it, the call's timeout, is up. Interrupted, `clean` removes what it
        left half-made and the reply says so."""
        try:
            self.executing = True
            try:
                return work()
            finally:
                self.executing = False
        except KeyboardInterrupt:
            clean()
            self.kill_strays()
            return {"type": reply_type, "id": request.get("id"), "error": "interrupted at the call's timeout"}

    def kill_strays(self):
        """After an interrupt: stop every other process the code started, and wait, briefly, until
        they are gone (reaped by pid 1 or by us), so the next execution starts clean. The budget
        stays under the host's grace (GRACE in engine/interrupt.rs), so the answer comes in time."""
        kill_others(2.0, lambda children: not other_processes(self.pid))

    def hidden_names(self):
        """The namespace's names that are IPython's, not the session's: never saved in a snapshot
        nor restored over (In, Out, _, _3, _i3, get_ipython, ...)."""
        if self.shell is None:
            return frozenset()
        return hidden_names(self.namespace, self.shell.user_ns_hidden)

    def position(self, job, spawning=False):
        """How many bytes of stdout and stderr the code has written so far, its buffers flushed
        (`spawning`: another program is about to write to them, see streams.Order.settle)."""
        if current_pid() != self.pid:
            # A child the code forked: its outputs never reach the host, and the capture thread's
            # lock may have been held at the fork, forever in this process.
            return [0, 0]
        self.streams.flush(sys.stdout, sys.stderr)
        at = job.position()
        if self.outputs is not None:
            self.streams.order.settle(at, self.outputs.switched, spawning)
        return at

    def record_traceback(self, etype, evalue, stb, text):
        """IPython's traceback (its structured lines, no colours) as an `error` output and, as
        before, its text on stderr; the output records where that text is, so that it is not
        shown twice."""
        job = self.job
        outputs = self.outputs
        if job is None or outputs is None or current_pid() != self.pid:
            print(text, file=sys.stderr)
            return
        at = self.position(job)
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        # IPython's entries as a notebook keeps them (one a frame, lines joined by newlines).
        entries = [entry if isinstance(entry, str) else str(entry) for entry in stb]
        outputs.error(etype.__name__, message_of(evalue), entries, at, self.position(job))

    def show_escaped(self, exc):
        """An exception that escaped run_cell (an interrupt in IPython's own code around the
        code's): its type and message only, IPython's frames are not the code's."""
        if isinstance(exc, (SystemExit, Exited)):
            return
        if self.shell is not None:
            try:
                stb = self.shell.InteractiveTB.get_exception_only(type(exc), exc)
                self.record_traceback(type(exc), exc, stb, self.shell.InteractiveTB.stb2text(stb))
                return
            except Exception:
                pass
        text = "%s: %s" % (type(exc).__name__, message_of(exc))
        self.record_traceback(type(exc), exc, [text], text)

    def counted(self, op, request):
        """The shell's count of the execution that just ran (`In [n]`): None for a shell command,
        a script, or a blank cell (IPython does not count those)."""
        if op == "shell" or self.shell is None or not str(request.get("code", "")).strip():
            return None
        return self.shell.execution_count - 1

    def run_code(self, code, script=False):
        """The code through IPython's run_cell; what it raised (None when it ran through). A
        `script` (a program, as `python FILE` runs it) ends with SystemExit quietly, and the
        figures it saved to files are not shown again at its end (figures.py)."""
        if self.scripts:
            # A project script: what it raises reaches execute() as an escaped exception.
            exec(compile(code, "<script>", "exec"), self.namespace)
            return None
        if self.shell is None:
            print("The sandbox cannot run code: %s" % self.why, file=sys.stderr)
            return RuntimeError(self.why)
        if script:
            self.shell.running_script = True
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=EXIT_ADVICE)
                    result = self.shell.run_cell(code, store_history=True)
            finally:
                self.shell.running_script = False
        else:
            result = self.shell.run_cell(code, store_history=True)
        history = self.shell.history_manager
        if history is not None:
            # Without a database these queues are never emptied: In and Out keep what they need.
            history.db_input_cache.clear()
            history.db_output_cache.clear()
        return result.error_before_exec or result.error_in_exec

    def execute(self, request):
        op = request.get("op")
        script = bool(request.get("script"))
        cap = int(request.get("max_output", 1 << 20))
        before = self.walked
        if before is None:
            before, _ = workspace_changes.snapshot()
        self.walked = None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        live = None
        if request.get("live"):
            request_id = request.get("id")

            def live(frame):
                frame["id"] = request_id
                protocol.send_frame(frame)

        job = self.capture.start(out_r, err_r, cap, live)
        self.job = job
        self.outputs = rich.Outputs(lambda: self.position(job), cap, job if live is not None else None)
        if live is not None:
            outputs, order = self.outputs, self.streams.order
            job.places = lambda: (outputs.switches, order.unsettled())
        if self.shell is not None:
            self.shell.outputs = self.outputs
        # What the code's threads printed between executions went to /dev/null, as it always has,
        # not into this execution's output.
        with self.streams.lock:
            self.streams.flush()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        self.streams.start(lambda: self.capture.hand_over(job), lambda spawning=False: self.position(job, spawning))
        exit_code = 0
        interrupted = False
        error = None
        # A little before, for file systems whose times are coarser than the clock.
        since_ns = time.time_ns() - 10_000_000
        started = time.monotonic()
        try:
            self.executing = True
            try:
                if op == "shell":
                    exit_code = run_shell(request["command"])
                    raised = None
                else:
                    raised = self.run_code(request["code"], script)
            finally:
                self.executing = False
        except BaseException as exc:
            # Raised outside the code's own frames (an interrupt in IPython's machinery around it,
            # a failing shell command).
            raised = exc
            self.show_escaped(exc)
        if isinstance(raised, Exited) or isinstance(raised, SystemExit) and (self.scripts or script):
            exit_code = exit_status_of(raised)
        elif isinstance(raised, SystemExit):
            # Shown by IPython as an error, as ipykernel shows it (a notebook's run stops there).
            exit_code = exit_status_of(raised, show=False)
            error = {"type": "SystemExit", "message": message_of(raised)}
        elif isinstance(raised, KeyboardInterrupt):
            interrupted = True
            exit_code = 130
            error = {"type": "KeyboardInterrupt", "message": "interrupted"}
        elif raised is not None:  # the code's own failure, shown as IPython shows it
            exit_code = 1
            error = {"type": type(raised).__name__, "message": message_of(raised)}
        duration = time.monotonic() - started
        if current_pid() != self.pid:
            # A child the code forked has finished the code: it must not go on as a runner (its
            # prints still in the buffers go out first, as they would at a normal exit).
            self.streams.flush(sys.stdout, sys.stderr)
            os._exit(exit_code & 0xFF)
        if self.streams.order.pending:
            self.position(job)  # the place where stdout came after stderr last, if it did
        if self.shell is not None:
            self.shell.outputs = None
        self.job = None
        self.streams.stop()
        self.streams.flush(sys.stdout, sys.stderr)
        sys.stdin = self.original_stdin
        self.streams.install()
        # Under the flushing thread's lock: its last flush must not land in /dev/null.
        with self.streams.lock:
            self.streams.flush()
            os.dup2(self.devnull, 1)
            os.dup2(self.devnull, 2)
        # The runner's handler again if the code set another (asked of Python, not the kernel:
        # a system call saved per execution).
        if signal.getsignal(signal.SIGINT) != self.on_sigint:
            signal.signal(signal.SIGINT, self.on_sigint)
        if interrupted:
            self.kill_strays()
        self.capture.finish(job)
        after, truncated = workspace_changes.snapshot()
        self.walked = None if truncated else after
        changed, left_out = workspace_changes.bounded(workspace_changes.changes(before, after))
        in_roots, roots_truncated = [], False
        if workspace_changes.WRITABLE_ROOTS:
            in_roots, roots_truncated = workspace_changes.changed_in_roots(since_ns)
        root_files, roots_left_out = workspace_changes.bounded(in_roots)
        return {
            "type": "result",
            "id": request.get("id"),
            "exit_code": exit_code,
            **job.result(),
            "duration_ms": duration * 1000.0,
            "interrupted": interrupted,
            "error": error,
            "files": changed,
            "files_left_out": left_out,
            "files_truncated": truncated,
            "root_files": root_files,
            "root_files_left_out": roots_left_out,
            "root_files_truncated": roots_truncated,
            "figures": [base64.b64encode(f).decode("ascii") for f in self.figures.take()],
            "outputs": self.outputs.items,
            "outputs_dropped": self.outputs.dropped,
            "switches": self.outputs.switches,
            "execution_count": self.counted(op, request),
        }
