# Reading an execution's stdout and stderr pipes within the output cap, and knowing at any moment
# how much of each stream has been written (display.py places outputs between stream bytes so).
#
# Live output: when the host asks for it (it has somewhere to show it), the same thread sends what
# the code wrote as "output" frames while it runs: at most LIVE_PER_SECOND frames a second, each
# with at most LIVE_BYTES of each stream (the latest; how much was skipped is counted), and a last
# one before the job ends, so before the result. It costs nothing when not asked for, and little
# when asked: a slice of each chunk already read.

import base64
import fcntl
import os
import queue
import select
import sys
import threading
import time

# The ioctl that tells how many bytes wait in a pipe (termios.FIONREAD, without importing termios).
FIONREAD = 0x541B

LIVE_BYTES = 2048
LIVE_PER_SECOND = 4


class CaptureJob:
    """Reads one execution's stdout and stderr pipes, keeping at most `cap` bytes of both."""

    def __init__(self, out_fd, err_fd, cap, live=None):
        """`live`: a function that sends one frame, when the host wants live output."""
        self.live = live
        self.live_text = [bytearray(), bytearray()]
        self.live_skipped = [0, 0]
        self.live_sent_at = 0.0
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
                    if self.live is not None:
                        self._live_add(stream, chunk)
                if self.live is not None and time.monotonic() - self.live_sent_at >= 1 / LIVE_PER_SECOND:
                    self._live_send()
        finally:
            if self.live is not None:
                self._live_send()
            with self.lock:
                for fd in self.fds:
                    os.close(fd)
                self.fds = {}
            self.done.set()

    def _live_add(self, stream, chunk):
        text = self.live_text[stream]
        text += chunk[-LIVE_BYTES:]
        over = len(text) - LIVE_BYTES
        if over > 0:
            del text[:over]
        self.live_skipped[stream] += max(0, len(chunk) - LIVE_BYTES) + max(0, over)

    def _live_send(self):
        """Sends what came since the last frame, if anything did; never raises (the host may be
        gone; the result will say so)."""
        self.live_sent_at = time.monotonic()
        if not (self.live_text[0] or self.live_text[1]):
            return
        frame = {"type": "output"}
        for stream, name in enumerate(("stdout", "stderr")):
            frame[name] = base64.b64encode(bytes(self.live_text[stream])).decode("ascii")
            frame[name + "_skipped"] = self.live_skipped[stream]
            self.live_text[stream] = bytearray()
            self.live_skipped[stream] = 0
        try:
            self.live(frame)
        except Exception:
            self.live = None

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

    def start(self, out_fd, err_fd, cap, live=None):
        job = CaptureJob(out_fd, err_fd, cap, live)
        self.jobs.put(job)
        return job
