# Session snapshots, the runner's half: the workspace and the session's variables as one blob in a
# runner-private file, which the host reads out in pieces (snapshot, snapshot_read), and the same
# blob written back into a fresh sandbox and unpacked there (restore_write, restore).
#
# The blob:  b"PCS-SNAPSHOT 1\n", an 8-byte big-endian length L, the workspace as a tar of L bytes,
# then the variables: entries of an 8-byte big-endian length and that many bytes. The first entry
# is JSON {"modules": {name: module name}, "variables": [name, ...]} (names bound to modules are
# imported again by name; the variables are the names of the later entries, in order); each later
# entry is the pickle of (name, value). One Pickler writes them all and one Unpickler reads them
# all, so a value two variables share (a = b = []) is still one value after a restore; an entry
# that fails to load costs only its own name (and the names that share a value with it).
#
# Pickle alone saves functions and classes by reference, which for the session's own ("__main__")
# ones means nothing: those are saved by value here (their code marshalled, their state after
# them, so recursive and self-referencing ones work), and modules by name. A variable that cannot
# be pickled is found by a trial run before anything is written and reported with the reason.
#
# The blob a restore reads came from outside the sandbox: its lengths and its tar are checked, and
# the tar is extracted without ever following a link. (Its pickles are code the sandbox runs, as
# the sandbox runs any code.)

import base64
import importlib
import json
import marshal
import os
import pickle
import pickletools
import stat
import struct
import sys
import tarfile
import types

from .workspace import (
    CHUNK_LIMIT,
    WORKSPACE,
    describe_error,
    open_beneath,
    open_in_workspace,
    write_all_at,
)

MAGIC = b"PCS-SNAPSHOT 1\n"
LENGTH = struct.Struct(">Q")
PROTOCOL = 5
MAX_REASON = 300
COPY_CHUNK = 1 << 20

# The runner's own files (the snapshot it made, the one it is given) are anonymous memory files
# (memfd): no path the code could find or replace, and no size limit but the sandbox's memory
# (a sandbox's /tmp is a small tmpfs, and a file in /workspace would be in its own archive).
PRIVATE_FILES = {}
SNAPSHOT_NAME = "snapshot"
UPLOAD_NAME = "upload"


class SnapshotError(Exception):
    """A snapshot or restore that cannot go on; its text goes to the host as the reply's error."""


def reason_of(exc):
    try:
        text = "%s: %s" % (type(exc).__name__, exc)
    except Exception:  # a __str__ that raises
        text = type(exc).__name__
    return text[:MAX_REASON]


# ---- Pickling the session's own functions and classes by value ----

# Where functions restored by value look up their globals: the namespace being restored into.
_RESTORE_NAMESPACE = None
_EMPTY_CELL = ("sandbox_runner.snapshot", "empty cell")


def _make_function(code_bytes, name, qualname):
    """A session function's skeleton; _fill_function gives it its state once it is memoized."""
    code = marshal.loads(code_bytes)
    namespace = _RESTORE_NAMESPACE
    if namespace is None:
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    closure = tuple(types.CellType() for _ in code.co_freevars) or None
    function = types.FunctionType(code, namespace, name, None, closure)
    function.__qualname__ = qualname
    function.__module__ = "__main__"
    return function


def _fill_function(function, state):
    defaults, kwdefaults, cells, attributes, doc, annotations = state
    function.__defaults__ = defaults
    function.__kwdefaults__ = kwdefaults
    for cell, value in zip(function.__closure__ or (), cells):
        if value != _EMPTY_CELL:
            cell.cell_contents = value
    function.__dict__.update(attributes)
    function.__doc__ = doc
    function.__annotations__ = annotations
    return function


def _make_class(metaclass, name, qualname, bases, skeleton):
    """A session class's skeleton (with its __slots__, which must exist at creation);
    _fill_class gives it its other attributes once it is memoized."""
    return types.new_class(name, bases, {"metaclass": metaclass}, lambda ns: ns.update(skeleton))


def _fill_class(cls, attributes):
    for key, value in attributes.items():
        setattr(cls, key, value)
    if "__abstractmethods__" in attributes or hasattr(cls, "_abc_impl"):
        import abc

        abc.update_abstractmethods(cls)
    return cls


