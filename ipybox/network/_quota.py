"""How much of the host's log kernel code can fill: warnings the network proxy logs, rate-limited.

Kernel code makes refused connections as fast as it likes, and each refusal is a warning: left
alone, a loop fills the host's log (and whatever ships it). `LogQuota` lets the first `BURST` of
every `INTERVAL` through and counts the rest; the count is logged as one line when the next
interval's first warning comes, and when the proxy says so (`flush`: a code action ended, the proxy
stopped). ``Network.on_event`` still sees every event.
"""

from __future__ import annotations

import logging
import math
import time

__all__ = ("BURST", "INTERVAL", "LogQuota")

BURST = 20
INTERVAL = 60.0


class LogQuota:
    """Decides which of a proxy's warnings are logged; one per proxy."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._start = -math.inf
        self._logged = 0
        self.suppressed = 0

    def allow(self) -> bool:
        """Whether to log the warning at hand; if not, it is counted."""
        now = time.monotonic()
        if now - self._start >= INTERVAL:
            self.flush()
            self._start, self._logged = now, 0
        if self._logged < BURST:
            self._logged += 1
            return True
        self.suppressed += 1
        return False

    def flush(self) -> None:
        """Log how many warnings were not logged since the last time, if any."""
        if self.suppressed:
            self._logger.warning(
                "%d more network warnings (refused connections, limits) were not logged: at most %d are "
                "logged per %g s; Network.on_event sees every event",
                self.suppressed,
                BURST,
                INTERVAL,
                extra={"network_suppressed": self.suppressed},
            )
            self.suppressed = 0
