# Reading an execution's stdout and stderr pipes within the output cap, and knowing at any moment
# how much of each stream has been written (display.py places outputs between stream bytes so).
#
# Within the cap: both streams together keep at most `cap` bytes, shared as the model's budget is
# (text.rs share_budget): both whole when they fit together; else a stream that fits in half the
# cap stays whole and the other gets the rest; else each gets half. A stream over its share keeps
# its head (half its share, the first bytes) and its tail (the rest: the latest bytes, in a ring),
# and counts the bytes between them, and the lines those span. A share only ever shrinks while
# the code writes (the other stream grows), so the head is cut back and the ring drops its oldest
# bytes; nothing dropped is ever needed again. At the end the head is cut back to its last whole
# line and the tail starts at a line's start (each cut at a character's start instead when its
# part has no line break), so neither shows a line cut partway; the host puts a line saying what
# was dropped where the cut is.
#
# Live output: when the host asks for it (it has somewhere to show it), the same thread sends what
# the code wrote as "output" frames while it runs: at most LIVE_PER_SECOND frames a second, each
# with at most LIVE_BYTES of each stream (the latest; how much was skipped is counted), and a last
# one before the job ends, so before the result. It costs nothing when not asked for, and little
# when asked: a slice of each chunk already read.
#
# The two streams' text in a frame is in the order the code wrote it: the frame's `order` gives
# its pieces, [[stream, bytes], ...] (0 stdout, 1 stderr), from the places where the code went
# from stderr back to stdout (streams.py, display.py) and the one not yet recorded (from the
# counts alone). At most LIVE_PIECES: text before them is skipped.
#
# A clear_output() changes the live view as it changes a notebook's (display.py tells this job,
# with the stream positions of the clear): the next frame says `"cleared": true` and carries only
# text written after the clear, and is sent even when no text came since. A clear_output(wait=True)
# takes effect when the next output arrives: text on either stream past the clear's position, or
# a display (display.py says so). Text is placed by its stream offset, not by when it was read, so
# text still in a pipe at the clear is cleared with the rest.

import base64
import fcntl
import os
import queue
import select
import sys
import threading
import time

from .processes import current_pid

# The ioctl that tells how many bytes wait in a pipe (termios.FIONREAD, without importing termios).
FIONREAD = 0x541B
# fcntl's F_SETPIPE_SZ (Linux; fcntl.F_SETPIPE_SZ from Python 3.10), and the size asked for each
# of an execution's pipes: the system's default maximum for an unprivileged process.
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20

LIVE_BYTES = 2048
LIVE_PER_SECOND = 4
LIVE_PIECES = 64


def shares(cap, a, b):
    """How `cap` bytes are shared between streams of `a` and `b` bytes (text.rs share_budget)."""
    half = cap // 2
    if a + b <= cap:
        return a, b
    if a <= half:
        return a, cap - a
    if b <= half:
        return cap - b, b
    return half, cap - half


def _utf8_start(data, end):
    """The largest offset <= `end` in `data` that does not split a UTF-8 sequence."""
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte < 0x80:
            return end
        if byte >= 0xC0:
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return end if back >= length else end - back
    return end


# The ring's dropped front is given back once it is this long and at least as long as what it
# keeps: each byte is copied at most once more, so the ring costs O(1) a byte.
RING_SLACK = 1 << 16


