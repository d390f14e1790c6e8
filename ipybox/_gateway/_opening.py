"""`GatewayKernel` as a kernel source: the settings it runs with, and opening a kernel on it."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from ipybox._exceptions import UsageError
from ipybox._gateway._gatewaykernel import GatewayKernel
from ipybox._gateway._held import HeldKernel
from ipybox._kernel import KernelHandle, KernelHost, message_limit
from ipybox._settings import KernelSettings, SandboxConfig

__all__ = ("gateway_settings", "open_gateway_kernel", "open_held_kernel")


def gateway_settings(gateway: GatewayKernel, requested: KernelSettings) -> KernelSettings:
    """An executor's settings for a kernel on ``gateway`` (`GatewayKernel.settings_for`).

    Raises:
        UsageError: A local sandbox or a skills directory was asked for, or the ``gateway`` extra is
            not installed.
    """
    if requested.skills_dir is not None:
        raise UsageError(
            "a GatewayKernel cannot be combined with skills_dir: the gateway starts the kernel, which cannot "
            "mount a skills directory of this host; drop skills_dir, or drop kernel= to run the kernel here"
        )
    if isinstance(requested.sandbox, SandboxConfig):
        raise UsageError(
            "a SandboxConfig applies to local kernels only; a kernel on a gateway runs in the gateway's sandbox "
            "(a Kubernetes pod, say): leave sandbox at 'auto' with kernel=GatewayKernel(...)"
        )
    missing = [name for name in ("httpx", "websockets") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"GatewayKernel needs {' and '.join(missing)}: install ipybox with the gateway extra "
            "(pip install 'ipybox[gateway]')"
        )
    return dataclasses.replace(requested, sandbox=None)


@asynccontextmanager
async def open_gateway_kernel(gateway: GatewayKernel, host: KernelHost) -> AsyncGenerator[KernelHandle]:
    """Start and prepare a kernel on the gateway (see `ipybox._gateway._remotekernel.RemoteKernel`)."""
    # Imported here: httpx and websockets are the gateway extra's, and slow to import.
    from ipybox._gateway._push import setup_cells
    from ipybox._gateway._remotekernel import RemoteKernel

    limits = host.settings.limits
    tools = host.settings.tools_dir
    cells = setup_cells(
        tools_dir=tools if tools is not None and tools.is_dir() else None,
        token=host.token,
        output_chars=limits.output_chars,
        message_bytes=message_limit(limits.output_chars),
        push=gateway.push_sources,
    )
    async with RemoteKernel.start(
        gateway, limits=limits, start_timeout=host.start_timeout, tool_socket=host.tool_socket, setup=cells
    ) as kernel:
        yield kernel


@asynccontextmanager
async def open_held_kernel(gateway: GatewayKernel, held: HeldKernel, host: KernelHost) -> AsyncGenerator[KernelHandle]:
    """Re-attach to the kernel a suspended execution left on the gateway (see `RemoteKernel.attach`).

    Nothing is pushed into it: it holds the suspending host's ipybox_kernel and tool modules, and its
    only new setting is this host's tool token.
    """
    from ipybox._gateway._remotekernel import RemoteKernel

    async with RemoteKernel.attach(
        gateway,
        held,
        limits=host.settings.limits,
        attach_timeout=host.start_timeout,
        tool_socket=host.tool_socket,
        token=host.token,
    ) as kernel:
        yield kernel
