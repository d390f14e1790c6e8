"""A process's resident memory, from ``/proc/<pid>/status``, for tests that bound it."""

from __future__ import annotations

from pathlib import Path


def resident(pid: int | str = "self") -> int:
    """The process's resident memory now, in bytes."""
    return _status_kib(pid, "VmRSS") * 1024


def resident_peak(pid: int | str = "self") -> int:
    """The process's peak resident memory since `reset_resident_peak`, in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


def reset_resident_peak(pid: int | str = "self") -> None:
    # Writing 5 resets the peak resident size to the current one (Linux 4.0 and later).
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _status_kib(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")
