# What the code could leave in a sandbox, removed before the sandbox serves another call (the
# supervisor's recycle, after every other process is dead). The code runs as one unprivileged
# user on a read-only root: what it can change that outlives its processes is the files in the
# places below (each a tmpfs of the sandbox's own), and the IPC namespace's objects, which the
# seccomp filter (seccomp.py) never lets it make. Operator mounts (SANDBOX_MOUNTS) are shared by
# design and left alone; the dependency cache is read-only.
#
# The wipe never follows a link (every directory is opened by name relative to its parent with
# O_NOFOLLOW), takes back the permissions the code took away from its own directories, and is
# bounded: past MAX_ENTRIES or MAX_SECONDS it stops and says the sandbox is not clean, and the
# host removes it instead.

import os
import stat
import time

from .host_test import WORKSPACE as HOST_TEST_WORKSPACE

PLACES = ("/workspace", "/tmp", "/dev/shm", "/dev/mqueue")
MAX_ENTRIES = 20000
MAX_SECONDS = 2.0


class TooMuch(Exception):
    """The wipe's bound was reached."""


def _empty(dir_fd, budget):
    """Removes everything in the directory open as `dir_fd`; returns the budget left."""
    for entry in list(os.scandir(dir_fd)):
        budget[0] -= 1
        if budget[0] < 0 or time.monotonic() > budget[1]:
            raise TooMuch()
        name = entry.name
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            if stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                # A directory entry (not a link: just checked, and nothing else runs) of the
                # code's, which it made unreadable or unwritable.
                os.chmod(name, 0o700, dir_fd=dir_fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                _empty(child, budget)
            finally:
                os.close(child)
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)


def wipe():
    """Empties every place the code could write. Returns how many entries are left in them: 0
    when the sandbox is clean, -1 when the wipe could not finish (too much, or an error)."""
    if HOST_TEST_WORKSPACE is not None:
        return -1  # a runner on a host (tests): nothing of the host is ever wiped
    budget = [MAX_ENTRIES, time.monotonic() + MAX_SECONDS]
    left = 0
    for place in PLACES:
        try:
            fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # not in this runtime's sandboxes (/dev/mqueue under gVisor)
        except OSError:
            return -1
        try:
            _empty(fd, budget)
            left += len(os.listdir(fd))
        except (OSError, TooMuch):
            return -1
        finally:
            os.close(fd)
    return left
