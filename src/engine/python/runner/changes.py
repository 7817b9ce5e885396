# What an execution created or changed in the workspace, found by comparing two walks that never
# follow links. The host copies the files out itself and checks everything again. In the
# client's writable roots (/mnt/roots/<name>, SANDBOX_ROOTS=rw), which are the user's own
# directories and may be large, one walk after the code finds what changed while it ran (an
# entry whose status changed since it started: the kernel sets that time, the code cannot set
# it back); nothing of them is copied, the host names where they are.

import os
import stat

from .workspace import WORKSPACE, kind_of, open_in_workspace, path_fields

# Entries walked per snapshot; past it, changes are reported as incomplete.
TRACK_LIMIT = 10000
# Changed entries named in one result, and the bytes of their paths: the rest are only counted.
REPORT_LIMIT = 1000
REPORT_PATH_BYTES = 256 << 10


# The client's writable roots, by name (the host says which; see engine/roots.rs).
ROOTS_MOUNT = "/mnt/roots"
WRITABLE_ROOTS = [name for name in os.environ.get("PCS_ROOTS_WRITABLE", "").split(",") if name]


def snapshot(top=WORKSPACE, directories=False):
    """The entries under `top` (the workspace), without following links: path -> (kind, size,
    mtime, inode, ctime); `directories`: the directories too, not only what is in them.
    Directories are opened one component at a time like open_in_workspace, so a directory the
    code swaps for a link while it is walked is skipped, never listed from where the link
    points."""
    entries = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        fd = None
        try:
            if rel:
                parts = os.fsencode(rel).split(b"/")
                fd = open_in_workspace(parts, os.O_RDONLY | os.O_DIRECTORY, top=top)
        except OSError:
            continue
        try:
            # The top by its path: a mount point, which the code cannot swap for a link, listed
            # in half the system calls of a listing through a descriptor (one walk before and one
            # after every execution; each call is dear under gVisor).
            with os.scandir(top if fd is None else fd) as it:
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
                        if not directories:
                            continue
                    entries[path] = (kind_of(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        except OSError:
            pass
        finally:
            if fd is not None:
                os.close(fd)
    return entries, False


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


def changed_in_roots(since_ns):
    """What changed in the writable roots since `since_ns` (the wall clock as the code started):
    [{"root", "path", "kind", "size"}], shallowest first, directories too (the host removes
    world-write and set-id bits the code gave any of them), and whether a root had more entries
    than are walked."""
    changed = []
    truncated = False
    for name in WRITABLE_ROOTS:
        entries, cut = snapshot(ROOTS_MOUNT + "/" + name, directories=True)
        truncated = truncated or cut
        for path in sorted(entries, key=lambda p: (p.count("/"), p)):
            kind, size, mtime, _, ctime = entries[path]
            if max(mtime, ctime) >= since_ns:
                entry = path_fields(path)
                entry.update({"root": name, "kind": kind, "size": size})
                changed.append(entry)
    return changed, truncated
