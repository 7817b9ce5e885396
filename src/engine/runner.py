# The sandbox runner: the one long-lived Python process in a sandbox that executes code for the host.
#
# The host starts the container with a tiny bootstrap (see protocol.rs) that reads this file from
# stdin and executes it. From then on stdin carries requests and stdout carries replies, each a frame:
# a 4-byte big-endian length, then a UTF-8 JSON object. Nothing else is ever written to the protocol
# stream: the code's own stdout/stderr (fds 1 and 2) are pipes read by a capture thread, and between
# executions they point at /dev/null.
#
# Two processes run this file. The bootstrap is the container's pid 1: it becomes the supervisor
# (below), which forks the runner proper and starts a new one whenever the runner dies (killed by the
# kernel for memory, by the code itself, or on the host's request after an interrupt went
# unanswered). The container, and so the workspace, outlive the runner: a session loses its
# variables, never its files. The supervisor runs no user code and reads nothing from the host; it
# only writes one frame per runner death:
#            {"type": "exited", "status": int (negative: killed by that signal), "oom": bool|null,
#             "requested": bool}
#
# Requests:  {"op": "exec", "id": N, "code": str, "max_output": bytes}
#            {"op": "shell", "id": N, "command": str, "max_output": bytes}
#            {"op": "list", "id": N, "path": str}          (a directory of the workspace)
#            {"op": "paths", "id": N, "add": [dir], "remove": [dir]}   (installed dependencies)
#            {"op": "read", "id": N, "path": str, "path_bytes"?: b64, "offset": n, "length": n}
#            {"op": "write", "id": N, "path": str, "data": b64, "offset": n}  (offset 0 creates)
# Replies:   {"type": "ready", ...} once per runner, then per request one {"type": "result", "id":
#            N, ...} (exec, shell), {"type": "listing", "id": N, ...} (list) or {"type": "paths",
#            "id": N, "missing": [dir]} (paths: directories that do not exist are not added),
#            {"type": "file", "id": N, "data": b64, "size": n, "inode": "dev:ino"} or with "error"
#            (read), {"type": "written", "id": N, "size": n} or with "error" (write).
#
# Files leave the sandbox only through `read`, which runs as the sandbox's user and never follows a
# link: what the code could not read, the host never gets. A path that is not UTF-8 travels as
# its text (undecodable bytes replaced) plus "path_bytes", its exact bytes.
#
# After each execution the result names the workspace files the execution created or changed
# (found by comparing two walks that never follow links), and carries the matplotlib figures it
# showed or left open, as PNG. The host copies the files out itself and checks everything again.
#
# The code runs in the runner process, in one globals namespace that lives as long as the runner,
# so a session keeps its variables between executions. The host interrupts an execution with SIGINT
# to pid 1, which passes it on (KeyboardInterrupt in the code); when that does not work it sends
# SIGUSR1, on which the supervisor kills every other process. SIGTERM (`docker stop`, an engine
# shutting down) ends the sandbox. The supervisor obeys only signals sent from outside the sandbox
# (the host's): the code can signal pid 1 too, and is ignored. The host treats every byte either
# process sends as untrusted: the code can reach the runner's memory.

import json
import os
import select
import signal
import struct
import sys
import time

# Tests only: the fake backend (src/engine/testing) runs this file as a plain host process and
# passes `--host-test-workspace=DIR` after the bootstrap (a sandbox's command never has it): DIR is
# then the workspace, and kill_others does nothing, since kill(-1) would reach the host's processes.
HOST_TEST_WORKSPACE = next((a.partition("=")[2] for a in sys.argv[1:] if a.startswith("--host-test-workspace=")), None)


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
    try:
        # Lone surrogates cannot be encoded: only then is the message walked and mended.
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        body = json.dumps(valid_text(obj), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def oom_kill_count():
    """How many processes the kernel has killed in this sandbox's memory cgroup (v1 or v2), or
    None where the runtime does not show it."""
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kill_others(seconds, gone):
    """Kills every process but pid 1 and the caller (what kill(-1) spares) and reaps the caller's
    children, in rounds, until gone(children_left) says so. Forks are blocked while the kernel
    walks the task list, so one round stops a fork bomb; more rounds cover stragglers."""
    if HOST_TEST_WORKSPACE is not None:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        children = True
        try:
            while os.waitpid(-1, os.WNOHANG) != (0, 0):
                pass
        except ChildProcessError:
            children = False
        try:
            if gone(children):
                return
        except OSError:
            return
        time.sleep(0.01)


def host_hung_up():
    """The host closed the protocol: nobody will ever talk to a new runner."""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    return any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in poller.poll(0))


