# The runner protocol's frames: a 4-byte big-endian length, then a UTF-8 JSON object (a JSON
# text never holds a raw newline: after one, a "piece" reply carries raw bytes; after a
# restore_write request, one frame of raw bytes follows).
#
# Requests:  {"op": "exec", "id": N, "code": str, "max_output": bytes}
#            {"op": "shell", "id": N, "command": str, "max_output": bytes}
#            {"op": "list", "id": N, "path": str}          (a directory of the workspace)
#            {"op": "paths", "id": N, "add": [dir], "remove": [dir]}   (installed dependencies)
#            {"op": "read", "id": N, "path": str, "path_bytes"?: b64, "offset": n, "length": n}
#            {"op": "write", "id": N, "path": str, "data": b64, "offset": n}  (offset 0 creates)
#            {"op": "snapshot", "id": N, "max_bytes": n}    (workspace and variables into the
#                runner's private snapshot file; snapshot.py)
#            {"op": "snapshot_read", "id": N, "offset": n, "length": n}   (a piece of that file)
#            {"op": "restore_write", "id": N, "offset": n}, then one frame of raw bytes: a piece of
#                a snapshot to restore, into the runner's private upload file (offset 0 starts it
#                anew); raw, not base64 in JSON, whose parsing and decoding cost more than the rest
#                of a restore
#            {"op": "restore", "id": N}                     (unpacks the upload, then removes it)
#            {"op": "snapshot_discard", "id": N}            (removes both private files)
#            exec and shell may carry "live": true: the host wants the code's output as it comes.
# Replies:   {"type": "ready", ...} once per runner, then per request one {"type": "result", "id":
#            N, ...} (exec, shell), {"type": "listing", "id": N, ...} (list) or {"type": "paths",
#            "id": N, "missing": [dir]} (paths: directories that do not exist are not added),
#            {"type": "file", "id": N, "data": b64, "size": n, "inode": "dev:ino"} or with "error"
#            (read), {"type": "written", "id": N, "size": n} or with "error" (write).
#            snapshot: {"type": "snapshot", "id": N, "size": n, "files": n, "file_bytes": n, "saved":
#            [name], "unsaved": [{"name", "reason"}], "modules": [name]} or with "error";
#            snapshot_read: {"type": "piece", "id": N, "size": n}, a newline, then the piece's raw
#            bytes, or without them, {"type": "piece", "id": N, "error": str}; restore_write: a
#            "written" reply;
#            restore: {"type": "restored", "id": N, "files": n, "file_bytes": n, "variables": [name],
#            "failed": [{"name", "reason"}], "modules": [name]} or with "error"; snapshot_discard:
#            {"type": "discarded", "id": N}. "modules" are the names bound to modules.
#            During an exec or shell, the runner may send {"type": "pip", "id": N, "line": str}
#            (pip.py); the host answers on stdin with {"type": "pip_reply", "id": N, "ok": bool,
#            "text": str, "add": [dir], "remove": [dir]}.
#            Before the result of a live exec or shell, any number of {"type": "output", "id": N,
#            "stdout": b64, "stderr": b64, "stdout_skipped": n, "stderr_skipped": n}: what the code
#            wrote since the last one (the latest bytes of it; the skipped ones counted).
# The supervisor writes one frame per runner death:
#            {"type": "exited", "status": int (negative: killed by that signal), "oom": bool|null,
#             "requested": bool}

import json
import os
import struct
import threading


def valid_text(obj):
    """`obj` with every string made valid UTF-8, so a frame always parses on the host. Text Python
    decoded with surrogateescape (file names, messages quoting them) shows its undecodable bytes as
    `\\xNN`; other lone surrogates show as `\\udXXX`."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
            return obj
        except UnicodeEncodeError:
            pass
        try:
            return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {valid_text(k): valid_text(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [valid_text(v) for v in obj]
    return obj


def write_frame(fd, obj):
    """Writes `obj` as one frame; `obj` may be a body already encoded (bytes: see
    snapshot.snapshot_read)."""
    if isinstance(obj, bytes):
        body = obj
    else:
        try:
            # Lone surrogates cannot be encoded: only then is the message walked and mended.
            body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            body = json.dumps(valid_text(obj), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# The runner's ends of the protocol, once take_over_streams has moved them (the supervisor writes
# to fd 1 directly and reads nothing).
PROTO_IN = None
PROTO_OUT = None


def take_over_streams():
    """Moves the protocol streams to private descriptors that executed code does not inherit
    (os.dup makes them non-inheritable), and which a forked child closes at once, so it can
    neither steal requests nor write replies."""
    global PROTO_IN, PROTO_OUT
    PROTO_IN = os.dup(0)
    PROTO_OUT = os.dup(1)
    os.register_at_fork(after_in_child=_close_protocol_in_child)


def _close_protocol_in_child():
    for fd in (PROTO_IN, PROTO_OUT):
        try:
            os.close(fd)
        except OSError:
            pass


def read_exact(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(PROTO_IN, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def read_raw_frame():
    """The next frame's body as bytes, or None once the host has closed the stream."""
    header = read_exact(4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    return read_exact(length)


def read_frame():
    """The next request, or None once the host has closed the stream."""
    body = read_raw_frame()
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


# The capture thread sends live output frames while the main thread may send a result: one frame
# at a time. (A forked child never sends: its protocol descriptors are closed.)
SEND_LOCK = threading.Lock()


def send_frame(obj):
    with SEND_LOCK:
        write_frame(PROTO_OUT, obj)
