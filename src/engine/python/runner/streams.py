# The code's sys.stdout and sys.stderr: buffered like Python's own when they are pipes, flushed
# often enough that output is never held back for long.
#
# The container's Python runs with -u, which would make every print several write(2) calls, each
# waking the capture thread (a thread of this process, so each wake-up also contends for the GIL):
# code that prints a lot ran 8x slower than the same code under a plain `docker run`. So the runner
# gives the code a block-buffered stdout and a line-buffered stderr (Python's defaults for pipes)
# over fds 1 and 2, one pair for the runner's whole life (a session's code may keep references to
# them). Buffered text reaches the pipes:
#   - at the end of an execution and before each output position is taken (execute.py, display.py);
#   - before a fork (os.register_at_fork), so a forked child never repeats the parent's text;
#   - every FLUSH_INTERVAL while code runs, from a thread of its own (below), so a slow loop's
#     prints show up while it runs (live output) and a process killed for memory loses little.
# As with any Python whose stdout is a pipe, text a subprocess or os.write(1, ...) writes directly
# can come before print()ed text still in the buffer; the runner flushes before starting a
# subprocess (an audit hook), which keeps the common case, print() then a command, in order.
#
# The order across the two streams: stdout and stderr are two pipes, so what was read of each
# does not say which came first. The place where the code went from stderr back to stdout is
# recorded (display.py, `Outputs.switched`): the stderr text up to there came before the stdout
# text from there, as a Jupyter kernel shows it. stdout stays Python's own text object (a method of
# ours on it made print() 5x slower); its buffer counts the bytes it is given (a chunk of about
# 8 KiB at a time, or at a flush). A write to stderr first flushes stdout and, when stdout was
# written since the last stderr write, records that place (one look at the pipes per change of
# stream; under gVisor a look per write made a loop of warnings 12x slower). An output, and the
# end of the execution, settle the same way (`Order.settle`).
#
# The count is kept by the buffer, not by the file under it: Python's BufferedWriter takes an
# exception from its file's write as "nothing written", and an interrupt (KeyboardInterrupt) can
# be raised in a method of ours just after the system call wrote: the buffer then wrote the same
# bytes again at its next flush. Between the text object and the buffer, an exception after the
# buffer took the bytes loses nothing and repeats nothing (the text object has handed them over);
# the count then misses that chunk, which only moves the place recorded for that interrupted cell.

import io
import os
import sys
import threading
import time

FLUSH_INTERVAL = 0.2
IDLE_TICKS = 50
BUFFER_SIZE = 1 << 16


def _buffered(fd, like, line_buffering, kind=io.TextIOWrapper, buffer=io.BufferedWriter):
    return kind(
        buffer(io.FileIO(fd, "w", closefd=False), BUFFER_SIZE),
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
        line_buffering=line_buffering,
    )


class CountingBuffer(io.BufferedWriter):
    """stdout's buffer: counts the bytes it is given."""

    count = 0

    def __init__(self, raw, size):
        super().__init__(raw, size)
        # Threads that print at once would lose an increment between reading and storing it.
        self.count_lock = threading.Lock()

    def write(self, data):
        written = super().write(data)
        with self.count_lock:
            self.count += written
        return written


class Order:
    """Where the code last wrote to stderr, for the place where it goes back to stdout."""

    def __init__(self):
        # stdout's buffer (a CountingBuffer), set by Streams.
        self.stdout_buffer = None
        # stderr was written since the last place recorded (or output taken), when stdout's file
        # had been given `stdout_count` bytes.
        self.pending = False
        self.stdout_count = 0
        # () -> the streams' positions, which settles (the running execution's; None between).
        self.look = None
        # stdout's count and position at the last look (or the execution's start): a count later
        # is a position as far as only stdout's own object wrote to fd 1 since (see `unsettled`).
        self.anchor = (0, 0)
        self.looking = False

    def begin(self, look):
        """An execution starts (its pipes at position 0)."""
        self.pending = False
        self.look = look
        self.looking = False
        self.anchor = (self.stdout_buffer.count, 0)

    def unsettled(self):
        """Where the code went from stderr back to stdout since the last place recorded: stdout's
        position then, from the counts alone (no look at the pipes), or None. Read by the capture
        thread for live output, a moment's view; the result's places are settled exactly."""
        stdout_count = self.stdout_count
        if not self.pending or self.stdout_buffer.count == stdout_count:
            return None
        count, position = self.anchor
        return position + max(0, stdout_count - count)

    def before_stderr(self, stdout):
        """A write to stderr comes: stdout's text goes first, and when stdout was written since
        the last stderr write, the place between them is recorded."""
        try:
            stdout.flush()
        except Exception:
            pass
        if self.pending and self.stdout_buffer.count != self.stdout_count:
            self._look(False)

    def _look(self, spawning):
        """Takes the streams' positions (the running execution's), once at a time: the look
        flushes the code's own sys.stdout, which may write to stderr (a logger as stdout)."""
        look = self.look
        if look is None or self.looking:
            return
        self.looking = True
        try:
            look(spawning)
        finally:
            self.looking = False

    def after_stderr(self):
        if self.looking:
            return  # written by the look's own flush: the place being recorded comes first
        self.pending = True
        self.stdout_count = self.stdout_buffer.count

    def settle(self, at, record, spawning=False):
        """The streams are at `at` (both flushed): if stdout was written since the last stderr
        write, `record` gets the place in between: stdout's position then, stderr's now. When
        another program is about to write to the pipes (`spawning`), the place is recorded even
        with no stdout text since: what it writes comes after that stderr text."""
        count = self.stdout_buffer.count
        self.anchor = (count, at[0])
        if self.pending:
            self.pending = False
            since = count - self.stdout_count
            if since or spawning:
                record([max(0, at[0] - since), at[1]])

    def before_spawn(self):
        """Another program starts on the pipes (the streams are flushed): the place where the code
        last went from stderr to stdout is recorded now, before that program's bytes can move
        the stdout position it is worked out from."""
        if self.pending:
            self._look(True)


