# The supervisor: the container's pid 1. It forks the runner, and a new one whenever the runner dies;
# it runs no user code and reads nothing from the host, and writes one "exited" frame per runner
# death (protocol.py).
#
# The host interrupts an execution with SIGINT to pid 1, which passes it on (KeyboardInterrupt in
# the code); when that does not work it sends SIGUSR1, on which the supervisor kills every other
# process. SIGTERM (`docker stop`, an engine shutting down) ends the sandbox. The supervisor obeys
# only signals sent from outside the sandbox (the host's): the code can signal pid 1 too, and is
# ignored.

import os
import select
import signal
import time

from .processes import kill_others
from .protocol import write_frame


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
