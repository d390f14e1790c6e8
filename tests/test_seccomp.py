"""The sandbox's seccomp program, run through a small classic-BPF interpreter for each machine.

The hostile suite checks the filter in a real sandbox on this machine (x86_64); this checks the
program's jumps and numbers for every blocked call on both supported machines.
"""

# The per-machine tables are private; the test checks them against the kernel's numbering.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import errno
import socket
import struct

import pytest

from ipybox.sandbox._seccomp import _BLOCKED, BLOCKED_SYSCALLS, syscall_filter

ALLOW, ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Calls every Python process makes: read, write, openat, getpid, clone, exit_group.
EVERYDAY = {"x86_64": (0, 1, 257, 39, 56, 231), "aarch64": (63, 64, 56, 172, 220, 94)}
I386 = 0x40000003
# socket() and socketpair() per machine.
SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}
AF_VSOCK, AF_ALG, AF_NETLINK, NETLINK_AUDIT, IPPROTO_SCTP = 40, 38, 16, 9, 132


def evaluate(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's seccomp would return for syscall ``nr`` of architecture ``arch``."""
    # struct seccomp_data: nr, arch, instruction pointer, six 64-bit arguments.
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x15:  # jeq #k
            pc += jt if acc == k else jf
        elif code == 0x35:  # jge #k
            pc += jt if acc >= k else jf
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_blocked_call_gets_eperm_and_everyday_calls_are_allowed(machine: str) -> None:
    program = syscall_filter(machine)
    assert program is not None
    for name, x86_64, aarch64 in _BLOCKED:
        nr = x86_64 if machine == "x86_64" else aarch64
        if nr is not None:
            assert evaluate(program, ARCH[machine], nr) == EPERM, name
    for nr in EVERYDAY[machine]:
        assert evaluate(program, ARCH[machine], nr) == ALLOW, nr


def test_the_x32_abi_and_foreign_architectures_get_enosys() -> None:
    program = syscall_filter("x86_64")
    assert program is not None
    assert evaluate(program, ARCH["x86_64"], 0x40000000 | 39) == ENOSYS
    # ptrace by its i386 number, through int 0x80.
    assert evaluate(program, I386, 26) == ENOSYS


def test_a_machine_without_a_table_gets_no_filter() -> None:
    assert syscall_filter("riscv64") is None
    assert "ptrace" in BLOCKED_SYSCALLS


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_sockets_of_only_the_families_and_builtin_protocols_the_kernel_needs_can_be_made(machine: str) -> None:
    program = syscall_filter(machine)
    assert program is not None
    flags = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    allowed = [
        (socket.AF_UNIX, socket.SOCK_STREAM | flags, 0),
        (socket.AF_UNIX, socket.SOCK_SEQPACKET, 0),
        (socket.AF_INET, socket.SOCK_STREAM | flags, 0),
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP),
        (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP),
        (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        (socket.AF_INET6, socket.SOCK_DGRAM | flags, 0),
        (socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6),
        (AF_NETLINK, socket.SOCK_RAW | flags, 0),
        (AF_NETLINK, socket.SOCK_DGRAM, 0),
    ]
    refused = [
        ((AF_VSOCK, socket.SOCK_STREAM, 0), errno.EAFNOSUPPORT),
        ((AF_ALG, socket.SOCK_SEQPACKET, 0), errno.EAFNOSUPPORT),
        ((socket.AF_PACKET, socket.SOCK_RAW, 0), errno.EAFNOSUPPORT),
        # Only the low 32 bits are the family (the kernel reads an int): the high half cannot hide one.
        (((1 << 32) | AF_VSOCK, socket.SOCK_STREAM, 0), errno.EAFNOSUPPORT),
        ((AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT), errno.EPROTONOSUPPORT),
        ((socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SCTP), errno.EPROTONOSUPPORT),
        ((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_UDP), errno.EPROTONOSUPPORT),
        ((socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6), errno.EPROTONOSUPPORT),
        ((socket.AF_INET, socket.SOCK_SEQPACKET, 0), errno.ESOCKTNOSUPPORT),
        ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), errno.ESOCKTNOSUPPORT),
    ]
    for nr in SOCKET_CALLS[machine]:
        for args in allowed:
            assert evaluate(program, ARCH[machine], nr, args) == ALLOW, (nr, args)
        for args, error in refused:
            assert evaluate(program, ARCH[machine], nr, args) == ERRNO | error, (nr, args)
