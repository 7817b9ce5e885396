# Reading an execution's stdout and stderr pipes within the output cap, and knowing at any moment
# how much of each stream has been written (display.py places outputs between stream bytes so).

import fcntl
import os
import queue
import select
import sys
import threading
import time

# The ioctl that tells how many bytes wait in a pipe (termios.FIONREAD, without importing termios).
FIONREAD = 0x541B


class CaptureJob:
    """Reads one execution's stdout and stderr pipes, keeping at most `cap` bytes of both."""

    def __init__(self, out_fd, err_fd, cap):
        self.fds = {out_fd: 0, err_fd: 1}
        self.kept = [bytearray(), bytearray()]
        self.dropped = [0, 0]
        self.room = cap
        # Bytes read from each pipe (kept or dropped). Reading a chunk and counting it happen under
        # the lock, so `position` never sees a chunk in between.
        self.read = [0, 0]
        self.lock = threading.Lock()
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
                    with self.lock:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            poller.unregister(fd)
                            del self.fds[fd]
                            os.close(fd)
                            continue
                        self.read[stream] += len(chunk)
                    keep = min(len(chunk), self.room)
                    if keep:
                        self.kept[stream] += chunk[:keep]
                        self.room -= keep
                    self.dropped[stream] += len(chunk) - keep
        finally:
            with self.lock:
                for fd in self.fds:
                    os.close(fd)
                self.fds = {}
            self.done.set()

    def position(self):
        """[stdout, stderr]: the bytes written to each stream so far, read or still in its pipe
        (the caller flushes Python's buffers first)."""
        with self.lock:
            position = list(self.read)
            for fd, stream in self.fds.items():
                try:
                    pending = fcntl.ioctl(fd, FIONREAD, b"\0\0\0\0")
                    position[stream] += int.from_bytes(pending, sys.byteorder)
                except OSError:
                    pass
            return position


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
