"""The seccomp filter bwrap installs on everything in the sandbox (``bwrap --seccomp FD``).

Namespaces and dropped capabilities already stop most privileged calls. The filter closes the
ones they leave open to a process with the same uid as the sandbox's init, and trims kernel
attack surface nobody running Python code needs. It is a deny list: every other call is allowed,
so the kernel and ordinary libraries behave as before.

The program is classic BPF (what bwrap expects, as ``seccomp_export_bpf`` writes it): check the
architecture, refuse the x32 ABI, then compare the syscall number against the list. bwrap applies
it with ``NO_NEW_PRIVS`` to the PID namespace's init and to the command, and children inherit it.
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ("BLOCKED_SYSCALLS", "filter_pipe", "syscall_filter")

# The refused calls: name, number on x86_64 (asm/unistd_64.h), number on aarch64
# (asm-generic/unistd.h). Each gets EPERM, so callers see an ordinary permission error.
_BLOCKED: tuple[tuple[str, int, int], ...] = (
    # Same uid as the sandbox's init: tracing it stops it (SIGSTOP on attach), and a stopped init
    # never reaps the kernel. The next four need the same rights as ptrace and reach into
    # another process's memory or descriptors.
    ("ptrace", 101, 117),
    ("process_vm_readv", 310, 270),
    ("process_vm_writev", 311, 271),
    ("pidfd_getfd", 438, 438),
    ("process_madvise", 440, 440),
    # Keyrings are not fully namespaced: keys of the host's uid could be read or planted.
    ("keyctl", 250, 219),
    ("add_key", 248, 217),
    ("request_key", 249, 218),
    # Large kernel interfaces that recur in kernel exploits (eBPF, perf counters with their side
    # channels, userfaultfd to widen race windows, io_uring which also sidesteps syscall filters);
    # Python code has no use for them.
    ("bpf", 321, 280),
    ("perf_event_open", 298, 241),
    ("userfaultfd", 323, 282),
    ("io_uring_setup", 425, 425),
    ("io_uring_enter", 426, 426),
    ("io_uring_register", 427, 427),
    # Need capabilities the sandbox does not have; refused here too in case one is ever kept:
    # replacing or extending the running kernel, and opening files by handle past mount boundaries.
    ("kexec_load", 246, 104),
    ("kexec_file_load", 320, 294),
    ("init_module", 175, 105),
    ("finit_module", 313, 273),
    ("delete_module", 176, 106),
    ("open_by_handle_at", 304, 265),
)
BLOCKED_SYSCALLS = tuple(name for name, _, _ in _BLOCKED)

# The seccomp architecture token per machine, and which of _BLOCKED's numbers it uses.
_ARCHES: dict[str, tuple[int, int]] = {
    "x86_64": (0xC000003E, 0),  # AUDIT_ARCH_X86_64
    "aarch64": (0xC00000B7, 1),  # AUDIT_ARCH_AARCH64
}

# On x86_64, syscall numbers with this bit set are the x32 ABI: same calls, other numbers.
_X32_BIT = 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1
_ENOSYS = 38
# Offsets of the syscall number and the architecture in struct seccomp_data.
_NR = 0
_ARCH = 4


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def syscall_filter(machine: str | None = None) -> bytes | None:
    """The filter program for this machine, or None where ipybox has no syscall table for it.

    Calls of another architecture (i386 ``int 0x80`` on x86_64, arm32 on aarch64) and of the x32
    ABI get ENOSYS: the numbers above would not match them, and Python never makes them.
    """
    found = _ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    arch, column = found
    blocked = [(x86_64, aarch64)[column] for _, x86_64, aarch64 in _BLOCKED]
    # Layout: [arch check][x32 check][one jeq per call] allow, eperm, enosys. Jumps are relative
    # to the next instruction, so each jeq's distance to "eperm" shrinks by one down the list.
    checks = len(blocked)
    program = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, arch, jt=0, jf=checks + 4),  # foreign architecture: to enosys
        _insn(_LD_W_ABS, _NR),
        _insn(_JGE_K, _X32_BIT, jt=checks + 2, jf=0),  # x32: to enosys
    ]
    program += [_insn(_JEQ_K, nr, jt=checks - i, jf=0) for i, nr in enumerate(blocked)]
    program += [
        _insn(_RET_K, _RET_ALLOW),
        _insn(_RET_K, _RET_ERRNO | _EPERM),
        _insn(_RET_K, _RET_ERRNO | _ENOSYS),
    ]
    return b"".join(program)


def filter_pipe(program: bytes) -> int:
    """A readable descriptor that yields ``program`` and then EOF, for ``bwrap --seccomp FD``.

    The caller passes it to the child (``pass_fds``) and closes it after the child has started.
    """
    read, write = os.pipe()
    try:
        # A few hundred bytes: far below the pipe's buffer, so the write cannot block.
        os.write(write, program)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return read