def _function_reduction(function):
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet assigned
            cells.append(_EMPTY_CELL)
    state = (
        function.__defaults__,
        function.__kwdefaults__,
        tuple(cells),
        dict(function.__dict__),
        function.__doc__,
        dict(function.__annotations__),
    )
    # The 6-tuple form: the state is pickled after the function is memoized, so a function whose
    # closure or defaults reach itself (recursion through a cell) refers back instead of looping.
    skeleton = (marshal.dumps(function.__code__), function.__name__, function.__qualname__)
    return (_make_function, skeleton, state, None, None, _fill_function)


def _class_reduction(cls):
    import enum

    if isinstance(cls, enum.EnumMeta):
        raise pickle.PicklingError("an Enum class defined in the session cannot be saved")
    attributes = dict(cls.__dict__)
    slots = attributes.get("__slots__", ())
    if isinstance(slots, str):
        slots = (slots,)
    skeleton = {"__module__": "__main__", "__qualname__": cls.__qualname__}
    if "__slots__" in attributes:
        skeleton["__slots__"] = attributes["__slots__"]
    # Made again by the class statement's machinery, not copied: the instance __dict__ and
    # __weakref__ descriptors, the slots' member descriptors, ABCMeta's registry.
    for key in ("__dict__", "__weakref__", "_abc_impl", "__module__", "__qualname__", "__slots__"):
        attributes.pop(key, None)
    for slot in slots:
        if isinstance(attributes.get(slot), types.MemberDescriptorType):
            del attributes[slot]
    metaclass = type(cls)
    return (_make_class, (metaclass, cls.__name__, cls.__qualname__, cls.__bases__, skeleton),
            attributes, None, None, _fill_class)


def _dataclass_sentinels():
    """dataclasses compares its markers by identity (`f._field_type is _FIELD`): they are saved
    as references to the module's own objects."""
    module = sys.modules.get("dataclasses")
    if module is None:
        return {}
    names = ("MISSING", "_FIELD", "_FIELD_CLASSVAR", "_FIELD_INITVAR", "_HAS_DEFAULT_FACTORY",
             "_EMPTY_METADATA")
    return {id(getattr(module, n)): (module, n) for n in names if hasattr(module, n)}


class SessionPickler(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=PROTOCOL)
        self.sentinels = _dataclass_sentinels()

    def reducer_override(self, obj):
        if isinstance(obj, types.ModuleType):
            name = getattr(obj, "__name__", None)
            if not isinstance(name, str) or sys.modules.get(name) is not obj:
                raise pickle.PicklingError("a module that cannot be imported by name")
            return (importlib.import_module, (name,))
        if isinstance(obj, types.FunctionType):
            if obj.__module__ == "__main__":
                return _function_reduction(obj)
            return NotImplemented
        if isinstance(obj, type):
            if obj.__module__ == "__main__":
                return _class_reduction(obj)
            return NotImplemented
        # Wrappers that have no pickling of their own, rebuilt around their functions.
        if type(obj) is property:
            return (property, (obj.fget, obj.fset, obj.fdel, obj.__doc__))
        if type(obj) is classmethod or type(obj) is staticmethod:
            return (type(obj), (obj.__func__,))
        sentinel = self.sentinels.get(id(obj))
        if sentinel is not None:
            return (getattr, sentinel)
        if type(obj) is types.MappingProxyType:
            return (types.MappingProxyType, (dict(obj),))
        return NotImplemented


class _CountingSink:
    """Where a trial pickling writes: nowhere, counting."""

    def __init__(self):
        self.size = 0

    def write(self, data):
        # Protocol 5 hands large buffers (a numpy array's data) over as a PickleBuffer, which has
        # no len(): its size is its memoryview's.
        size = memoryview(data).nbytes
        self.size += size
        return size


def probe(value):
    """None if `value` pickles, else the reason it does not."""
    try:
        SessionPickler(_CountingSink()).dump(value)
        return None
    except Exception as e:  # any failure of the value's own pickling, RecursionError included
        return reason_of(e)


