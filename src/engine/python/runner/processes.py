# The sandbox's other processes: finding and killing them. Used by the supervisor after a runner
# died and by the runner after an interrupt.

import os
import signal
import time

from .host_test import WORKSPACE as HOST_TEST_WORKSPACE

# This process's pid, kept by a fork hook rather than asked of the kernel at every check (a child
# the code forked must not go on as the runner): a system call costs about 0.14 ms under gVisor's
# ptrace platform, and an execution checked three times. A fork through os.fork (multiprocessing,
# the supervisor's) runs the hook; a fork behind Python's back (ctypes) does not, and such a child
# is the code's own, as untrusted as the rest of what the sandbox sends.
_pid = os.getpid()


def _forked():
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current_pid():
    """This process's pid (see _pid)."""
    return _pid


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


def other_processes(own_pid):
    """Pids in this sandbox other than init (1) and `own_pid`, zombies included."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, own_pid):
            pids.append(int(name))
    return pids
