# Notebook-grade results: what IPython's display publisher and display hook send (shell.py), kept
# as the outputs of the running execution in production order, shaped like Jupyter's nbformat v4
# outputs: display_data and execute_result (with metadata and a display id), update_display_data,
# clear_output and error.
#
# The MIME bundles are IPython's (its DisplayFormatter runs the objects' own _repr_*_ methods while
# the execution does, so the timeout and interrupts apply to them as to the code). What they return
# is checked here: a value of the wrong type or too big costs only that MIME type, a metadata
# object that is not JSON or too big is left out; values and the whole list are bounded, and what
# goes over is dropped and counted. Outputs a later clear_output removes, and updates a later
# update of the same display replaces, are forgotten here already (the host would drop them), so a
# progress loop that clears or updates a display thousands of times stays within the bounds. A
# clear keeps the updates of displays no longer in this call's outputs (they change an earlier call's).
#
# Stream text is not copied here: each output records how many bytes of stdout and stderr had been
# written when it was produced (capture.py's positions), and the host cuts the streams it already
# has at those offsets. So outputs and prints interleave exactly, at no cost in the reply's size.

import base64
import json
import sys

from . import after_import

# Outputs other than streams an execution may return, the bytes of one MIME value, and of
# text/plain (cut, not dropped: the model still sees the head).
MAX_OUTPUTS = 200
# Places where stdout text follows stderr text an execution records (displays.rs
# MAX_STREAM_SWITCHES); past them, the order within each stretch between outputs is stdout's first.
MAX_STREAM_SWITCHES = 200
MAX_MIME_TYPES = 32
MAX_VALUE_BYTES = 4 << 20
MAX_PLAIN_CHARS = 100_000
MAX_TRACEBACK_LINES = 200
MAX_METADATA_ENTRIES = 32
MAX_METADATA_BYTES = 16 << 10
MAX_DISPLAY_ID_CHARS = 200

BINARY = ("image/png", "image/jpeg")
# Outputs that put a clear_output(wait=True) in effect in the live view (which shows streams
# only): what a notebook shows by itself (an update of a display, another clear, do not).
SETTLES_LIVE = ("display_data", "execute_result", "error")


def _checked(mime, value):
    """The value in nbformat's form (str; base64 for images; JSON text for JSON types, which the
    host parses), or None when it is of the wrong type or too big."""
    if value is None:
        return None
    if mime in BINARY:
        if isinstance(value, str):  # already base64, as IPython allows (the host checks it)
            return value if len(value) <= MAX_VALUE_BYTES * 4 // 3 else None
        if not isinstance(value, (bytes, bytearray)) or len(value) > MAX_VALUE_BYTES:
            return None
        return base64.b64encode(bytes(value)).decode("ascii")
    if mime == "application/json" or mime.endswith("+json"):
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                return None
            text = value
        else:
            try:
                text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=None)
            except (TypeError, ValueError, RecursionError):
                return None
    elif isinstance(value, str):
        text = value
        if mime == "text/plain" and len(text) > MAX_PLAIN_CHARS:
            return "%s\n... [%d more characters of the repr cut]" % (
                text[:MAX_PLAIN_CHARS],
                len(text) - MAX_PLAIN_CHARS,
            )
    elif isinstance(value, (bytes, bytearray)):
        # Binary data of another type: base64, as Jupyter sends it.
        if len(value) > MAX_VALUE_BYTES:
            return None
        return base64.b64encode(bytes(value)).decode("ascii")
    else:
        return None
    return text if len(text) <= MAX_VALUE_BYTES else None


def bundle(data):
    """A formatter's {mime: value} as [(mime, value)], checked, text/plain last when there is one
    (a raw bundle without it stays without it, as ipykernel sends it)."""
    pairs = []
    plain = None
    if not isinstance(data, dict):
        return [("text/plain", "")]
    for mime, value in list(data.items())[:MAX_MIME_TYPES]:
        if not (isinstance(mime, str) and 0 < len(mime) <= 100 and "/" in mime):
            continue
        checked = _checked(mime, value)
        if checked is None:
            continue
        if mime == "text/plain":
            plain = checked
        else:
            pairs.append((mime, checked))
    if plain is not None:
        pairs.append(("text/plain", plain))
    return pairs


def metadata_of(metadata):
    """The metadata as a JSON object within its bounds, or None."""
    if not isinstance(metadata, dict) or not metadata or len(metadata) > MAX_METADATA_ENTRIES:
        return None
    try:
        text = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        return None
    return json.loads(text)  # a copy the code can no longer change


def display_id_of(display_id):
    if isinstance(display_id, str) and 0 < len(display_id) <= MAX_DISPLAY_ID_CHARS:
        return display_id
    return None


