# The sandbox runner: the one long-lived Python process in a sandbox that executes code for the host.
#
# The host starts the container with a tiny bootstrap (see protocol.rs) that reads the loader
# (../load_runner.py) from stdin and executes it; the loader receives this package's modules in the
# next frame and calls `run` below. From then on stdin carries requests and stdout carries replies,
# each a frame (protocol.py). Nothing else is ever written to the protocol stream: the code's own
# stdout/stderr (fds 1 and 2) are pipes read by a capture thread, and between executions they point
# at /dev/null.
#
# Two processes run this package. The bootstrap is the container's pid 1: it becomes the supervisor
# (supervisor.py), which prepares the runner once (its imports, IPython's shell) and forks the
# runner proper (runner.py) from that state, and a new one whenever the runner dies (killed by the
# kernel for memory, by the code itself, or on the host's request after an interrupt went
# unanswered), or when the host recycles the sandbox for another call. The container, and so the
# workspace, outlive the runner: a session loses its variables, never its files. The supervisor runs no user code and reads nothing from the
# host; it only writes one frame per runner death.
#
# The modules, by concern:
#   protocol.py    frames, and every string in them made valid UTF-8; the request and reply formats
#   supervisor.py  pid 1: forks the runner, reports its death, obeys only the host's signals,
#                  ends the sandbox when the host hangs up
#   recycle.py     what the code could leave, removed before a sandbox serves another call
#   processes.py   killing and counting the other processes of the sandbox
#   seccomp.py     the filter that keeps the code from signalling, tracing or opening pid 1
#   runner.py      the runner's start and its request loop
#   execute.py     execution through the shell's run_cell: output capture and caps, interrupts,
#                  exit codes, tracebacks as outputs
#   importer.py    the runner's IPython, imported from its set through a finder of its own
#   shell.py       the IPython shell cells run in: display publisher and hook, tracebacks, !cmd,
#                  %pip, a failing input()
#   capture.py     the thread that reads an execution's stdout and stderr within a cap
#   streams.py     the code's buffered sys.stdout and sys.stderr, and when they are flushed
#   compiler.py    cells compiled under the names ipykernel gives them
#   display.py     an execution's outputs in order: IPython's bundles checked, clears and updates
#   workspace.py   opening /workspace paths without following links; reading, writing, listing
#   changes.py     the workspace's entries before and after an execution: what changed
#   figures.py     matplotlib's inline backend for the code; the PNGs of the figures it shows
#   pip.py         `pip` from the code (%pip, !pip, the pip shim on its PATH) asked of the host
#   prepared.py    a dependency set's prepared caches put to use; a prepared sandbox's imports
#   snapshot.py    a session's workspace and variables saved as one blob, and restored from one
#   host_test.py   tests only: the workspace and restraint of a runner the fake backend runs on a host
#
# Each module only defines things; what a process does happens in `run` and in the functions it
# calls, so a module can be imported anywhere without side effects.
#
# The host treats every byte either process sends as untrusted: the code can reach the runner's
# memory.

import os


def run():
    """Pid 1 supervises (and returns only in each runner it forks); any other pid is the runner."""
    start = None
    if os.getpid() == 1:
        from . import supervisor

        start = supervisor.supervise()
    from . import runner

    runner.main(start if start is not None else runner.prepare())
