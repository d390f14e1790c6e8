"""`GatewayKernel`: where and how to start an executor's kernel on a Jupyter (Enterprise) Gateway."""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ipybox._exceptions import UsageError

if TYPE_CHECKING:
    from ipybox._kernel import KernelHandle, KernelHost
    from ipybox._settings import KernelSettings

__all__ = ("GatewayKernel",)


@dataclass(frozen=True, slots=True)
class GatewayKernel:
    """Run the executor's kernel on Jupyter Kernel Gateway or Jupyter Enterprise Gateway.

    Pass it as ``CodeExecutor(kernel=GatewayKernel(...))``. The kernel is started with the gateway's
    REST API (``POST /api/kernels``), driven over its websocket, and deleted when the executor stops
    or replaces it. Tool calls from kernel code come back to the host over that websocket and are
    approved on the host as for a local kernel. A lost websocket is opened again to the same kernel
    within ``reconnect_timeout``, and the running execution goes on with the output the gateway kept
    meanwhile; a kernel that cannot be reached again fails the execution with
    `KernelConnectionLost` and is replaced. See the "Remote kernels" page of the documentation for
    what differs (the sandbox is the gateway's: a Kubernetes pod, say).

    Needs the ``gateway`` extra (``pip install 'ipybox[gateway]'``).

    Args:
        url: The gateway's base URL, ``http://`` or ``https://`` (a path prefix is kept).
        token: The gateway's auth token, sent as ``Authorization: token ...`` (None: no header).
        kernel_name: The kernelspec to start.
        headers: More HTTP headers for every request and the websocket (e.g. for a proxy).
        env: Variables for the kernel's start request. Enterprise Gateway passes ``KERNEL_*``
            variables to its launcher and pod template (``KERNEL_NAMESPACE``, ``KERNEL_UID``, ...);
            Kernel Gateway passes only those its ``env_whitelist`` allows.
        push_sources: Send ``ipybox_kernel`` into the kernel at each start, through cells. False:
            the kernel image provides it, and the start fails unless its sources are the host's
            (install the host's ipybox version in the image). The generated tool modules are the
            host's and are always sent.
        request_timeout: Seconds one REST request, or one attempt to reopen the websocket, may take.
        reconnect_timeout: Seconds to spend reopening a lost websocket to the same kernel (same
            kernel id and session, so the gateway replays what it buffered meanwhile) before the
            kernel is given up for lost. 0: give it up at once, as a kernel that died.
        transfer_timeout: Seconds the kernel may take to answer one request of an upload or
            download (one chunk of at most 1 MiB); then it is interrupted (restarted if it does not
            stop) and the transfer fails with `FileTransferError`.
        allow_unisolated_kernel: Start the kernel even when it can read other kernels' connection
            files, see their processes or the gateway's token. False (the default): each new kernel
            is asked what it can see, before anything of the host reaches it, and one that sees any
            of these is refused with `KernelStartError`, as on a stock Kernel Gateway whose kernels
            all run as its user (see "Isolating kernels on Kernel Gateway" in the documentation).
            True only where every kernel on the gateway is trusted.
    """

    url: str
    token: str | None = field(default=None, repr=False)
    kernel_name: str = "python3"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    push_sources: bool = True
    request_timeout: float = 30.0
    reconnect_timeout: float = 30.0
    transfer_timeout: float = 60.0
    allow_unisolated_kernel: bool = False

    def __post_init__(self) -> None:
        parts = urlsplit(self.url) if isinstance(self.url, str) else None  # pyright: ignore[reportUnnecessaryIsInstance]
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"GatewayKernel url must be an http:// or https:// URL with a host, got {self.url!r}")
        if parts.query or parts.fragment:
            raise UsageError(f"GatewayKernel url must not have a query or fragment, got {self.url!r}")
        if self.token is not None and (not isinstance(self.token, str) or not self.token):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError("GatewayKernel token must be a non-empty string or None")
        if not isinstance(self.kernel_name, str) or not self.kernel_name:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(f"GatewayKernel kernel_name must be a non-empty string, got {self.kernel_name!r}")
        for what in ("headers", "env"):
            given: object = getattr(self, what)
            if not isinstance(given, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str)
                for k, v in given.items()  # pyright: ignore[reportUnknownVariableType]
            ):
                raise UsageError(f"GatewayKernel {what} must map str to str, got {given!r}")
            # A private copy: the caller's dict changing later must not change a frozen config.
            object.__setattr__(self, what, MappingProxyType(dict(given)))  # pyright: ignore[reportUnknownArgumentType]
        for what in ("request_timeout", "transfer_timeout"):
            seconds: object = getattr(self, what)
            if not isinstance(seconds, (int, float)) or not seconds > 0:
                raise UsageError(f"GatewayKernel {what} must be a positive number of seconds, got {seconds!r}")
        reconnect = self.reconnect_timeout
        if isinstance(reconnect, bool) or not isinstance(reconnect, int | float) or not 0 <= reconnect < math.inf:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise UsageError(
                "GatewayKernel reconnect_timeout must be a finite number of seconds, 0 or more (0 turns reconnecting "
                f"off), got {reconnect!r}"
            )

    # -- the kernel source (`ipybox._kernel.KernelSource`) ------------------------------------

    @property
    def remote(self) -> bool:
        """Always: the kernel does not see the host's workspace or environment."""
        return True

    def settings_for(self, requested: KernelSettings) -> KernelSettings:
        """The executor's settings without a local sandbox (the gateway's is the kernel's).

        Raises:
            UsageError: A `SandboxConfig` or a skills directory was asked for, or the ``gateway``
                extra is not installed.
        """
        from ._opening import gateway_settings

        return gateway_settings(self, requested)

    def open(self, host: KernelHost) -> AbstractAsyncContextManager[KernelHandle]:
        """Start and prepare a kernel on the gateway (see `KernelSource.open`)."""
        from ._opening import open_gateway_kernel

        return open_gateway_kernel(self, host)

    @property
    def base(self) -> str:
        """The URL without a trailing slash."""
        return self.url.rstrip("/")

    def http_headers(self) -> dict[str, str]:
        """The headers of every request: ``headers`` and the token."""
        headers = dict(self.headers)
        if self.token is not None:
            headers["Authorization"] = f"token {self.token}"
        return headers
