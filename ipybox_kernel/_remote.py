"""Tool calls from a kernel that runs on a remote gateway, carried over the kernel protocol itself.

A kernel on Jupyter Kernel Gateway or Enterprise Gateway has no path to the host's tool socket, and
must not get a network path to the host. Its only link is the gateway's websocket, which carries
Jupyter messages, so a call travels as two of them:

- the request: a ``comm_msg`` on IOPub for comm ``ipybox-tools`` with ``{"id", "line"}`` (``line``
  is the same JSON line the local transport writes to the socket);
- the answer: an ``ipybox_tool_reply`` message on the control channel, ``{"id", "ack": true}`` when
  the host has the request and ``{"id", "line"}`` with the reply line. ipykernel handles control
  messages on its own thread, so the answer arrives while the cell's thread waits in the call.

The gateway may drop IOPub messages under its rate limit (jupyter_server's default counts comms), so
a request the host has not acknowledged is sent again; the host ignores an id it already has. A
cancelled call (KeyboardInterrupt, a cancelled ``acall_tool``) sends ``{"id", "cancel": true}``,
which cancels its approval or MCP call on the host.

The host's cell that runs `install` sets ``IPYBOX_TOOL_TRANSPORT=kernel``, which
makes `ipybox_kernel.call_tool` take this path. The comm id and the reply's message type are
``ipybox_kernel._protocol``'s, which the host imports too.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from ._protocol import COMM_ID, HOLD_REPLY_TYPE, HOLD_TYPE, REPLY_TYPE, TOKEN_ENV, TRANSPORT_ENV, TRANSPORT_KERNEL

__all__ = ("install", "round_trip")

# Seconds without the host's acknowledgement before a request is sent again: long enough that a
# busy gateway is not flooded, short enough that a dropped request costs little.
_RESEND_AFTER = 1.0


class PendingCall:
    """One call waiting for the host's answer; set by the control thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.acked = False
        self.reply: bytes | None = None

    def abort(self) -> None:
        self.done.set()


_calls: dict[str, PendingCall] = {}
# Requests sent again for want of an acknowledgement, over the kernel's life (for diagnosis).
resent = 0
_lock = threading.Lock()
_kernel: Any = None
# The timer that ends this kernel's process when a suspended execution's hold runs out (`_on_hold`).
_hold: threading.Timer | None = None
# Whether a host has taken the current hold over (`_on_hold`): once per hold.
_hold_taken = False
# How the process ends when its hold runs out: the code is never resumed, and nothing of it may run on.
_HOLD_EXPIRED_STATUS = 75
# The largest request message the kernel may send (the output guard drops larger ones, and the host
# refuses them); None without a limit.
_message_bytes: int | None = None


def install(output: int | None, message_bytes: int | None) -> None:
    """Set up a running remote kernel for ipybox: the tool transport and the output guards.

    Called by the host's start-up cell, once per kernel.
    """
    global _kernel, _message_bytes
    import os

    from IPython import get_ipython

    # Imported now, before user code can change the working directory it records (the files
    # the host uploads and downloads are relative to it).
    from . import _files  # noqa: F401  # pyright: ignore[reportUnusedImport]
    from ._launch import prepare

    shell: Any = get_ipython()
    kernel: Any = shell.kernel
    kernel.control_handlers[REPLY_TYPE] = _on_answer
    kernel.control_handlers[HOLD_TYPE] = _on_hold
    # ipykernel sleeps before each execute_reply for front ends that stop at the reply; the host
    # reads on until the idle status (as ipybox_kernel._launch sets for local kernels).
    kernel._execute_sleep = 0
    prepare(shell, kernel, kernel.session, output, message_bytes, drain=None)
    _kernel, _message_bytes = kernel, message_bytes
    os.environ[TRANSPORT_ENV] = TRANSPORT_KERNEL