class OrderedStderr(io.TextIOWrapper):
    """The code's stderr: each write is placed after the stdout text written before it."""

    order = None
    stdout = None

    def write(self, text):
        order = self.order
        order.before_stderr(self.stdout)
        written = super().write(text)
        order.after_stderr()
        return written

    def writelines(self, lines):
        for line in lines:
            self.write(line)


class Streams:
    """The runner's stdout and stderr objects and the thread that flushes them while code runs.

    The flushing is a thread of its own, made once (like the capture thread): the capture thread
    cannot do it, because a flush waits for the stream's lock, which the code's thread holds while
    it writes into a full pipe that only the capture thread empties."""

    def __init__(self):
        self.order = Order()
        self.stdout = self._stdout(sys.stdout)
        self.stderr = self._stderr(sys.stderr)
        # Held while this runner flushes, and taken before a fork: a child is never forked while
        # the flushing thread holds a stream's lock (which would stay held forever in the child).
        self.lock = threading.Lock()
        # Whether code runs (set and cleared by the executing thread; plain values, read by the
        # flushing thread at each tick), and what to call at each tick while it does.
        self.running = False
        self.tick = None
        # The flushing thread wakes every FLUSH_INTERVAL (an execution starts without waking it:
        # under gVisor every wake-up of another thread is several costly system calls) and,
        # after IDLE_TICKS ticks without code, sleeps on `wake` until code runs again.
        self.sleeping = False
        self.wake = threading.Event()
        # Whether the fork under way holds `lock` (see _before_fork).
        self.held_for_fork = False
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork_in_parent,
            after_in_child=self._after_fork_in_child,
        )
        sys.addaudithook(self._audit)
        threading.Thread(target=self._loop, name="flush", daemon=True).start()

    def _stdout(self, like, count=0):
        stream = _buffered(1, like, line_buffering=False, buffer=CountingBuffer)
        stream.buffer.count = count
        self.order.stdout_buffer = stream.buffer
        return stream

    def _stderr(self, like):
        stream = _buffered(2, like, line_buffering=True, kind=OrderedStderr)
        stream.order = self.order
        stream.stdout = self.stdout
        return stream

    def install(self):
        """Makes them the code's sys.stdout and sys.stderr again (the code may have replaced them),
        new ones in place of any the code closed (which would fail every later print)."""
        if self.stdout.closed:
            # A new one, counting on.
            self.stdout = self._stdout(self.stdout, self.order.stdout_buffer.count)
            self.stderr.stdout = self.stdout
        if self.stderr.closed:
            self.stderr = self._stderr(self.stderr)
        sys.stdout = sys.__stdout__ = self.stdout
        sys.stderr = sys.__stderr__ = self.stderr

    def flush(self, *extra):
        """Flushes the runner's streams and `extra` ones (the code may have replaced sys.stdout);
        a stream that fails to flush (closed by the code, a broken object) is skipped."""
        for stream in (self.stdout, self.stderr) + extra:
            try:
                stream.flush()
            except Exception:
                pass

    def start(self, tick=None, look=None):
        """Code starts running: the flushing thread calls `tick`, then flushes, every FLUSH_INTERVAL
        until `stop`; `look(spawning=False)` takes the streams' positions where the code goes from
        stderr back to stdout (see Order.settle). Nothing wakes this thread here unless it sleeps (IDLE_TICKS unused ones)."""
        self.order.begin(look)
        self.tick = tick
        self.running = True
        if self.sleeping:
            self.wake.set()

    def stop(self):
        self.running = False
        self.tick = None
        self.order.look = None

    def _loop(self):
        idle = 0
        while True:
            time.sleep(FLUSH_INTERVAL)
            if self.running:
                idle = 0
                # The tick first: it hands the pipes to their reader (capture.py), and a flush
                # may wait on a writer that waits on a full pipe.
                tick = self.tick
                if tick is not None:
                    tick()
                with self.lock:
                    self.flush()
                continue
            idle += 1
            if idle < IDLE_TICKS:
                continue
            # Long idle: sleep until code runs. `start` sets `running` before it looks at
            # `sleeping`, and this looks at `running` after setting `sleeping`: one of the two
            # sees the other, so code never runs without this thread.
            idle = 0
            self.wake.clear()
            self.sleeping = True
            if not self.running:
                self.wake.wait()
            self.sleeping = False

    def _before_fork(self):
        # An interrupt can land in this hook (Python then drops the KeyboardInterrupt and forks
        # anyway; the host repeats the interrupt): the lock is released after the fork only if it
        # was taken, never the flushing thread's.
        self.lock.acquire()
        self.held_for_fork = True
        self.flush()

    def _after_fork_in_parent(self):
        if self.held_for_fork:
            self.held_for_fork = False
            self.lock.release()

    def _after_fork_in_child(self):
        # A lock of its own: no flushing thread here can hold it.
        self.lock = threading.Lock()
        self.held_for_fork = False
        self.running = False  # the flushing thread does not exist in the child
        # A thread of the parent may have held it at the fork.
        self.order.stdout_buffer.count_lock = threading.Lock()
        self.tick = None
        self.order.look = None  # what the child writes is not captured

    def _audit(self, event, args):
        # Only the events that start another program on these pipes; the hook is called for every
        # audited event, so the test comes first and costs a set lookup.
        if event in SPAWN_EVENTS:
            self.flush(sys.stdout, sys.stderr)
            self.order.before_spawn()


SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.exec"})
