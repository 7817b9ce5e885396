# The supervisor: the container's pid 1. It prepares the runner once (its modules, IPython and the
# shell imported and warmed: runner.prepare), then forks the runner from that state, and a new one
# whenever the runner dies: a new runner is ready in the time of a fork. It runs no user code and
# reads nothing from the host, and writes one "exited" frame per runner death (protocol.py). It is
# not dumpable, so the code (the same user) cannot open its memory through /proc and change what
# the next runner starts from; the runner it forks is made dumpable again.
#
# The host interrupts an execution with SIGINT to pid 1, which passes it on (KeyboardInterrupt in
# the code); when that does not work it sends SIGUSR1, on which the supervisor kills every other
# process. SIGUSR2 recycles the sandbox for another call: every other process killed, everything
# the code could write removed (recycle.py), then a new runner. SIGTERM (`docker stop`, an engine
# shutting down) ends the sandbox. The supervisor obeys only signals sent from outside the sandbox
# with kill (the host's: sender pid 0, SI_USER): the code can signal pid 1 too, and is ignored.
#
# The sandbox ends itself when the host hangs up (its server exited or was killed: the engine
# closes the container's stdin when the one attached client goes, and removes the container when
# pid 1 exits): the supervisor looks at its stdin between signals, every HANGUP_LOOK seconds,
# whatever the runner is doing.

import os
import select
import signal
import time

from . import recycle
from .processes import kill_others
from .protocol import write_frame

# How often the supervisor looks whether the host hung up.
HANGUP_LOOK = 0.25

# The si_code of a signal sent with kill (the host's); Python's signal module does not name it.
SI_USER = 0


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


def host_hung_up():
    """The host closed the protocol: nobody will ever talk to a new runner."""
    poller = select.poll()
    poller.register(0, select.POLLIN)
    return any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in poller.poll(0))


def end_sandbox(status):
    """Kills every other process and exits: the container ends (and the engine removes it)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    os._exit(status)


def next_signal(watched):
    """The next of the `watched` signals (blocked); ends the sandbox if the host hangs up first."""
    while True:
        info = signal.sigtimedwait(watched, HANGUP_LOOK)
        if info is not None:
            return info
        if host_hung_up():
            end_sandbox(0)


def set_dumpable(dumpable):
    """prctl(PR_SET_DUMPABLE): whether a process of the same user may trace this one or open its
    memory through /proc. Best effort (False where the runtime refuses)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(4, 1 if dumpable else 0, 0, 0, 0) == 0
    except OSError:
        return False


def supervise():
    """Pid 1: returns, only in each freshly forked runner, what runner.prepare made (the runner's
    imports and shell, made once, before any code ran); never returns in the supervisor itself.

    The signals it acts on are blocked and taken with sigwaitinfo, which says who sent each: the
    host's (`docker kill`, an engine stopping the container) come from outside the sandbox's pid
    namespace, with sender pid 0, and are sent with kill (runc's, or gVisor's sentry for runsc),
    si_code SI_USER. The code runs as the same user and can signal pid 1 too; its signals carry
    its pid and are ignored, so the code cannot end its sandbox, or pass for the host asking for an
    interrupt. A sender pid is the caller's to write only in a queued signal (rt_sigqueueinfo,
    pidfd_send_signal), whose si_code the kernel keeps negative, and a signal the kernel makes (a
    descriptor's F_SETSIG, a child's death) has a code of its own: only SI_USER is the host's.
    (seccomp.py keeps the code from queueing any signal to pid 1 at all.)"""
    watched = {signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGCHLD}
    for signum in watched:
        # A handler, so the kernel delivers these to pid 1 at all; blocked, so sigwaitinfo takes them.
        signal.signal(signum, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    set_dumpable(False)
    from . import runner

    start = runner.prepare()
    requested = False
    recycling = False
    while True:
        oom_before = oom_kill_count()
        try:
            pid = os.fork()
        except OSError:  # the process limit, briefly: every other process is being killed
            time.sleep(0.05)
            continue
        if pid == 0:
            # Ignored until the runner puts its own handler in place: an interrupt the host
            # repeats for a runner that just died must not end the next one while it starts.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            signal.signal(signal.SIGUSR2, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
            set_dumpable(True)
            return start
        started = time.monotonic()
        status = None
        while status is None:
            info = next_signal(watched)
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
            if info.si_pid != 0 or info.si_code != SI_USER:
                continue  # sent from inside the sandbox: the code's, not the host's
            if info.si_signo == signal.SIGINT:
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
            elif info.si_signo in (signal.SIGUSR1, signal.SIGUSR2):
                requested = True
                recycling = recycling or info.si_signo == signal.SIGUSR2
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
            elif info.si_signo == signal.SIGTERM:
                # `docker stop` or an engine shutting down: end the sandbox, no new runner.
                end_sandbox(128 + signal.SIGTERM)
        # Every process of the sandbox descends from pid 1: none is left once it has no children.
        kill_others(5.0, lambda children: not children)
        if host_hung_up():
            end_sandbox(0)
        oom_after = oom_kill_count()
        oom = None if oom_before is None or oom_after is None else oom_after > oom_before
        frame = {
            "type": "exited",
            "status": os.waitstatus_to_exitcode(status),
            "oom": oom,
            "requested": requested,
        }
        if recycling:
            # What is left where the code could write once the wipe is done (0: nothing).
            frame["recycled"] = recycle.wipe()
        write_frame(1, frame)
        if not requested and time.monotonic() - started < 1.0:
            time.sleep(0.2)  # a runner that cannot start must not spin (a recycle is no spin)
        requested = False
        recycling = False