class Kept:
    """One stream's bytes within its share: whole while they fit, then a head and a ring."""

    def __init__(self):
        self.head = bytearray()
        # The tail: ring[start:]. Bytes before `start` are dropped, given back now and then.
        self.ring = bytearray()
        self.start = 0
        self.total = 0
        self.cut = False
        # Line breaks among the dropped bytes; whether the last one dropped before the tail was a
        # line break (the tail then starts a line).
        self.newlines = 0
        self.tail_starts_line = True

    def add(self, chunk):
        self.total += len(chunk)
        (self.ring if self.cut else self.head).extend(chunk)

    def tail_len(self):
        return len(self.ring) - self.start

    def dropped(self):
        return self.total - len(self.head) - self.tail_len()

    def fit(self, share):
        """Keeps at most `share` bytes: all of them, or half the share of the first and the rest of
        the latest."""
        if self.total <= share and not self.cut:
            return
        half = share // 2
        if not self.cut:
            self.cut = True
            self.ring = self.head[half:]
            self.start = 0
            del self.head[half:]
            self.tail_starts_line = half == 0 or self.head[-1] == 0x0A
        elif len(self.head) > half:
            self._drop_head(half)
        over = self.tail_len() - (share - half)
        if over > 0:
            self._drop_front(over)

    def _drop_head(self, end):
        self.newlines += self.head.count(b"\n", end)
        del self.head[end:]

    def _drop_front(self, n):
        end = self.start + n
        self.newlines += self.ring.count(b"\n", self.start, end)
        self.tail_starts_line = self.ring[end - 1] == 0x0A
        self.start = end
        if end >= RING_SLACK and end >= len(self.ring) - end:
            del self.ring[:end]
            self.start = 0

    def finish(self):
        """Cuts head and tail at line boundaries (at characters' starts when there are none)."""
        if not self.cut:
            return
        newline = self.head.rfind(b"\n")
        self._drop_head(newline + 1 if newline >= 0 else _utf8_start(self.head, len(self.head)))
        if not self.tail_starts_line:
            # The first line break before the tail's last byte: the last line is kept even when it
            # is the only one (cut at its start, where it has no break before it).
            newline = self.ring.find(b"\n", self.start, max(self.start, len(self.ring) - 1))
            if newline >= 0:
                self._drop_front(newline + 1 - self.start)
            else:
                skip = 0
                while skip < 3 and skip < self.tail_len() and 0x80 <= self.ring[self.start + skip] < 0xC0:
                    skip += 1
                if skip:
                    self._drop_front(skip)

    def lines(self):
        """The lines the dropped bytes span (a line cut partway counts once)."""
        if not self.dropped():
            return 0
        return self.newlines + (0 if self.tail_starts_line else 1)

    def kept(self):
        return bytes(self.head) + bytes(self.ring[self.start :])


