# A seccomp filter the runner installs on itself before it runs any code, inherited by everything
# the code starts: nothing but the host can then signal, trace or open pid 1 (the supervisor), and
# no signal the code sends can pass for the host's (pidfd_send_signal, whose target is a descriptor
# the filter cannot read and whose sender the caller writes, fails with ENOSYS); the code cannot
# make what would outlive it in the sandbox's IPC namespace, where no wipe can find it under every
# runtime (System V shared memory, semaphores and message queues, POSIX message queues): those
# calls fail with ENOSYS, as on a kernel without them; and it cannot make a set-user-ID or
# set-group-ID file (EPERM), which under SANDBOX_ROOTS=rw would be the server's user's on the
# host. A sandbox is reused for the next call only once everything the code could leave is gone
# (supervisor.py's recycle).

import errno
import os

# Syscalls that signal, trace or reach into another process, by architecture: number → the
# argument that names the target (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
# pidfd_open, process_vm_readv, process_vm_writev: the first; ptrace: the second).
_TARGETING_SYSCALLS = {
    "x86_64": (0xC000003E, {62: 0, 200: 0, 234: 0, 129: 0, 297: 0, 434: 0, 310: 0, 311: 0, 101: 1}),
    "aarch64": (0xC00000B7, {129: 0, 130: 0, 131: 0, 138: 0, 240: 0, 434: 0, 270: 0, 271: 0, 117: 1}),
}

# Syscalls refused outright (ENOSYS), by architecture: shmget, semget, msgget, mq_open,
# pidfd_send_signal, openat2, io_uring_setup, io_uring_enter, io_uring_register. io_uring's
# operations (open, chmod-free creation with any mode) are made by the kernel past this filter:
# Docker 20.10's default profile still allows it, gVisor has it off. pidfd_send_signal takes its target as a descriptor (a pidfd, or a
# /proc/PID directory: pid 1's is open to anyone) and a siginfo its caller fills in: sender pid 0
# and any negative si_code, which would pass for the host's signal. openat2 carries its flags and
# mode in a struct the filter cannot read, so it could make a set-ID file. ENOSYS, as on a kernel
# before them (5.1, 5.6) and as gVisor answers pidfd_send_signal: callers that try them fall back
# to kill and openat (glibc, Go, systemd, cap-std), where EPERM would read as a refusal to go on.
_UNAVAILABLE_SYSCALLS = {
    "x86_64": (29, 64, 68, 240, 424, 437, 425, 426, 427),
    "aarch64": (194, 190, 186, 180, 424, 437, 425, 426, 427),
}

# Syscalls that make a file or set its mode, by architecture: number → (the argument that holds
# the mode, the argument that holds open's flags, or None where the mode always applies). x86_64:
# open, creat, chmod, fchmod, mknod, openat, mknodat, fchmodat, fchmodat2; aarch64 (no open,
# creat, chmod or mknod): mknodat, fchmod, fchmodat, openat, fchmodat2. open and openat use the
# mode only with O_CREAT or O_TMPFILE (its __O_TMPFILE bit, the same on both).
_MODE_SYSCALLS = {
    "x86_64": {2: (2, 1), 85: (1, None), 90: (1, None), 91: (1, None), 133: (1, None), 257: (3, 2), 259: (2, None), 268: (2, None), 452: (2, None)},
    "aarch64": {33: (2, None), 52: (1, None), 53: (2, None), 56: (3, 2), 452: (2, None)},
}
# The mode bits refused (S_ISUID, S_ISGID) and the open flags that make a file (O_CREAT,
# __O_TMPFILE).
SET_ID_BITS = 0o6000
CREATING_FLAGS = 0o100 | 0o20000000