def supervise():
    """Pid 1: returns only in a freshly forked runner; never returns in the supervisor itself.

    The signals it acts on are blocked and taken with sigwaitinfo, which says who sent each: the
    host's (`docker kill`, an engine stopping the container) come from outside the sandbox's pid
    namespace, with sender pid 0. The code runs as the same user and can signal pid 1 too; its
    signals carry its pid and are ignored, so the code cannot end its sandbox, or pass for the
    host asking for an interrupt."""
    watched = {signal.SIGINT, signal.SIGUSR1, signal.SIGTERM, signal.SIGCHLD}
    for signum in watched:
        # A handler, so the kernel delivers these to pid 1 at all; blocked, so sigwaitinfo takes them.
        signal.signal(signum, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    requested = False
    while True:
        oom_before = oom_kill_count()
        try:
            pid = os.fork()
        except OSError:  # the process limit, briefly: every other process is being killed
            time.sleep(0.05)
            continue
        if pid == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
            return
        started = time.monotonic()
        status = None
        while status is None:
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGCHLD:
                # Reaps the runner, and the orphans the code leaves behind.
                try:
                    while True:
                        done, waited = os.waitpid(-1, os.WNOHANG)
                        if done == 0:
                            break
                        if done == pid:
                            status = waited
                except ChildProcessError:
                    status = 0 if status is None else status
                continue
            if info.si_pid != 0:
                continue  # sent from inside the sandbox: the code's, not the host's
            if info.si_signo == signal.SIGINT:
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
            elif info.si_signo == signal.SIGUSR1:
                requested = True
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
            elif info.si_signo == signal.SIGTERM:
                # `docker stop` or an engine shutting down: end the sandbox, no new runner.
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
                os._exit(128 + signal.SIGTERM)
        # Every process of the sandbox descends from pid 1: none is left once it has no children.
        kill_others(5.0, lambda children: not children)
        if host_hung_up():
            os._exit(0)
        oom_after = oom_kill_count()
        oom = None if oom_before is None or oom_after is None else oom_after > oom_before
        write_frame(
            1,
            {
                "type": "exited",
                "status": os.waitstatus_to_exitcode(status),
                "oom": oom,
                "requested": requested,
            },
        )
        requested = False
        if time.monotonic() - started < 1.0:
            time.sleep(0.2)  # a runner that cannot start must not spin


if os.getpid() == 1:
    supervise()

# From here on: the runner.

import base64
import errno
import importlib
import importlib.abc
import io
import linecache
import queue
import stat
import subprocess
import threading
import traceback
import warnings

# Syscalls that signal, trace or reach into another process, by architecture: number → the
# argument that names the target (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
# pidfd_open, process_vm_readv, process_vm_writev: the first; ptrace: the second).
_TARGETING_SYSCALLS = {
    "x86_64": (0xC000003E, {62: 0, 200: 0, 234: 0, 129: 0, 297: 0, 434: 0, 310: 0, 311: 0, 101: 1}),
    "aarch64": (0xC00000B7, {129: 0, 130: 0, 131: 0, 138: 0, 240: 0, 434: 0, 270: 0, 271: 0, 117: 1}),
}


def targeting_init_filter(machine):
    """A seccomp BPF program (a list of (code, jt, jf, k)) that fails with EPERM every syscall of
    _TARGETING_SYSCALLS whose target is pid 1, and every syscall of another ABI (i386 through int
    0x80, x32), which would pass under other numbers; it allows everything else. None for an
    unknown architecture."""
    if machine not in _TARGETING_SYSCALLS:
        return None
    audit_arch, syscalls = _TARGETING_SYSCALLS[machine]
    LOAD, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, RETURN = 0x20, 0x15, 0x35, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | errno.EPERM
    arguments = sorted(set(syscalls.values()))
    # Layout: 0 load arch, 1 check arch, 2 load nr, 3 check for x32's bit, 4.. one test per
    # syscall, then "allow", then per argument a load and a test, then "deny" and "allow".
    first_argument_check = 4 + len(syscalls) + 1
    deny_at = first_argument_check + 2 * len(arguments)
    allow_at = deny_at + 1
    program = [
        (LOAD, 0, 0, 4),
        (JUMP_IF_EQUAL, 0, deny_at - 2, audit_arch),
        (LOAD, 0, 0, 0),
        (JUMP_IF_AT_LEAST, deny_at - 4, 0, 0x40000000),
    ]
    for number, argument in sorted(syscalls.items()):
        check_at = first_argument_check + 2 * arguments.index(argument)
        program.append((JUMP_IF_EQUAL, check_at - len(program) - 1, 0, number))
    program.append((RETURN, 0, 0, ALLOW))
    for argument in arguments:
        program.append((LOAD, 0, 0, 16 + 8 * argument))  # its low 32 bits: a pid is an int
        here = len(program)
        program.append((JUMP_IF_EQUAL, deny_at - here - 1, allow_at - here - 1, 1))
    program += [(RETURN, 0, 0, DENY), (RETURN, 0, 0, ALLOW)]
    return program


def forbid_targeting_init():
    """Installs targeting_init_filter in this process, inherited by everything the code starts:
    nothing but the host can then signal, trace or open pid 1. The kernel already drops SIGKILL and
    SIGSTOP sent to an init from inside, but gVisor does not; this holds under both. Returns
    whether it is in force."""
    import ctypes

    program = targeting_init_filter(os.uname().machine)
    if program is None:
        return False

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    instructions = (SockFilter * len(program))(*[SockFilter(*i) for i in program])
    fprog = SockFprog(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0



INIT_PROTECTED = forbid_targeting_init()
RUNNER_FILENAME = "<sandbox-runner>"
RUNNER_PID = os.getpid()

# The protocol streams move to private descriptors that executed code does not inherit (os.dup makes
# them non-inheritable), and which a forked child closes at once, so it can neither steal requests
# nor write replies.
PROTO_IN = os.dup(0)
PROTO_OUT = os.dup(1)
DEVNULL = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(DEVNULL, _fd)


def _close_protocol_in_child():
    for fd in (PROTO_IN, PROTO_OUT):
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_close_protocol_in_child)


def read_exact(n):
    data = bytearray()
    while len(data) < n:
        chunk = os.read(PROTO_IN, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def read_frame():
    header = read_exact(4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    body = read_exact(length)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def send_frame(obj):
    write_frame(PROTO_OUT, obj)


WORKSPACE = HOST_TEST_WORKSPACE or "/workspace"
# Entries walked per snapshot; past it, changes are reported as incomplete.
TRACK_LIMIT = 10000
# Changed entries named in one result, and the bytes of their paths: the rest are only counted.
REPORT_LIMIT = 1000
REPORT_PATH_BYTES = 256 << 10
# The largest piece of a file one read or write request carries.
CHUNK_LIMIT = 1 << 20
MAX_FIGURES = 8
MAX_FIGURES_BYTES = 16 << 20


def kind_of(mode):
    """What an lstat mode is, in the words the host uses."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


def snapshot():
    """The workspace's entries, without following links: path -> (kind, size, mtime, inode).
    Directories are opened one component at a time like open_in_workspace, so a directory the
    code swaps for a link while it is walked is skipped, never listed from where the link points."""
    entries = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            if rel:
                parts = os.fsencode(rel).split(b"/")
                fd = open_in_workspace(parts, os.O_RDONLY | os.O_DIRECTORY)
            else:
                fd = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    if len(entries) >= TRACK_LIMIT:
                        return entries, True
                    path = rel + "/" + entry.name if rel else entry.name
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(path)
                        continue
                    entries[path] = (kind_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            pass
        finally:
            os.close(fd)
    return entries, False


def path_fields(path, key="path"):
    """A workspace path for the host: its text, plus its raw bytes (base64) when they are not
    UTF-8, so the host can name it back exactly."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
        return {key: path}
    except UnicodeDecodeError:
        return {key: raw.decode("utf-8", "replace"), key + "_bytes": base64.b64encode(raw).decode("ascii")}


def changes(before, after):
    """The entries that are new or changed, shallowest first (when there are more than a result
    names, the top of the workspace is what a person looks at first)."""
    changed = []
    for path in sorted(after, key=lambda p: (p.count("/"), p)):
        if before.get(path) != after[path]:
            kind, size = after[path][0], after[path][1]
            entry = path_fields(path)
            entry.update({"kind": kind, "size": size})
            changed.append(entry)
    return changed


def bounded(changed):
    """At most REPORT_LIMIT entries (and REPORT_PATH_BYTES of paths), and how many were left out."""
    kept = []
    path_bytes = 0
    for entry in changed:
        size_of_path = len(entry["path"].encode("utf-8", "surrogateescape"))
        if len(kept) >= REPORT_LIMIT or path_bytes + size_of_path > REPORT_PATH_BYTES:
            break
        path_bytes += size_of_path
        kept.append(entry)
    return kept, len(changed) - len(kept)


def requested_path(request):
    """The workspace-relative path a request names, as bytes (its raw form when it has one)."""
    raw = request.get("path_bytes")
    path = base64.b64decode(raw) if raw else str(request.get("path", "")).encode("utf-8")
    parts = path.split(b"/")
    if not path or any(part in (b"", b".", b"..") for part in parts) or b"\0" in path:
        raise ValueError("not a relative path inside /workspace")
    return parts


def open_beneath(directory, name, flags, mode=0o644):
    """Opens `name` in the directory open as `directory`, refusing a link: O_NOFOLLOW, and the
    opened file must be the one lstat saw just before (some runtimes follow a link to a directory
    despite O_NOFOLLOW, and the code can swap a name for a link between any two steps)."""
    try:
        before = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        before = None
    if before is not None and stat.S_ISLNK(before.st_mode):
        raise OSError(errno.ELOOP, "a symbolic link")
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NOCTTY, mode, dir_fd=directory)
    try:
        after = os.fstat(fd)
        if before is not None and (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise OSError(errno.ELOOP, "replaced by a link while being opened")
        if before is None:
            # Created just now: it must be the entry the name holds, not something a link reached.
            now = os.stat(name, dir_fd=directory, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (after.st_dev, after.st_ino):
                raise OSError(errno.ELOOP, "replaced by a link while being created")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_in_workspace(parts, flags, mode=0o644, make_parents=False):
    """Opens /workspace/<parts> without following any link on the way: each directory is opened
    relative to the one before, and checked to be what its name held (see open_beneath), so a link
    swapped in anywhere fails instead of leading out. Runs as the sandbox's user: what it cannot
    open, it cannot hand out."""
    directory = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            if make_parents:
                try:
                    os.mkdir(part, 0o755, dir_fd=directory)
                except FileExistsError:
                    pass
            inner = open_beneath(directory, part, os.O_RDONLY | os.O_DIRECTORY)
            os.close(directory)
            directory = inner
        return open_beneath(directory, parts[-1], flags, mode)
    finally:
        os.close(directory)


def describe_error(e):
    if isinstance(e, OSError) and e.errno == errno.ELOOP:
        return "a symbolic link, not a regular file"
    if isinstance(e, OSError) and e.errno == errno.ENOTDIR:
        return "a folder on the way is not a directory (or is a link)"
    if isinstance(e, OSError) and e.errno == errno.EISDIR:
        return "a directory, not a regular file"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


def read_file(request):
    """One piece of a workspace file: at most `length` bytes from `offset`, read as the sandbox's
    user through a descriptor that never followed a link. Only regular files are read."""
    reply = {"type": "file", "id": request.get("id")}
    try:
        parts = requested_path(request)
        fd = open_in_workspace(parts, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a special file (FIFO, socket or device)"
                raise ValueError(kind + ", not a regular file")
            length = max(0, min(int(request.get("length", 0)), CHUNK_LIMIT))
            data = os.pread(fd, length, max(0, int(request.get("offset", 0))))
        finally:
            os.close(fd)
        reply.update({
            "data": base64.b64encode(data).decode("ascii"),
            "size": st.st_size,
            "inode": "%d:%d" % (st.st_dev, st.st_ino),
        })
    except (OSError, ValueError) as e:
        reply["error"] = describe_error(e)
    return reply


def write_file(request):
    """One piece of a file the host writes into the workspace, as the sandbox's user: the first
    piece creates (or truncates) it, with its parent directories; never through a link, never over
    a directory."""
    reply = {"type": "written", "id": request.get("id")}
    try:
        parts = requested_path(request)
        data = base64.b64decode(request.get("data", ""))
        offset = max(0, int(request.get("offset", 0)))
        if offset == 0:
            fd = open_in_workspace(parts, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True)
        else:
            fd = open_in_workspace(parts, os.O_WRONLY)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("a special file, not a regular file")
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], offset + written)
        finally:
            os.close(fd)
        reply["size"] = offset + written
    except (OSError, ValueError) as e:
        reply["error"] = describe_error(e)
    return reply


def list_directory(rel):
    """One directory of the workspace, for sandbox_list_files; never follows links."""
    path = os.path.normpath(os.path.join(WORKSPACE, rel))
    if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        return {"error": "the path is outside /workspace"}
    relative = path[len(WORKSPACE) + 1:]
    entries = []
    truncated = False
    try:
        if relative:
            fd = open_in_workspace(os.fsencode(relative).split(b"/"), os.O_RDONLY | os.O_DIRECTORY)
        else:
            fd = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            return {"error": "%s is not a directory" % (rel or ".")}
        return {"error": "%s: %s" % (rel or ".", describe_error(e))}
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if len(entries) >= 1000:
                    truncated = True
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                item = path_fields(entry.name, "name")
                item.update({"kind": kind_of(st.st_mode), "size": st.st_size})
                entries.append(item)
    except OSError as e:
        return {"error": "%s: %s" % (rel or ".", e.strerror)}
    finally:
        os.close(fd)
    entries.sort(key=lambda e: e["name"])
    return {"entries": entries, "truncated": truncated}


def update_paths(request):
    """Puts installed dependency sets first on sys.path (and takes replaced ones off)."""
    for path in request.get("remove") or []:
        while path in sys.path:
            sys.path.remove(path)
    missing = []
    for path in reversed(request.get("add") or []):
        if not os.path.isdir(path):
            missing.append(path)
        elif path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()
    return {"type": "paths", "id": request.get("id"), "missing": missing}


class Figures:
    """Matplotlib figures an execution showed (plt.show) or left open, as PNG bytes."""

    def __init__(self):
        self.captured = []
        self.size = 0

    def capture(self, pyplot, skip_saved=False):
        try:
            for number in pyplot.get_fignums():
                if len(self.captured) >= MAX_FIGURES:
                    break
                figure = pyplot.figure(number)
                if skip_saved and getattr(figure, "_sandbox_saved", False):
                    continue  # already written to a file, which comes back as such
                buffer = io.BytesIO()
                figure.savefig(buffer, format="png")
                data = buffer.getvalue()
                if self.size + len(data) <= MAX_FIGURES_BYTES:
                    self.captured.append(data)
                    self.size += len(data)
            pyplot.close("all")
        except Exception:
            pass

    def take(self):
        captured, self.captured, self.size = self.captured, [], 0
        return captured


FIGURES = Figures()


class PyplotHook(importlib.abc.MetaPathFinder):
    """When the code imports matplotlib.pyplot, make plt.show() hand the figures to the host
    (the Agg backend cannot show anything). Nothing happens when matplotlib is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                original = spec.loader.exec_module

                def exec_module(module, original=original):
                    original(module)
                    module.show = lambda *args, **kwargs: FIGURES.capture(module)
                    # Remember which figures the code saved itself (they are not sent twice).
                    figure_class = sys.modules["matplotlib.figure"].Figure
                    savefig = figure_class.savefig

                    def marking_savefig(self, *args, **kwargs):
                        self._sandbox_saved = True
                        return savefig(self, *args, **kwargs)

                    figure_class.savefig = marking_savefig

                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, PyplotHook())
warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")


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


class State:
    executing = False
    counter = 0


STATE = State()
CAPTURE = Capture()
NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}
ORIGINAL_STREAMS = (sys.stdin, sys.stdout, sys.stderr)


def on_sigint(signum, frame):
    # Only the executing code is interrupted; the runner itself ignores a late signal.
    if STATE.executing and os.getpid() == RUNNER_PID:
        raise KeyboardInterrupt


def without_runner_frames(te, seen):
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    kept = [frame for frame in te.stack if frame.filename != RUNNER_FILENAME]
    te.stack = traceback.StackSummary.from_list(kept)
    without_runner_frames(te.__cause__, seen)
    without_runner_frames(te.__context__, seen)


def user_traceback(exc):
    """The exception's traceback as Python would print it, without the runner's own frames."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    without_runner_frames(te, set())
    return "".join(te.format())


def other_processes():
    """Pids in this sandbox other than init (1) and the runner, zombies included."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, RUNNER_PID):
            pids.append(int(name))
    return pids


def kill_strays():
    """After an interrupt: stop every other process the code started, and wait, briefly, until
    they are gone (reaped by pid 1 or by us), so the next execution starts clean. The budget stays
    under the host's grace (INTERRUPT_GRACE in sandbox.rs), so the answer comes in time."""
    kill_others(2.0, lambda children: not other_processes())


def run_code(code):
    STATE.counter += 1
    filename = "<run %d>" % STATE.counter
    # Register the source so tracebacks can show the failing lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exec(compile(code, filename, "exec"), NAMESPACE)


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


def execute(request):
    op = request.get("op")
    cap = int(request.get("max_output", 1 << 20))
    before, _ = snapshot()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job = CAPTURE.start(out_r, err_r, cap)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    exit_code = 0
    interrupted = False
    error = None
    started = time.monotonic()
    try:
        STATE.executing = True
        try:
            if op == "shell":
                exit_code = run_shell(request["command"])
            else:
                run_code(request["code"])
        finally:
            STATE.executing = False
    except SystemExit as exc:
        exit_code = exit_status_of(exc)
    except KeyboardInterrupt as exc:
        interrupted = True
        exit_code = 130
        error = {"type": "KeyboardInterrupt", "message": "interrupted"}
        sys.stderr.write(user_traceback(exc))
    except BaseException as exc:  # the code's own failure, reported like Python would
        exit_code = 1
        try:
            message = str(exc)[:1000]
        except Exception:  # a __str__ that raises
            message = "(the exception's message could not be read)"
        error = {"type": type(exc).__name__, "message": message}
        sys.stderr.write(user_traceback(exc))
    duration = time.monotonic() - started
    if os.getpid() != RUNNER_PID:
        # A child the code forked has finished the code: it must not go on as a runner.
        os._exit(exit_code & 0xFF)
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and not interrupted:
        FIGURES.capture(pyplot, skip_saved=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    sys.stdin, sys.stdout, sys.stderr = ORIGINAL_STREAMS
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.dup2(DEVNULL, 1)
    os.dup2(DEVNULL, 2)
    signal.signal(signal.SIGINT, on_sigint)
    if interrupted:
        kill_strays()
    job.finish_requested.set()
    job.done.wait()
    after, truncated = snapshot()
    changed, left_out = bounded(changes(before, after))
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
        "figures": [base64.b64encode(f).decode("ascii") for f in FIGURES.take()],
    }


def main():
    signal.signal(signal.SIGINT, on_sigint)
    sys.argv = [""]
    send_frame(
        {
            "type": "ready",
            "pid": RUNNER_PID,
            "uid": os.getuid(),
            "python": sys.version.split()[0],
            "init_protected": INIT_PROTECTED,
        }
    )
    while True:
        request = read_frame()
        if request is None:
            return
        if request.get("op") == "paths":
            send_frame(update_paths(request))
        elif request.get("op") == "list":
            listing = list_directory(str(request.get("path", "")))
            listing.update({"type": "listing", "id": request.get("id")})
            send_frame(listing)
        elif request.get("op") == "read":
            send_frame(read_file(request))
        elif request.get("op") == "write":
            send_frame(write_file(request))
        else:
            send_frame(execute(request))


main()