def round_trip(server_name: str, tool_name: str, line: bytes, abort: Any) -> bytes | None:
    """Send one request line to the host and return its reply line (None: cancelled).

    ``abort`` is the caller's `ipybox_kernel._transport.Abort` or None.

    Raises:
        ValueError: The request is larger than the host takes from this kernel (the message says so).
        RuntimeError: `install` has not run in this kernel.
    """
    kernel = _kernel
    if kernel is None:
        raise RuntimeError("the remote tool transport is not installed in this kernel")
    call_id = uuid.uuid4().hex
    content = {"comm_id": COMM_ID, "data": {"id": call_id, "line": line.rstrip(b"\n").decode()}}
    size = len(json.dumps(content))
    if _message_bytes is not None and size > _message_bytes:
        raise ValueError(
            f"the request for tool {tool_name!r} of {server_name!r} is {size} bytes as a kernel message; a remote "
            f"kernel sends at most {_message_bytes} bytes per message (pass large data as a file, or raise "
            "Limits.output_chars)"
        )
    call = PendingCall()
    with _lock:
        _calls[call_id] = call
    parent = kernel.get_parent()
    try:
        if abort is not None and not abort.attach(call):
            return None
        _send(kernel, content, parent)
        while not call.done.wait(_RESEND_AFTER):
            if not call.acked:
                global resent
                resent += 1
                _send(kernel, content, parent)
        if call.reply is None:
            _send(kernel, {"comm_id": COMM_ID, "data": {"id": call_id, "cancel": True}}, parent)
        return call.reply
    except BaseException:
        # KeyboardInterrupt while waiting: the host cancels the approval or call it is making.
        _send(kernel, {"comm_id": COMM_ID, "data": {"id": call_id, "cancel": True}}, parent)
        raise
    finally:
        with _lock:
            _calls.pop(call_id, None)


def _send(kernel: Any, content: dict[str, Any], parent: Any) -> None:
    kernel.session.send(kernel.iopub_socket, "comm_msg", content, parent=parent, ident=f"comm-{COMM_ID}".encode())


def _on_answer(_stream: Any, _ident: Any, msg: dict[str, Any]) -> None:
    """ipykernel's control handler for `REPLY_TYPE`; runs on the control thread."""
    content: Any = msg.get("content")
    if not isinstance(content, dict):
        return
    fields: dict[str, Any] = content  # pyright: ignore[reportUnknownVariableType]
    with _lock:
        call = _calls.get(str(fields.get("id")))
    if call is None:
        return  # a late answer to a call that was cancelled
    line = fields.get("line")
    if isinstance(line, str):
        _end_hold()
        call.reply = line.encode() + b"\n"
        call.done.set()
    elif fields.get("ack") is True:
        call.acked = True


def _on_hold(stream: Any, ident: Any, msg: dict[str, Any]) -> None:
    """ipykernel's control handler for `HOLD_TYPE`: hold a suspended execution, or release it once.

    ``hold`` starts a timer that ends the kernel's process after ``ttl`` seconds: a suspended
    execution nobody resumed must not keep the kernel (and the call it blocks in) for ever, and must
    not go on without its host either. ``release`` installs the resuming host's tool token; it
    succeeds once per hold, so a second host resuming the same execution is refused. The timer runs
    on until a pending call is answered (`_on_answer`): a host that took the hold over and was lost
    before answering leaves the kernel to end at the ttl all the same. ``drop`` takes a hold no host
    has taken over back (the suspending host found a call decided meanwhile).
    """
    global _hold, _hold_taken
    content: Any = msg.get("content")
    fields: dict[str, Any] = content if isinstance(content, dict) else {}  # pyright: ignore[reportUnknownVariableType]
    op, ok = fields.get("op"), False
    with _lock:
        if op == "hold" and isinstance(fields.get("ttl"), (int, float)) and fields["ttl"] > 0:
            if _hold is not None:
                _hold.cancel()
            _hold = threading.Timer(float(fields["ttl"]), _expire)
            _hold.daemon = True
            _hold.start()
            _hold_taken, ok = False, True
        elif op == "release" and isinstance(fields.get("token"), str) and _hold is not None and not _hold_taken:
            import os

            os.environ[TOKEN_ENV] = fields["token"]
            _hold_taken, ok = True, True
        elif op == "drop" and _hold is not None and not _hold_taken:
            _hold.cancel()
            _hold, ok = None, True
    if _kernel is not None:
        _kernel.session.send(stream, HOLD_REPLY_TYPE, {"ok": ok}, msg, ident)


def _end_hold() -> None:
    """A pending call was answered: the execution goes on, and no hold ends the kernel any more."""
    global _hold
    with _lock:
        if _hold is not None:
            _hold.cancel()
            _hold = None


def _expire() -> None:
    """The hold ran out before any host resumed it: end the process (the gateway may start a fresh one)."""
    import os

    with _lock:
        if _hold is not threading.current_thread():
            return  # released (or held anew) just now
        # Under the lock: no release can succeed between this check and the end.
        os._exit(_HOLD_EXPIRED_STATUS)
