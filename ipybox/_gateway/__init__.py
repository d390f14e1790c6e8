"""Kernels on a Jupyter Kernel Gateway or Enterprise Gateway, driven through its REST API and websocket.

- `._gatewaykernel`: `GatewayKernel`, the public configuration (no third-party imports), and
  `._opening`: it as a kernel source (the settings it runs with, opening a kernel on it).
- `._remotekernel`: `RemoteKernel`, a running remote kernel behind the same `KernelHandle` as a
  local one (needs the ``gateway`` extra: ``httpx`` and ``websockets``).
- `._link`: `Link`, the websocket to a kernel's channels, opened again after a loss, and the
  host's messages waiting for it; `._recovery`: `Recovery`, the kernel's checks once it is reopened.
- `._bridge`: `ToolBridge`, which carries the remote kernel's tool calls to the host's ToolServer.
- `._push`: the cells that make ``ipybox_kernel`` and the generated tool modules importable there.
- `._transfer`: upload and download over the kernel protocol; `._isolationcheck`: the start-time
  check that the kernel cannot see the gateway's other kernels or its token.
"""
