# Reading an execution's stdout and stderr pipes within the output cap.

import os
import queue
import select
import threading
import time


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
