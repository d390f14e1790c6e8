"""The kernel's host side: where an executor's kernels come from, and the host's client of each.

- `._source`: `KernelSource`, where an executor's kernels come from, and `KernelHost`, what the
  executor gives each of them; `._local`: `LocalKernel`, the default source; `._pool`: `KernelPool`;
  `._inprocess`: the in-process kernel of `ipybox.testing` (a gateway's source is `ipybox._gateway`).
- `._side`: `KernelSide`, what the executor keeps on the host for its kernels; `._home`: a kernel's
  environment, mounts and private directory; `._supervisor`: one kernel kept running.
- `._zmqkernel`: `Kernel`, which starts the (optionally sandboxed) kernel process, runs code and
  watches the process; `._process`: its interpreter and finding its process inside the sandbox;
  `._leftrunning`: the threads and processes earlier code actions left in it.
- `._zmtp`: the host's end of each channel, a ZMTP reader of ipybox's own that measures what the
  kernel sends before holding it; `._messages`: checking, budgeting and parsing the Jupyter messages
  into typed events.
- `._requests`: `Requests`, the Jupyter request layer (execute, evaluate, interrupt, the inboxes of
  waiting requests) over a channel transport: `Kernel`'s ZMTP channels, or a gateway's websocket.
- `._handle`: `KernelHandle`, what the executor needs of any kernel (local, or on a gateway).
"""

from __future__ import annotations

from ._handle import KernelHandle
from ._messages import Display, Dropped, Error, KernelEvent, Mark, Reply, Stream, message_limit, strip_ansi
from ._process import bytecode_missing, default_python
from ._source import KernelHost, KernelSource, StartedHome
from ._zmqkernel import SANDBOX_SOCKET_DIR, Kernel

__all__ = (
    "SANDBOX_SOCKET_DIR",
    "Display",
    "Dropped",
    "Error",
    "Kernel",
    "KernelEvent",
    "KernelHandle",
    "KernelHost",
    "KernelSource",
    "Mark",
    "Reply",
    "StartedHome",
    "Stream",
    "bytecode_missing",
    "default_python",
    "message_limit",
    "strip_ansi",
)
