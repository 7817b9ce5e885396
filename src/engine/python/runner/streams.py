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

import io
import os
import sys
import threading
import time

FLUSH_INTERVAL = 0.2
IDLE_TICKS = 50
BUFFER_SIZE = 1 << 16


def _buffered(fd, like, line_buffering):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw, BUFFER_SIZE),
        encoding=getattr(like, "encoding", None) or "utf-8",
        errors=getattr(like, "errors", None) or "strict",
        line_buffering=line_buffering,
    )


class Streams:
    """The runner's stdout and stderr objects and the thread that flushes them while code runs.

    The flushing is a thread of its own, made once (like the capture thread): the capture thread
    cannot do it, because a flush waits for the stream's lock, which the code's thread holds while
    it writes into a full pipe that only the capture thread empties."""

    def __init__(self):
        self.stdout = _buffered(1, sys.stdout, line_buffering=False)
        self.stderr = _buffered(2, sys.stderr, line_buffering=True)
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

    def install(self):
        """Makes them the code's sys.stdout and sys.stderr again (the code may have replaced them),
        new ones in place of any the code closed (which would fail every later print)."""
        if self.stdout.closed:
            self.stdout = _buffered(1, self.stdout, line_buffering=False)
        if self.stderr.closed:
            self.stderr = _buffered(2, self.stderr, line_buffering=True)
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

    def start(self, tick=None):
        """Code starts running: the flushing thread calls `tick`, then flushes, every FLUSH_INTERVAL
        until `stop`. Nothing wakes this thread here unless it sleeps (IDLE_TICKS unused ones)."""
        self.tick = tick
        self.running = True
        if self.sleeping:
            self.wake.set()

    def stop(self):
        self.running = False
        self.tick = None

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
        self.tick = None

    def _audit(self, event, args):
        # Only the events that start another program on these pipes; the hook is called for every
        # audited event, so the test comes first and costs a set lookup.
        if event in SPAWN_EVENTS:
            self.flush(sys.stdout, sys.stderr)


SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.exec"})
