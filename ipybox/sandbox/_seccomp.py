"""The seccomp filter bwrap installs on everything in the sandbox (``bwrap --seccomp FD``).

Namespaces and dropped capabilities already stop most privileged calls. The filter closes the
ones they leave open to a process with the same uid as the sandbox's init, trims kernel attack
surface nobody running Python code needs, and refuses the calls whose per-user counters the sandbox
would share with the host's user. It is a deny list: every other call is allowed, so the kernel and
ordinary libraries behave as before. Sockets are the one allow list: ``socket`` and ``socketpair``
work only for the families and protocols in `_SOCKET_RULES`.

The program is classic BPF (what bwrap expects, as ``seccomp_export_bpf`` writes it): check the
architecture, refuse the x32 ABI, then compare the syscall number against the list, and for the
socket calls their arguments. bwrap applies it with ``NO_NEW_PRIVS`` to the PID namespace's init
and to the command, and children inherit it.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import socket
import struct

__all__ = ("BLOCKED_SYSCALLS", "SOCKET_FAMILIES", "filter_pipe", "syscall_filter")

# The refused calls: name, number on x86_64 (asm/unistd_64.h), number on aarch64
# (asm-generic/unistd.h; None where that ABI lacks the call). Each gets EPERM, so callers see an
# ordinary permission error.
_BLOCKED: tuple[tuple[str, int, int | None], ...] = (
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
    # channels, userfaultfd to widen race windows, io_uring which also sidesteps syscall filters,
    # sockets included); Python code has no use for them.
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
    # Counted per user up every enclosing user namespace, and the host's limits have no capability
    # bypass: when ipybox runs as root, 128 inotify instances (fs.inotify.max_user_instances), 128
    # fanotify groups or 800 KiB of POSIX message queues held in the sandbox leave every root
    # process on the host without. No rlimit bounds the first two; message queues are also
    # charged to RLIMIT_MSGQUEUE, which root processes on the host compare against the total.
    ("inotify_init", 253, None),
    ("inotify_init1", 294, 26),
    ("fanotify_init", 300, 262),
    ("mq_open", 240, 180),
)
BLOCKED_SYSCALLS = tuple(name for name, _, _ in _BLOCKED)

# socket() and socketpair(): number on x86_64, on aarch64. The rules below apply to both.
_SOCKET_CALLS = ((41, 198), (53, 199))
# The socket families the sandbox may create; for some, the types and protocols it may name.
# Unix sockets carry the kernel's ZMQ and the tool socket; inet sockets the loopback forwarder and
# anything talking to it; route netlink is how glibc lists interfaces and addresses (getifaddrs,
# if_nameindex, getaddrinfo's AI_ADDRCONFIG). Every other family gets EAFNOSUPPORT, as on a kernel
# built without it: AF_VSOCK would reach the hypervisor past the network namespace, and a family the
# running kernel lacks makes the host load its module (AF_ALG, AF_RDS, AF_TIPC...). Inet sockets
# likewise load a module for any (type, protocol) pair the kernel has not registered (SCTP, DCCP,
# L2TP, or TCP named with a datagram type), so only the built-in pairs pass: 0 picks TCP or UDP by
# type, ICMP is the unprivileged ping socket. Other pairs and types get EPROTONOSUPPORT and
# ESOCKTNOSUPPORT (raw sockets need CAP_NET_RAW anyway); netlink takes raw and datagram types.
_AF_NETLINK = 16  # socket.AF_NETLINK is missing off Linux
_NETLINK_ROUTE = 0
# Per family: None (any type and protocol), or the protocols allowed with each type.
_SOCKET_RULES: dict[int, dict[int, tuple[int, ...]] | None] = {
    socket.AF_UNIX: None,
    socket.AF_INET: {
        socket.SOCK_STREAM: (0, socket.IPPROTO_TCP),
        socket.SOCK_DGRAM: (0, socket.IPPROTO_UDP, socket.IPPROTO_ICMP),
    },
    socket.AF_INET6: {
        socket.SOCK_STREAM: (0, socket.IPPROTO_TCP),
        socket.SOCK_DGRAM: (0, socket.IPPROTO_UDP, socket.IPPROTO_ICMPV6),
    },
    _AF_NETLINK: {socket.SOCK_RAW: (_NETLINK_ROUTE,), socket.SOCK_DGRAM: (_NETLINK_ROUTE,)},
}
SOCKET_FAMILIES = tuple(_SOCKET_RULES)
# The type argument also carries SOCK_NONBLOCK and SOCK_CLOEXEC; the type is its low bits.
_SOCK_TYPE_MASK = 0xF

# The seccomp architecture token per machine, and which of _BLOCKED's numbers it uses.
_ARCHES: dict[str, tuple[int, int]] = {
    "x86_64": (0xC000003E, 0),  # AUDIT_ARCH_X86_64
    "aarch64": (0xC00000B7, 1),  # AUDIT_ARCH_AARCH64
}

# On x86_64, syscall numbers with this bit set are the x32 ABI: same calls, other numbers.
_X32_BIT = 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# Offsets in struct seccomp_data: the syscall number, the architecture, and the low 32 bits of
# each argument (both machines are little-endian; the kernel reads these arguments as int).
_NR = 0
_ARCH = 4


def _arg(index: int) -> int:
    return 16 + 8 * index


class _Program:
    """Classic BPF with named jump targets, resolved when the program is assembled."""

    def __init__(self) -> None:
        self._items: list[tuple[int, int, str | None, str | None] | str] = []

    def label(self, name: str) -> None:
        self._items.append(name)

    def op(self, code: int, k: int = 0) -> None:
        self._items.append((code, k, None, None))

    def jump(self, code: int, k: int, true: str | None, false: str | None = None) -> None:
        """A conditional jump; None falls through to the next instruction."""
        self._items.append((code, k, true, false))

    def ret(self, value: int) -> None:
        self.op(_RET_K, value)

    def assemble(self) -> bytes:
        where: dict[str, int] = {}
        insns: list[tuple[int, int, str | None, str | None]] = []
        for item in self._items:
            if isinstance(item, str):
                where[item] = len(insns)
            else:
                insns.append(item)
        out = bytearray()
        for pc, (code, k, true, false) in enumerate(insns):
            # Jumps are relative to the next instruction, forward only, at most 255 ahead.
            jt, jf = ((where[t] - pc - 1) if t is not None else 0 for t in (true, false))
            assert 0 <= jt <= 255 and 0 <= jf <= 255, (pc, true, false)
            out += struct.pack("=HBBI", code, jt, jf, k)
        return bytes(out)


@functools.cache
def syscall_filter(machine: str | None = None) -> bytes | None:
    """The filter program for this machine, or None where ipybox has no syscall table for it.

    Calls of another architecture (i386 ``int 0x80`` on x86_64, arm32 on aarch64) and of the x32
    ABI get ENOSYS: the numbers above would not match them, and Python never makes them (nor could
    the argument checks on ``socket`` see through i386's ``socketcall``).
    """
    found = _ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    arch, column = found
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.jump(_JEQ_K, arch, None, "enosys")
    p.op(_LD_W_ABS, _NR)
    p.jump(_JGE_K, _X32_BIT, "enosys")
    for numbers in _SOCKET_CALLS:
        p.jump(_JEQ_K, numbers[column], "socket")
    for _, *numbers in _BLOCKED:
        nr = numbers[column]
        if nr is not None:
            p.jump(_JEQ_K, nr, "eperm")
    p.ret(_RET_ALLOW)
    # socket(domain, type, protocol) and socketpair(domain, type, protocol, sv): the family, then
    # the type and the protocol where the family has rules for them.
    p.label("socket")
    p.op(_LD_W_ABS, _arg(0))
    for family, rule in _SOCKET_RULES.items():
        p.jump(_JEQ_K, family, "allow" if rule is None else f"family-{family}")
    p.ret(_RET_ERRNO | errno.EAFNOSUPPORT)
    for family, rule in _SOCKET_RULES.items():
        if rule is None:
            continue
        p.label(f"family-{family}")
        p.op(_LD_W_ABS, _arg(1))
        p.op(_ALU_AND_K, _SOCK_TYPE_MASK)
        for kind in rule:
            p.jump(_JEQ_K, kind, f"protocol-{family}-{kind}")
        p.ret(_RET_ERRNO | errno.ESOCKTNOSUPPORT)
        for kind, protocols in rule.items():
            p.label(f"protocol-{family}-{kind}")
            p.op(_LD_W_ABS, _arg(2))
            for protocol in protocols:
                p.jump(_JEQ_K, protocol, "allow")
            p.ret(_RET_ERRNO | errno.EPROTONOSUPPORT)
    p.label("allow")
    p.ret(_RET_ALLOW)
    p.label("eperm")
    p.ret(_RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.ret(_RET_ERRNO | errno.ENOSYS)
    return p.assemble()


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