def is_dunder(name):
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def sort_names(namespace, hidden=frozenset()):
    """The namespace's names split into (variables, {name: module name}, unsaved) after a trial
    pickling of each; dunder names are the runner's and `hidden` ones IPython's (In, Out, _N, ...),
    not the session's."""
    variables, modules, unsaved = [], {}, []
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or is_dunder(name) or name in hidden:
            continue
        if isinstance(value, types.ModuleType):
            module_name = getattr(value, "__name__", None)
            if isinstance(module_name, str) and sys.modules.get(module_name) is value:
                modules[name] = module_name
            else:
                unsaved.append({"name": name, "reason": "a module that cannot be imported by name"})
            continue
        reason = probe((name, value))
        if reason is None:
            variables.append(name)
        else:
            unsaved.append({"name": name, "reason": reason})
    return variables, modules, unsaved


# ---- Files ----


def open_private(name, flags):
    """A new descriptor of the runner's private file `name`, at its start: made anew with O_EXCL
    or O_TRUNC (or when missing, with O_CREAT)."""
    fd = PRIVATE_FILES.get(name)
    if fd is not None and flags & (os.O_EXCL | os.O_TRUNC):
        remove_private(name)
        fd = None
    if fd is None:
        if not flags & os.O_CREAT:
            raise FileNotFoundError(name)
        fd = os.memfd_create("sandbox-" + name, os.MFD_CLOEXEC)
        PRIVATE_FILES[name] = fd
    os.lseek(fd, 0, os.SEEK_SET)
    return os.dup(fd)


def remove_private(name):
    fd = PRIVATE_FILES.pop(name, None)
    if fd is not None:
        os.close(fd)


class TooLarge(Exception):
    pass


class BoundedWriter:
    """The blob file as tarfile and the Pickler write it: raises as soon as it would pass
    `limit` bytes, so an oversized snapshot stops early instead of filling the disk."""

    def __init__(self, file, limit):
        self.file = file
        self.limit = limit

    def write(self, data):
        if self.file.tell() + memoryview(data).nbytes > self.limit:
            raise TooLarge()
        return self.file.write(data)

    def tell(self):
        return self.file.tell()


def write_length_at(file, position, length):
    end = file.tell()
    file.seek(position)
    file.write(LENGTH.pack(length))
    file.seek(end)


class ShortFileReader:
    """Exactly `size` bytes of a file for tarfile: zeros if the file shrank while it was read,
    its first `size` bytes if it grew, so the tar stays well formed."""

    def __init__(self, fd, size):
        self.fd = fd
        self.left = size

    def read(self, n=-1):
        if n is None or n < 0 or n > self.left:
            n = self.left
        data = os.read(self.fd, n) if n else b""
        if len(data) < n:
            data += bytes(n - len(data))
        self.left -= n
        return data


def open_directory(parts, make=True):
    """The workspace directory <parts> (made with its parents where missing, if `make`), opened
    without following a link anywhere on the way."""
    encoded = [os.fsencode(p) for p in parts]
    if not encoded:
        return os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    # The trailing "." makes open_in_workspace treat every real component as a parent.
    return open_in_workspace(encoded + [b"."], os.O_RDONLY | os.O_DIRECTORY, make_parents=make)