class CaptureJob:
    """Reads one execution's stdout and stderr pipes, keeping at most `cap` bytes of both."""

    def __init__(self, out_fd, err_fd, cap, live=None):
        """`live`: a function that sends one frame, when the host wants live output."""
        self.live = live
        self.live_text = [bytearray(), bytearray()]
        self.live_skipped = [0, 0]
        self.live_sent_at = 0.0
        # Stream offsets: where live_text ends (bytes read through its last chunk), and before
        # which nothing is shown (the latest clear). A clear(wait=True) not yet in effect is kept
        # as its position; `live_cleared` says the next frame starts after a clear.
        self.live_end = [0, 0]
        self.live_from = [0, 0]
        self.live_wait = None
        self.live_cleared = False
        # () -> (the places recorded, the unsettled stdout position or None): see `live_order`.
        self.places = None
        # The code's thread (a clear) and this job's thread (text, frames) both change the above.
        self.live_lock = threading.Lock()
        # A child the code forked has no capture thread, and may have been forked with the lock
        # held: it never takes it (what it writes is not captured anyway).
        self.pid = current_pid()
        self.fds = {out_fd: 0, err_fd: 1}
        self.kept = [Kept(), Kept()]
        self.cap = cap
        # Bytes read from each pipe (kept or dropped). Reading a chunk and counting it happen under
        # the lock, so `position` never sees a chunk in between.
        self.read = [0, 0]
        self.lock = threading.Lock()
        self.finish_requested = threading.Event()
        self.done = threading.Event()
        # Who reads the pipes: the capture thread or the executing thread itself, once (`claim`).
        self.claimed = False
        self.claim_lock = threading.Lock()

    def claim(self):
        """True for the first caller only: that one runs the job."""
        with self.claim_lock:
            first = not self.claimed
            self.claimed = True
            return first

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
                        end = self.read[stream]
                    self._keep(stream, chunk)
                    if self.live is not None:
                        self._live_add(stream, chunk, end)
                if self.live is not None and time.monotonic() - self.live_sent_at >= 1 / LIVE_PER_SECOND:
                    self._live_send()
        finally:
            if self.live is not None:
                self._live_send(final=True)
            with self.lock:
                for fd in self.fds:
                    os.close(fd)
                self.fds = {}
            self.done.set()

    def _keep(self, stream, chunk):
        kept = self.kept
        kept[stream].add(chunk)
        for part, share in zip(kept, shares(self.cap, kept[0].total, kept[1].total)):
            part.fit(share)

    def result(self):
        """The result's fields for the streams, once the job is done: each one's kept bytes
        (base64), the bytes dropped between its head and tail, the lines they span, and where in
        the kept bytes the cut is."""
        fields = {}
        for part, name in zip(self.kept, ("stdout", "stderr")):
            part.finish()
            fields[name] = base64.b64encode(part.kept()).decode("ascii")
            fields[name + "_dropped"] = part.dropped()
            fields[name + "_dropped_lines"] = part.lines()
            fields[name + "_cut_at"] = len(part.head)
        return fields

    def _live_add(self, stream, chunk, end):
        """`chunk`, the stream's bytes up to offset `end`, into the next frame."""
        with self.live_lock:
            if self.live_wait is not None and end > self.live_wait[stream]:
                self._live_clear_at(self.live_wait)
            # Only the bytes after the latest clear (text that was in a pipe at the clear is not).
            chunk = chunk[max(0, len(chunk) - (end - self.live_from[stream])) :]
            self.live_end[stream] = end
            text = self.live_text[stream]
            text += chunk[-LIVE_BYTES:]
            over = len(text) - LIVE_BYTES
            if over > 0:
                del text[:over]
            self.live_skipped[stream] += max(0, len(chunk) - LIVE_BYTES) + max(0, over)

    def _live_clear_at(self, at):
        """What was written before stream positions `at` is no longer shown (lock held)."""
        self.live_wait = None
        self.live_cleared = True
        for stream in (0, 1):
            self.live_from[stream] = max(self.live_from[stream], at[stream])
            after = max(0, self.live_end[stream] - self.live_from[stream])
            text = self.live_text[stream]
            del text[: max(0, len(text) - after)]
            # What was skipped before the clear is cleared too, not skipped.
            self.live_skipped[stream] = min(self.live_skipped[stream], max(0, after - len(text)))

    def live_clear(self, at, wait):
        """The code cleared its output at stream positions `at` (display.py)."""
        if self.live is None or current_pid() != self.pid:
            return
        with self.live_lock:
            if wait:
                self.live_wait = list(at)
            else:
                self._live_clear_at(at)

    def live_shown(self):
        """The code displayed something: a clear(wait=True) waiting for it takes effect."""
        if self.live is None or current_pid() != self.pid:
            return
        with self.live_lock:
            if self.live_wait is not None:
                self._live_clear_at(self.live_wait)

    def _live_send(self, final=False):
        """Sends what came since the last frame, if anything did (a clear counts); never raises
        (the host may be gone; the result will say so). Text that may come after bytes still in
        the other pipe waits for a later frame, but in the last one (`final`)."""
        self.live_sent_at = time.monotonic()
        with self.live_lock:
            if not (self.live_text[0] or self.live_text[1] or self.live_cleared):
                return
            sizes = [len(self.live_text[0]), len(self.live_text[1])]
            pieces = None
            if self.places is not None:
                pieces, sizes = self._live_order(final)
            if not (sizes[0] or sizes[1] or self.live_cleared):
                return
            frame = {"type": "output"}
            if self.live_cleared:
                frame["cleared"] = True
                self.live_cleared = False
            if sizes[0] and sizes[1] and pieces is not None:
                frame["order"] = pieces
            for stream, name in enumerate(("stdout", "stderr")):
                text = self.live_text[stream]
                frame[name] = base64.b64encode(bytes(text[: sizes[stream]])).decode("ascii")
                frame[name + "_skipped"] = self.live_skipped[stream]
                del text[: sizes[stream]]
                self.live_skipped[stream] = 0
        try:
            self.live(frame)
        except Exception:
            self.live = None

    def _live_order(self, final):
        """The pieces of the text a frame may carry now, in the code's order (live lock held),
        and how much of each stream's text they cover; at most LIVE_PIECES, the text before them
        skipped. The place not yet recorded had all stderr written so far before it (a later
        write to stderr would have recorded it): stdout's text after it waits until that is read."""
        switches, unsettled = self.places()
        ends = list(self.live_end)
        starts = [ends[s] - len(self.live_text[s]) for s in (0, 1)]
        marks = list(switches[-MAX_MARKS:])
        if unsettled is not None:
            marks.append([unsettled, max(ends[1], self.position()[1])])
        pieces, upto = live_order(starts, ends, marks, hold=not final)
        sizes = [upto[s] - starts[s] for s in (0, 1)]
        for stream, size in pieces[: max(0, len(pieces) - LIVE_PIECES)]:
            del self.live_text[stream][:size]
            self.live_skipped[stream] += size
            sizes[stream] -= size
        return pieces[-LIVE_PIECES:], sizes

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


