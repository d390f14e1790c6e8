"""Deadlines for waits that end on an event, stretched by how busy the machine is when they start.

A wait that takes a second on a quiet 2-core machine can take a minute while eight other test runs
share it; a fixed deadline then fails a test that had nothing wrong. The load average (runnable
processes per core, over the last minute) is measured when the wait starts.
"""

from __future__ import annotations

import os

__all__ = ("patient",)


def patient(seconds: float) -> float:
    """``seconds`` (a deadline that suits a quiet machine), times the load per core when above 1."""
    load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(1.0, load_per_core)