def walk_workspace():
    """(relative path, parts, lstat) of every entry of the workspace, parents first, opening each
    directory one component at a time without following a link (workspace.open_in_workspace)."""
    stack = [[]]
    while stack:
        parts = stack.pop()
        try:
            fd = open_directory(parts, make=False)
        except OSError:
            continue  # gone, or swapped for a link since it was listed
        try:
            with os.scandir(fd) as it:
                entries = []
                for entry in it:
                    try:
                        entries.append((entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:
                        continue
        finally:
            os.close(fd)
        subdirectories = []
        for name, st in sorted(entries):
            child = parts + [name]
            yield "/".join(child), child, st
            if stat.S_ISDIR(st.st_mode):
                subdirectories.append(child)
        stack.extend(reversed(subdirectories))


def write_workspace_tar(out):
    """The workspace as a tar: directories, regular files and symbolic links (as links); sockets,
    devices and FIFOs are left out. Returns (files, file bytes)."""
    files = file_bytes = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, parts, st in walk_workspace():
            info = tarfile.TarInfo(rel)
            info.mode = st.st_mode & 0o777
            info.mtime = int(st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                try:
                    parent = open_directory(parts[:-1], make=False)
                    try:
                        info.linkname = os.readlink(parts[-1], dir_fd=parent)
                    finally:
                        os.close(parent)
                except OSError:
                    continue
                info.type = tarfile.SYMTYPE
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = open_in_workspace([os.fsencode(p) for p in parts], os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    continue  # gone, or a link now
                try:
                    now = os.fstat(fd)
                    if not stat.S_ISREG(now.st_mode):
                        continue
                    info.size = now.st_size
                    info.mode = now.st_mode & 0o777
                    tar.addfile(info, ShortFileReader(fd, now.st_size))
                finally:
                    os.close(fd)
                files += 1
                file_bytes += info.size
    return files, file_bytes


def write_variables(out, namespace, variables, modules):
    """The variables section. A value whose trial pickling passed can still fail here (it changed
    in between, or fails only beside the others): then the section is written again without it,
    since a half-written pickle would leave the shared memo out of step. Returns the names that
    failed with their reasons."""
    start = out.tell()
    failed = []
    while True:
        out.file.seek(start)
        out.file.truncate()
        write_entry(out, json.dumps({"modules": modules, "variables": variables}).encode("utf-8"))
        pickler = SessionPickler(out)
        failing = None
        for name in variables:
            position = out.tell()
            out.write(LENGTH.pack(0))
            try:
                pickler.dump((name, namespace.get(name)))
            except TooLarge:
                raise
            except Exception as e:
                failing = (name, reason_of(e))
                break
            write_length_at(out.file, position, out.tell() - position - LENGTH.size)
        if failing is None:
            return failed
        variables.remove(failing[0])
        failed.append({"name": failing[0], "reason": failing[1]})


def write_entry(out, data):
    out.write(LENGTH.pack(len(data)))
    out.write(data)


def snapshot(request, namespace, hidden=frozenset()):
    """The `snapshot` op: the blob into the private snapshot file, at most max_bytes of it."""
    reply = {"type": "snapshot", "id": request.get("id")}
    try:
        limit = max(0, int(request.get("max_bytes", 1 << 30)))
        remove_private(SNAPSHOT_NAME)
        # The trial pickling first: it runs the values' own code, which may change the workspace.
        variables, modules, unsaved = sort_names(namespace, hidden)
        fd = open_private(SNAPSHOT_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w+b") as file:
            out = BoundedWriter(file, limit)
            out.write(MAGIC)
            out.write(LENGTH.pack(0))
            files, file_bytes = write_workspace_tar(out)
            write_length_at(file, len(MAGIC), out.tell() - len(MAGIC) - LENGTH.size)
            unsaved += write_variables(out, namespace, variables, modules)
            file.flush()
            size = file.tell()
        reply.update({
            "size": size,
            "files": files,
            "file_bytes": file_bytes,
            "saved": variables,
            "unsaved": unsaved,
            "modules": list(modules),
        })
    except TooLarge:
        remove_snapshot_quietly()
        reply["error"] = "the snapshot is larger than its limit of %d bytes" % limit
    except (OSError, SnapshotError, tarfile.TarError, ValueError) as e:
        remove_snapshot_quietly()
        reply["error"] = "the snapshot could not be written: %s" % describe_error(e)
    except Exception as e:  # whatever else: the runner answers and goes on
        remove_snapshot_quietly()
        reply["error"] = "the snapshot could not be written: %s" % reason_of(e)
    return reply


def remove_snapshot_quietly():
    try:
        remove_private(SNAPSHOT_NAME)
    except (OSError, SnapshotError):
        pass


def remove_upload_quietly():
    try:
        remove_private(UPLOAD_NAME)
    except (OSError, SnapshotError):
        pass


def snapshot_read(request):
    """The `snapshot_read` op: one piece of the snapshot file, as a "piece" reply: its JSON, a
    newline, then the bytes themselves (raw: base64 in JSON cost more than the rest of a
    snapshot). A reply saying why not has no bytes."""
    reply = {"type": "piece", "id": request.get("id")}
    try:
        fd = open_private(SNAPSHOT_NAME, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            length = max(0, min(int(request.get("length", 0)), CHUNK_LIMIT))
            data = os.pread(fd, length, max(0, int(request.get("offset", 0))))
        finally:
            os.close(fd)
        header = json.dumps({"type": "piece", "id": int(request.get("id")), "size": size})
        return header.encode("ascii") + b"\n" + data
    except FileNotFoundError:
        reply["error"] = "no snapshot has been taken"
    except (OSError, SnapshotError, ValueError) as e:
        reply["error"] = describe_error(e)
    return reply


def restore_write(request, data):
    """The `restore_write` op: one piece of the uploaded blob, `data`, the raw frame that followed
    the request (offset 0 starts it anew)."""
    reply = {"type": "written", "id": request.get("id")}
    try:
        if data is None:
            raise SnapshotError("the piece that should follow the request is missing")
        offset = max(0, int(request.get("offset", 0)))
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
        fd = open_private(UPLOAD_NAME, flags)
        try:
            written = write_all_at(fd, data, offset)
        finally:
            os.close(fd)
        reply["size"] = offset + written
    except (OSError, SnapshotError, ValueError) as e:
        reply["error"] = describe_error(e)
    return reply


def discard(request):
    """The `snapshot_discard` op."""
    for name in (SNAPSHOT_NAME, UPLOAD_NAME):
        try:
            remove_private(name)
        except (OSError, SnapshotError):
            pass  # nothing there to remove, or a directory not ours: nothing of ours to remove
    return {"type": "discarded", "id": request.get("id")}


# ---- Restoring ----


class Segment:
    """A read-only window [start, start + length) of a file: tarfile and the Unpickler read one
    part of the blob through it and can never read past that part. `point` moves it."""

    def __init__(self, file):
        self.file = file
        self.position = self.end = 0

    def point(self, start, length):
        self.position, self.end = start, start + length

    def read(self, n=-1):
        left = self.end - self.position
        if n is None or n < 0 or n > left:
            n = left
        self.file.seek(self.position)
        data = self.file.read(n)
        self.position += len(data)
        return data

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.end - self.position)
        self.file.seek(self.position)
        got = self.file.readinto(view[:n])
        self.position += got
        return got

    def readline(self, size=-1):
        left = self.end - self.position
        if size is None or size < 0 or size > left:
            size = left
        self.file.seek(self.position)
        line = self.file.readline(size)
        self.position += len(line)
        return line


def read_length(file, what, limit):
    raw = file.read(LENGTH.size)
    if len(raw) != LENGTH.size:
        raise SnapshotError("the snapshot ends inside its %s" % what)
    (length,) = LENGTH.unpack(raw)
    if length > limit:
        raise SnapshotError("the snapshot's %s is longer than the file" % what)
    return length


def safe_parts(name):
    """A tar member's path as workspace components, or None when it could reach outside."""
    if name.startswith("/") or "\0" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return parts




class _AnyChecksum:
    """Every checksum (see `extract_workspace`)."""

    def __contains__(self, _):
        return True


def extract_workspace(segment):
    """`unpack_workspace` with the tar headers' own checksums not checked: the host masks a
    secret's value wherever it appears in a snapshot (same length), a file's name in a header
    included, and that header's checksum is then of the bytes before. The blob as a whole is
    checked by its hash on the host before it comes here."""
    checked = tarfile.calc_chksums
    tarfile.calc_chksums = lambda buf: _AnyChecksum()
    try:
        return unpack_workspace(segment)
    finally:
        tarfile.calc_chksums = checked


def unpack_workspace(segment):
    """Unpacks the blob's tar into the workspace; returns (files, file bytes). Links are created
    last, so nothing is ever written through one; a member that could reach outside the workspace
    or through a link, or that is neither a file, a directory nor a link, fails the restore."""
    files = file_bytes = 0
    links = []
    link_paths = set()
    directories = []
    with tarfile.open(fileobj=segment, mode="r|") as tar:
        for member in tar:
            parts = safe_parts(member.name)
            if parts is None:
                raise SnapshotError("the snapshot's workspace has an unsafe path: %r" % member.name)
            if any(tuple(parts[:i]) in link_paths for i in range(1, len(parts) + 1)):
                raise SnapshotError("the snapshot's workspace has a path through a link: %r" % member.name)
            mode = member.mode & 0o755
            if member.issym():
                links.append((parts, member.linkname))
                link_paths.add(tuple(parts))
            elif member.isdir():
                fd = open_directory(parts)
                os.close(fd)
                directories.append((parts, mode | 0o700, member.mtime))
            elif member.isreg():
                parent = open_directory(parts[:-1])
                try:
                    fd = open_beneath(parent, os.fsencode(parts[-1]),
                                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                finally:
                    os.close(parent)
                try:
                    source = tar.extractfile(member)
                    while True:
                        chunk = source.read(COPY_CHUNK)
                        if not chunk:
                            break
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                    os.fchmod(fd, mode)
                    os.utime(fd, (member.mtime, member.mtime))
                finally:
                    os.close(fd)
                files += 1
                file_bytes += member.size
            else:
                raise SnapshotError("the snapshot's workspace has an entry of another kind: %r" % member.name)
    for parts, target in links:
        parent = open_directory(parts[:-1])
        try:
            os.symlink(target, os.fsencode(parts[-1]), dir_fd=parent)
        finally:
            os.close(parent)
    # Modes last, deepest first: a directory without write permission would have refused its files.
    for parts, mode, mtime in reversed(directories):
        try:
            fd = open_directory(parts)
        except OSError:
            continue
        try:
            os.fchmod(fd, mode)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
    return files, file_bytes


class MemoTracker:
    """Keeps the shared memo in step after an entry fails to load: the C Unpickler's memo cannot be
    repaired, so from the first failure on, the pure-Python one reads, with the memo indices the
    failed entries would have filled held by placeholders. An entry that refers to one of those
    shares a value with a failed entry and fails too."""

    def __init__(self):
        self.poisoned = {}  # memo index -> the name of the failed entry that should have filled it
        # The entry whose opcodes did not even parse: past it the memo's state is unknowable, so
        # every later entry fails too. (Only a damaged blob has one.)
        self.unreadable = None

    @staticmethod
    def scan(segment, start, length):
        """(MEMOIZE count, memo indices read) of one entry's pickle, from its opcodes alone."""
        segment.point(start, length)
        memoized, read = 0, set()
        for opcode, arg, _ in pickletools.genops(segment):
            if opcode.name == "MEMOIZE":
                memoized += 1
            elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
                read.add(int(arg))
        return memoized, read


def load_variables(file, segment, start, end, namespace, hidden=frozenset()):
    """The variables section into `namespace`: returns (variables, failed, modules). Names in
    `hidden` (IPython's own) are never restored over."""
    file.seek(start)
    length = read_length(file, "variable list", end - start - LENGTH.size)
    try:
        header = json.loads(file.read(length).decode("utf-8"))
        modules = header["modules"]
        names = header["variables"]
        if not (isinstance(modules, dict) and isinstance(names, list)):
            raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise SnapshotError("the snapshot's variable list is not readable")
    restored, failed, imported = [], [], []
    for name, module_name in modules.items():
        if not isinstance(name, str) or not isinstance(module_name, str) or is_dunder(name):
            continue
        if name in hidden:
            continue
        try:
            namespace[name] = importlib.import_module(module_name)
            imported.append(name)
        except BaseException as e:  # an import runs the module's code: anything may come out
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            failed.append({"name": name, "reason": reason_of(e)})

    entries = []
    position = file.tell()
    while position < end:
        file.seek(position)
        length = read_length(file, "variable entry", end - position - LENGTH.size)
        entries.append((position + LENGTH.size, length))
        position += LENGTH.size + length
    global _RESTORE_NAMESPACE
    _RESTORE_NAMESPACE = namespace
    try:
        unpickler = pickle.Unpickler(segment)
        memo = None  # the tracker, once an entry has failed
        memo_before = {}
        for index, (entry_start, entry_length) in enumerate(entries):
            name = names[index] if index < len(names) and isinstance(names[index], str) else "#%d" % index
            if memo is not None and memo.unreadable is None:
                try:
                    memoized, read = memo.scan(segment, entry_start, entry_length)
                except Exception:
                    memo.unreadable = name
            if memo is not None and memo.unreadable is not None:
                if memo.unreadable == name:
                    reason = "not readable"
                else:
                    reason = "comes after %s, which is not readable" % memo.unreadable
                failed.append({"name": name, "reason": reason})
                continue
            if memo is not None:
                shared = sorted({memo.poisoned[i] for i in read if i in memo.poisoned})
                if shared:
                    base = len(unpickler.memo)
                    for i in range(base, base + memoized):
                        unpickler.memo[i] = None
                        memo.poisoned[i] = name
                    failed.append({"name": name, "reason": "shares a value with %s, which failed to load"
                                   % ", ".join(shared)})
                    continue
                memo_before = dict(unpickler.memo)
            segment.point(entry_start, entry_length)
            try:
                loaded = unpickler.load()
                if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], str)
                        and not is_dunder(loaded[0])):
                    raise pickle.UnpicklingError("not a (name, value) pair")
            except Exception as e:
                failed.append({"name": name, "reason": reason_of(e)})
                unpickler, memo = recover(unpickler, memo, memo_before, segment, entries, index, name)
                continue
            if loaded[0] in hidden:
                continue
            namespace[loaded[0]] = loaded[1]
            restored.append(loaded[0])
    finally:
        _RESTORE_NAMESPACE = None
    return restored, failed, imported


def recover(unpickler, memo, memo_before, segment, entries, index, name):
    """After entry `index` failed: a pure-Python Unpickler whose memo holds what the entries before
    filled, and placeholders (poisoned) for what this one would have."""
    if memo is None:
        # First failure: how many memo slots the entries before filled, counted from their opcodes
        # (the C Unpickler's memo also holds the half-loaded entry's and cannot say which).
        memo = MemoTracker()
        filled = 0
        for entry_start, entry_length in entries[:index]:
            memoized, _ = memo.scan(segment, entry_start, entry_length)  # loaded: they parse
            filled += memoized
        current = unpickler.memo.copy()
        memo_before = {i: current[i] for i in range(filled) if i in current}
    entry_start, entry_length = entries[index]
    try:
        memoized, _ = memo.scan(segment, entry_start, entry_length)
    except Exception:
        memo.unreadable = name
        return unpickler, memo
    python_unpickler = pickle._Unpickler(segment)
    python_unpickler.memo = dict(memo_before)
    base = len(memo_before)
    for i in range(base, base + memoized):
        python_unpickler.memo[i] = None
        memo.poisoned[i] = name
    return python_unpickler, memo


def restore(request, namespace, hidden=frozenset()):
    """The `restore` op: the uploaded blob's workspace and variables, then the upload removed."""
    reply = {"type": "restored", "id": request.get("id")}
    try:
        try:
            fd = open_private(UPLOAD_NAME, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotError("no snapshot was uploaded")
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if file.read(len(MAGIC)) != MAGIC:
                raise SnapshotError("not a snapshot (or one of another version)")
            tar_length = read_length(file, "workspace", size - len(MAGIC) - LENGTH.size)
            tar_start = len(MAGIC) + LENGTH.size
            segment = Segment(file)
            segment.point(tar_start, tar_length)
            files, file_bytes = extract_workspace(segment)
            variables_start = tar_start + tar_length
            variables, failed, modules = load_variables(file, segment, variables_start, size, namespace,
                                                        hidden)
        reply.update({"files": files, "file_bytes": file_bytes, "variables": variables, "failed": failed,
                      "modules": modules})
    except SnapshotError as e:
        reply["error"] = str(e)
    except tarfile.TarError as e:
        reply["error"] = "the snapshot's workspace is not a readable tar: %s" % e
    except (OSError, ValueError) as e:
        reply["error"] = "the snapshot could not be restored: %s" % describe_error(e)
    except Exception as e:  # whatever else a damaged blob causes: the runner answers and goes on
        reply["error"] = "the snapshot could not be restored: %s" % reason_of(e)
    finally:
        try:
            remove_private(UPLOAD_NAME)
        except (OSError, SnapshotError):
            pass
    return reply