# The places a frame's order looks at: the latest ones (a frame's text is a few KiB at most).
MAX_MARKS = 4096


def live_order(starts, ends, marks, hold=False):
    """Each stream's text from `starts` to `ends` (stream positions) as pieces [stream, bytes] in
    the code's order: at each mark [stdout, stderr], the stdout text before it, then the stderr
    text before it, come before what follows (as the host places a result's text). Returns the
    pieces and the positions they reach: with `hold`, they stop at a mark whose text before it
    is not all read yet (what follows it waits for that)."""
    pieces = []
    at = list(starts)

    def take(stream, upto):
        upto = min(upto, ends[stream])
        if upto > at[stream]:
            if pieces and pieces[-1][0] == stream:
                pieces[-1][1] += upto - at[stream]
            else:
                pieces.append([stream, upto - at[stream]])
            at[stream] = upto

    for mark in marks:
        for stream in (0, 1):
            take(stream, mark[stream])
            if hold and mark[stream] > ends[stream]:
                return pieces, at
    take(0, ends[0])
    take(1, ends[1])
    return pieces, at


class Capture:
    """One thread for the runner's whole life: an execution never needs a new thread, so capture
    keeps working when the code has used up the sandbox's process limit.

    A short execution never wakes it: the pipes hold PIPE_BYTES each, and the executing thread
    reads them itself once the code is done (`finish`). Code that runs past the flushing thread's
    first tick (streams.py) has its pipes handed over (`hand_over`), so a writer never waits on a
    full pipe for longer than a tick; live output is handed over at once. Under gVisor each wake-up
    of another thread costs several system calls, each far dearer than on the host's kernel."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="capture", daemon=True).start()

    def _loop(self):
        while True:
            self.jobs.get().run()

    def start(self, out_fd, err_fd, cap, live=None):
        for fd in (out_fd, err_fd):
            try:
                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # a smaller pipe: a writer may wait up to a tick for the hand-over
        job = CaptureJob(out_fd, err_fd, cap, live)
        if live is not None:
            self.hand_over(job)
        return job

    def hand_over(self, job):
        """The capture thread reads `job`'s pipes from now on (unless its execution read them)."""
        if job.claim():
            self.jobs.put(job)

    @staticmethod
    def finish(job):
        """The code is done and its pipes' write ends closed: the rest is read, by this thread
        when nobody else reads them."""
        job.finish_requested.set()
        if job.claim():
            job.run()
        else:
            job.done.wait()
