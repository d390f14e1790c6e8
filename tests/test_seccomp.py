"""The sandbox's seccomp program, run through a small classic-BPF interpreter for each machine.

The hostile suite checks the filter in a real sandbox on this machine (x86_64); this checks the
program's jumps and numbers for every blocked call on both supported machines.
"""

# The per-machine tables are private; the test checks them against the kernel's numbering.
# pyright: reportPrivateUsage=false

from __future__ import annotations

import struct

import pytest

from ipybox.sandbox._seccomp import _BLOCKED, BLOCKED_SYSCALLS, syscall_filter

ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Calls every Python process makes: read, write, openat, getpid, clone, exit_group.
EVERYDAY = {"x86_64": (0, 1, 257, 39, 56, 231), "aarch64": (63, 64, 56, 172, 220, 94)}
I386 = 0x40000003


def evaluate(program: bytes, arch: int, nr: int) -> int:
    """What the kernel's seccomp would return for syscall ``nr`` of architecture ``arch``."""
    data = struct.pack("=iI", nr, arch) + bytes(56)  # struct seccomp_data: nr, arch, ip, args
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
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
        assert evaluate(program, ARCH[machine], x86_64 if machine == "x86_64" else aarch64) == EPERM, name
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