def _flush_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class Outputs:
    """One execution's outputs other than streams, each with the stream positions it came at."""

    def __init__(self, position, budget, live=None):
        self.position = position  # () -> [stdout bytes, stderr bytes] written so far
        # The capture job when the host shows output live: told of clears and of what settles one.
        self.live = live
        self.room = budget
        self.items = []
        self.sizes = []
        self.dropped = 0
        # The stream positions after writes to stderr (streams.py), consecutive ones with no
        # stdout text between them merged: what the host needs to keep the streams' order.
        self.switches = []
        # The index of a clear_output(wait=True) not yet in effect (it is when the next output
        # comes, streams included).
        self.pending_clear = None

    def switched(self, at):
        """The code went from stderr back to stdout at `at` (streams.py): the stdout text past
        it comes after the stderr text before it."""
        switches = self.switches
        if switches and switches[-1][0] == at[0]:
            switches[-1] = at  # no stdout text since the last one
        elif len(switches) < MAX_STREAM_SWITCHES:
            switches.append(at)

    def _add(self, item, size):
        self._settle(item)
        if self.live is not None and item["output_type"] in SETTLES_LIVE:
            self.live.live_shown()
        if len(self.items) >= MAX_OUTPUTS or size > self.room:
            self.dropped += 1
            return False
        self.room -= size
        self.items.append(item)
        self.sizes.append(size)
        return True

    def _settle(self, item):
        """A pending clear is in effect once anything came after it (an output, or stream text:
        the position moved): what came before it is gone, here as in the host."""
        pending = self.pending_clear
        if pending is None:
            return
        if item["output_type"] in ("clear_output", "update_display_data") and (
            item["at"] == self.items[pending]["at"]
        ):
            # Neither is shown by itself: with no stream text since the clear, it still waits.
            return
        self.pending_clear = None
        self._forget_before(pending)

    def _forget_before(self, index):
        # An update of a display of an earlier call is not this call's output: a clear keeps it.
        kept = [i for i in range(index) if self.items[i]["output_type"] == "update_display_data"]
        self.room += sum(self.sizes[:index]) - sum(self.sizes[i] for i in kept)
        self.items[:index] = [self.items[i] for i in kept]
        self.sizes[:index] = [self.sizes[i] for i in kept]

    def _item(self, output_type, data, metadata):
        _flush_streams()
        item = {"output_type": output_type, "data": bundle(data)}
        metadata = metadata_of(metadata)
        if metadata is not None:
            item["metadata"] = metadata
        return item

    def _size(self, item):
        # Its size in the reply: JSON with every non-ASCII character escaped is an upper bound.
        return len(json.dumps(item)) + 40

    def display(self, data, metadata=None, display_id=None):
        item = self._item("display_data", data, metadata)
        display_id = display_id_of(display_id)
        if display_id is not None:
            item["display_id"] = display_id
        item["at"] = self.position()
        return self._add(item, self._size(item))

    def update(self, data, metadata=None, display_id=None):
        display_id = display_id_of(display_id)
        if display_id is None:
            return False  # an update of no display (IPython requires an id)
        item = self._item("update_display_data", data, metadata)
        item["display_id"] = display_id
        item["at"] = self.position()
        # Only the latest update of a display matters (each replaces the whole display).
        for index in range(len(self.items) - 1, -1, -1):
            earlier = self.items[index]
            if earlier["output_type"] == "update_display_data" and earlier.get("display_id") == display_id:
                self.room += self.sizes.pop(index)
                del self.items[index]
                if self.pending_clear is not None and self.pending_clear > index:
                    self.pending_clear -= 1
                break
        return self._add(item, self._size(item))

    def result(self, data, metadata, execution_count, display_id=None):
        item = self._item("execute_result", data, metadata)
        item["execution_count"] = execution_count
        display_id = display_id_of(display_id)
        if display_id is not None:
            item["display_id"] = display_id
        item["at"] = self.position()
        return self._add(item, self._size(item))

    def clear(self, wait):
        _flush_streams()
        item = {"output_type": "clear_output", "wait": wait, "at": self.position()}
        if self.live is not None:
            self.live.live_clear(item["at"], wait)
        if not wait:
            # What came before is gone, whatever comes next: the clear always has room.
            self.pending_clear = None
            self._forget_before(len(self.items))
        elif len(self.items) >= MAX_OUTPUTS:
            # Full: the oldest output gives its place to the waiting clear.
            self._forget_before(1)
        if not self._add(item, 60):
            return
        if wait:
            self.pending_clear = len(self.items) - 1
        else:
            self.pending_clear = None
            self._forget_before(len(self.items) - 1)

    def error(self, ename, evalue, lines, at, through):
        """IPython's structured traceback: its entries (a frame each, possibly several lines)."""
        if len(lines) > MAX_TRACEBACK_LINES:
            half = MAX_TRACEBACK_LINES // 2
            lines = lines[:half] + ["... [%d lines cut]" % (len(lines) - 2 * half)] + lines[-half:]
        lines = [line[:2000] for line in lines]
        item = {
            "output_type": "error",
            "ename": ename[:200],
            "evalue": evalue[:1000],
            "traceback": lines,
            "at": at,
            "through": through,
        }
        self._add(item, len(json.dumps(lines)) + len(json.dumps(item["evalue"])) + 200)


def _bound_pandas(pandas):
    # Head and tail of long frames, the shape stated when they are cut (pandas' own default, as in
    # Jupyter): a table a model can read.
    for option, value in (
        ("display.max_rows", 20),
        ("display.min_rows", 10),
        ("display.max_columns", 20),
        ("display.max_colwidth", 50),
        ("display.show_dimensions", "truncate"),
        # One table, a row to a line: wrapped column blocks are hard for a model to line up.
        ("display.expand_frame_repr", False),
    ):
        pandas.set_option(option, value)


def install(shell):
    """Bounded pandas display (matplotlib's figures are its inline backend's: figures.py)."""
    after_import.on_import("pandas", _bound_pandas)
