"""Network egress for the sandboxed kernel: an allowlist enforced by a proxy on the host.

The public names (`Network`, `NetworkEvent`, `NetworkRequest`, exported by ``ipybox`` too) are
imported on first use, so naming `Network` does not load the proxy. See ``docs/network.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipybox._lazy import lazy_names

if TYPE_CHECKING:
    from ._policy import Network as Network
    from ._policy import NetworkEvent as NetworkEvent
    from ._request import NetworkRequest as NetworkRequest

_LAZY = {
    "Network": "._policy",
    "NetworkEvent": "._policy",
    "NetworkRequest": "._request",
}

__all__ = ("Network", "NetworkEvent", "NetworkRequest")

if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, _LAZY)