def targeting_init_filter(machine):
    """A seccomp BPF program (a list of (code, jt, jf, k)) that fails with EPERM every syscall of
    _TARGETING_SYSCALLS whose target is pid 1, every syscall of _MODE_SYSCALLS whose mode has
    SET_ID_BITS (open and openat: only with CREATING_FLAGS), and every syscall of another ABI
    (i386 through int 0x80, x32), which would pass under other numbers; with ENOSYS every syscall
    of _UNAVAILABLE_SYSCALLS; it allows everything else. None for an unknown architecture."""
    if machine not in _TARGETING_SYSCALLS:
        return None
    audit_arch, syscalls = _TARGETING_SYSCALLS[machine]
    unavailable = _UNAVAILABLE_SYSCALLS[machine]
    mode_syscalls = _MODE_SYSCALLS[machine]
    LOAD, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, JUMP_IF_ANY, RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | errno.EPERM
    NOT_HERE = 0x00050000 | errno.ENOSYS
    arguments = sorted(set(syscalls.values()))
    # Each (mode argument, flags argument) once, in the order of the syscalls'; its test is a load
    # and a test of the flags (where there are flags), then a load and a test of the mode.
    modes = list(dict.fromkeys(mode for _, mode in sorted(mode_syscalls.items())))
    mode_sizes = [2 if flags is None else 4 for _, flags in modes]
    # Layout: 0 load arch, 1 check arch, 2 load nr, 3 check for x32's bit, 4.. one test per
    # unavailable syscall, one per targeting syscall, one per mode syscall, then "allow", then
    # per argument a load and a test, then per mode its tests, then "deny", "allow" and "not
    # here".
    first_check = 4 + len(unavailable)
    first_argument_check = first_check + len(syscalls) + len(mode_syscalls) + 1
    first_mode_check = first_argument_check + 2 * len(arguments)
    deny_at = first_mode_check + sum(mode_sizes)
    allow_at = deny_at + 1
    not_here_at = allow_at + 1
    program = [
        (LOAD, 0, 0, 4),
        (JUMP_IF_EQUAL, 0, deny_at - 2, audit_arch),
        (LOAD, 0, 0, 0),
        (JUMP_IF_AT_LEAST, deny_at - 4, 0, 0x40000000),
    ]
    for number in unavailable:
        program.append((JUMP_IF_EQUAL, not_here_at - len(program) - 1, 0, number))
    for number, argument in sorted(syscalls.items()):
        check_at = first_argument_check + 2 * arguments.index(argument)
        program.append((JUMP_IF_EQUAL, check_at - len(program) - 1, 0, number))
    for number, mode in sorted(mode_syscalls.items()):
        check_at = first_mode_check + sum(mode_sizes[: modes.index(mode)])
        program.append((JUMP_IF_EQUAL, check_at - len(program) - 1, 0, number))
    program.append((RETURN, 0, 0, ALLOW))
    for argument in arguments:
        program.append((LOAD, 0, 0, 16 + 8 * argument))  # its low 32 bits: a pid is an int
        here = len(program)
        program.append((JUMP_IF_EQUAL, deny_at - here - 1, allow_at - here - 1, 1))
    for mode_argument, flags_argument in modes:
        # Their low 32 bits: flags are an int and a mode a mode_t (the kernel reads no more).
        if flags_argument is not None:
            program.append((LOAD, 0, 0, 16 + 8 * flags_argument))
            here = len(program)
            program.append((JUMP_IF_ANY, 0, allow_at - here - 1, CREATING_FLAGS))
        program.append((LOAD, 0, 0, 16 + 8 * mode_argument))
        here = len(program)
        program.append((JUMP_IF_ANY, deny_at - here - 1, allow_at - here - 1, SET_ID_BITS))
    program += [(RETURN, 0, 0, DENY), (RETURN, 0, 0, ALLOW), (RETURN, 0, 0, NOT_HERE)]
    return program


def forbid_targeting_init():
    """Installs targeting_init_filter in this process, inherited by everything the code starts:
    nothing but the host can then signal, trace or open pid 1, and no set-ID file can be made. The kernel already drops SIGKILL and
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
