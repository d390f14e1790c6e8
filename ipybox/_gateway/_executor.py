"""What `CodeExecutor` does differently when its kernel runs on a gateway (kept out of its module)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from ipybox._config import Limits, SandboxConfig
from ipybox._exceptions import UsageError
from ipybox._gateway._config import GatewayKernel
from ipybox._kernel import KernelHandle, message_limit

__all__ = ("check_gateway", "open_gateway_kernel", "refuse_remote")


def check_gateway(
    kernel: object, sandbox: SandboxConfig | Literal["auto"] | None, *, pool: object, skills_dir: object
) -> GatewayKernel | None:
    """``CodeExecutor(kernel=...)`` checked against the executor's other settings.

    Raises:
        UsageError: ``kernel`` is not a `GatewayKernel`, a local sandbox, a pool or a skills
            directory was asked for with it, or the ``gateway`` extra is not installed.
    """
    if kernel is None:
        return None
    if not isinstance(kernel, GatewayKernel):
        raise UsageError(f"kernel must be a GatewayKernel or None (a local kernel), got {kernel!r}")
    if pool is not None or skills_dir is not None:
        raise UsageError(
            "a GatewayKernel cannot be combined with pool or skills_dir: the gateway starts the kernel, "
            "which cannot come from a KernelPool on this host nor mount its skills directory; drop them, "
            "or drop kernel= to run the kernel here"
        )
    if isinstance(sandbox, SandboxConfig):
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
    return kernel


def refuse_remote(gateway: GatewayKernel | None, method: str) -> None:
    """Refuse a `CodeExecutor` method that works on the host's environment when the kernel is remote.

    Raises:
        UsageError: The kernel runs on a gateway.
    """
    if gateway is not None:
        raise UsageError(
            f"CodeExecutor.{method}() works on the host's workspace and environment, which a kernel on the "
            f"gateway {gateway.base} does not see; install packages in the kernel's image"
        )


@asynccontextmanager
async def open_gateway_kernel(
    gateway: GatewayKernel,
    *,
    limits: Limits,
    start_timeout: float,
    tool_socket: Path,
    token: str,
    tools_dir: Path | None,
) -> AsyncGenerator[KernelHandle]:
    """Start and prepare a kernel on the gateway (see `ipybox._gateway._client.RemoteKernel`)."""
    # Imported here: httpx and websockets are the gateway extra's, and slow to import.
    from ipybox._gateway._client import RemoteKernel
    from ipybox._gateway._push import setup_cells

    cells = setup_cells(
        tools_dir=tools_dir,
        token=token,
        output_chars=limits.output_chars,
        message_bytes=message_limit(limits.output_chars),
        push=gateway.push_sources,
    )
    async with RemoteKernel.start(
        gateway, limits=limits, start_timeout=start_timeout, tool_socket=tool_socket, setup=cells
    ) as kernel:
        yield kernel
