"""A name lookup in a kernel without network says so, instead of reading as a passing DNS failure.

In the sandbox's empty network namespace every lookup fails with "Temporary failure in name
resolution", which invites code (and models) to retry. The wrapper keeps the error's type and
number, so code that handles it still does, and adds why and how the application can allow it.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ("explain_missing_network",)


def explain_missing_network() -> None:
    """Wrap ``socket.getaddrinfo`` when this kernel has no interface but loopback (a sandbox with no
    `Network`); kernels with a network keep it as it is."""
    if [name for _, name in socket.if_nameindex()] != ["lo"]:
        return
    lookup = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return lookup(host, *args, **kwargs)
        except socket.gaierror as exc:
            raise socket.gaierror(
                exc.errno,
                f"{exc.strerror} ({host!r}): this sandboxed kernel has no network; the application can "
                "allow destinations (CodeExecutor(network=Network(allow=[...])), or ipybox mcp --allow-net HOST)",
            ) from None

    socket.getaddrinfo = getaddrinfo
