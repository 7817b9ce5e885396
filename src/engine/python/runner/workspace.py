# The workspace as the host reaches it through the runner: every path is opened one component at
# a time, as the sandbox's user, never following a link (open_in_workspace), so what the code
# could not read, the host never gets. A path that is not UTF-8 travels as its text (undecodable
# bytes replaced) plus "path_bytes", its exact bytes.

import base64
import errno
import os
import stat

from .host_test import WORKSPACE as HOST_TEST_WORKSPACE

WORKSPACE = HOST_TEST_WORKSPACE or "/workspace"

# The largest piece of a file one read or write request carries.
CHUNK_LIMIT = 1 << 20


def kind_of(mode):
    """What an lstat mode is, in the words the host uses."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


def path_fields(path, key="path"):
    """A workspace path for the host: its text, plus its raw bytes (base64) when they are not
    UTF-8, so the host can name it back exactly."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
        return {key: path}
    except UnicodeDecodeError:
        return {key: raw.decode("utf-8", "replace"), key + "_bytes": base64.b64encode(raw).decode("ascii")}


def requested_path(request):
    """The workspace-relative path a request names, as bytes (its raw form when it has one)."""
    raw = request.get("path_bytes")
    path = base64.b64decode(raw) if raw else str(request.get("path", "")).encode("utf-8")
    parts = path.split(b"/")
    if not path or any(part in (b"", b".", b"..") for part in parts) or b"\0" in path:
        raise ValueError("not a relative path inside /workspace")
    return parts


def write_all_at(fd, data, offset):
    """Writes all of `data` at `offset` (pwrite may write less); returns how many bytes."""
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)
    return written


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


def open_in_workspace(parts, flags, mode=0o644, make_parents=False, top=WORKSPACE):
    """Opens /workspace/<parts> (or <top>/<parts>) without following any link on the way: each
    directory is opened relative to the one before, and checked to be what its name held (see
    open_beneath), so a link swapped in anywhere fails instead of leading out. Runs as the
    sandbox's user: what it cannot open, it cannot hand out."""
    directory = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
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
            written = write_all_at(fd, data, offset)
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
