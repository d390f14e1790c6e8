"""What a kernel with network egress gets from its executor: the proxy socket and where it is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ipybox._exceptions import UsageError
from ipybox._settings import SandboxConfig
from ipybox_kernel._protocol import NET_SOCKET_ENV

from ._policy import Network

__all__ = ("NET_SOCKET", "check_network", "network_env", "with_network_mount")

# The proxy's socket in the executor's private directory.
NET_SOCKET = "net.sock"


def check_network(network: object, sandbox: SandboxConfig | None) -> Network | None:
    """``CodeExecutor(network=...)`` checked against the sandbox setting.

    Raises:
        UsageError: ``network`` is not a `Network` or None, or there is no sandbox to enforce it.
    """
    if network is None:
        return None
    if not isinstance(network, Network):
        raise UsageError(f"network must be a Network or None, got {network!r}")
    if sandbox is None:
        raise UsageError(
            "network= needs the sandbox: without one the kernel already has this host's whole network "
            "and no allowlist can hold; drop sandbox=None, or drop network="
        )
    return network


def network_env(home: Path) -> dict[str, str]:
    """Tells the kernel's launcher to start its forwarder to the proxy socket."""
    return {NET_SOCKET_ENV: str(home / NET_SOCKET)}


def with_network_mount(sandbox: SandboxConfig | None, home: Path) -> SandboxConfig | None:
    """``sandbox`` with the proxy socket mounted read-only (the kernel may connect, not replace it)."""
    if sandbox is None:
        return None
    return dataclasses.replace(sandbox, ro_paths=[*sandbox.ro_paths, home / NET_SOCKET])
