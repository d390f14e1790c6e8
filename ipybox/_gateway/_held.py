"""`HeldKernel`: a kernel on a gateway that a suspended execution left blocked in its tool calls.

A host that suspends an execution (`CodeExecutor.suspend`) closes its websocket to the kernel without
deleting it; the kernel stays blocked in the calls that wait for approval, under a hold that ends its
process when the suspension's ttl runs out (ipybox_kernel._remote). The gateway keeps what the kernel
sends meanwhile for the websocket's session. A host that resumes the execution opens the same kernel
with the same session (`ipybox._gateway._remotekernel.RemoteKernel.attach`), checks that the same
kernel process answers, releases the hold (once: a second host is refused), and carries on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ipybox._exceptions import KernelStartError

__all__ = ("HeldCall", "HeldKernel", "HeldLost")


@dataclass(frozen=True, slots=True)
class HeldCall:
    """A tool call the kernel waits in: the bridge's id for it and its request line as the host got it."""

    call_id: str
    line: str


@dataclass(frozen=True, slots=True)
class HeldKernel:
    """Where a suspended execution waits: everything needed to re-attach, and nothing secret."""

    url: str
    """The gateway's base URL, as the suspending host's `GatewayKernel` had it."""
    kernel_id: str
    session: str
    """The Jupyter session of the suspending host's websocket: the gateway replays to it."""
    kernel_session: str
    """The kernel process's own session id: another one means the kernel was restarted."""
    msg_id: str
    """The execute request of the suspended execution."""
    calls: tuple[HeldCall, ...]


class HeldLost(KernelStartError):
    """The held kernel cannot be re-attached: gone, restarted, expired, or resumed by another host."""
