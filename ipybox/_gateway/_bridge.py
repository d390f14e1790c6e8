"""`ToolBridge`: tool calls from a remote kernel, fed to the host's ToolServer unchanged.

The kernel's requests arrive as comm messages on the gateway's websocket (ipybox_kernel._remote).
For each one the bridge opens a connection to the executor's own tool socket, writes the request
line exactly as a local kernel would, and sends the reply line back to the kernel as a control
message. The ToolServer therefore checks, approves and runs a remote call as it does a local one;
a cancelled call (interrupted cell, lost connection) closes its socket connection, which the
ToolServer takes as a hang-up and cancels the approval or MCP call it is making.

Everything in a request comes from kernel code: ids and lines are bounded, a resent id is
acknowledged again but not run twice, and the calls in flight at once are capped.
"""

from __future__ import annotations

import logging
import socket
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from ipybox._toolserver._channel import MAX_REPLY_BYTES, ToolErrorReply, encode_reply
from ipybox._toolserver._server import MAX_CONNECTIONS
from ipybox._unixsocket import connect_socket

__all__ = ("MAX_ANSWER_BYTES", "ToolBridge")

logger = logging.getLogger(__name__)

# Tornado, under both gateways, refuses websocket messages over 10 MiB from the host by default
# (``websocket_max_message_size``): a larger reply would break the connection to the kernel.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Ids the kernel makes are 32 hex digits; anything longer is not from ipybox_kernel.
_MAX_ID_CHARS = 64
# Ids of finished calls remembered, so that a request resent before its acknowledgement arrived
# is not run again.
_FINISHED_KEPT = 1024
_RECEIVE_CHUNK = 256 * 1024

Answer = Callable[[dict[str, Any]], None]
"""Sends one answer (``{"id", "ack"}`` or ``{"id", "line"}``) to the kernel."""


class ToolBridge:
    """Carries one remote kernel's tool-call requests to a ToolServer's socket and the replies back.

    Args:
        socket_path: The ToolServer's unix socket.
        answer: Sends an answer to the kernel (never blocks).
        task_group: Runs the calls; cancelling it cancels them.
        max_calls: Calls in flight at once; more are refused with an error reply.
    """

    def __init__(
        self, socket_path: Path, answer: Answer, task_group: anyio.abc.TaskGroup, *, max_calls: int = MAX_CONNECTIONS
    ) -> None:
        self._socket_path = socket_path
        self._answer = answer
        self._tg = task_group
        self._max_calls = max_calls
        self._calls: dict[str, anyio.CancelScope] = {}
        # The request line of each call in flight, as received: what a suspended execution hands on.
        self._lines: dict[str, str] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        # Set when the next call in flight ends (`call_end`), then replaced.
        self._ended = anyio.Event()

    def receive(self, data: Mapping[str, Any]) -> None:
        """Take one message of the kernel's tool comm: a request, a resent request, or a cancellation."""
        call_id = data.get("id")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= _MAX_ID_CHARS:
            return
        if data.get("cancel") is True:
            scope = self._calls.get(call_id)
            if scope is not None:
                scope.cancel()
            return
        line = data.get("line")
        if not isinstance(line, str):
            return
        if call_id in self._calls:
            self._answer({"id": call_id, "ack": True})  # resent before our acknowledgement arrived
            return
        if call_id in self._finished:
            return
        if "\n" in line or len(self._calls) >= self._max_calls:
            message = (
                "a tool-call request must be one line"
                if "\n" in line
                else f"a remote kernel may make at most {self._max_calls} tool calls at once; wait for some to finish"
            )
            error = ToolErrorReply(seq=None, error="bad_request" if "\n" in line else "too_large", message=message)
            self._answer({"id": call_id, "line": encode_reply(error).decode().rstrip("\n")})
            self._finish(call_id)
            return
        scope = self._calls[call_id] = anyio.CancelScope()
        self._lines[call_id] = line
        self._answer({"id": call_id, "ack": True})
        self._tg.start_soon(self._carry, call_id, line, scope)

    def in_flight(self) -> list[tuple[str, str]]:
        """The calls in flight: each one's id and request line, as the kernel sent them."""
        return list(self._lines.items())

    def call_end(self) -> anyio.Event:
        """Set when a call in flight next ends (take it before looking at `in_flight`, so no end is missed)."""
        return self._ended

    def cancel_all(self) -> None:
        """Cancel every call in flight (the kernel is gone)."""
        for scope in self._calls.values():
            scope.cancel()

    async def _carry(self, call_id: str, line: str, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                reply = await self._round_trip(line.encode(errors="surrogatepass") + b"\n")
                if len(reply) > MAX_ANSWER_BYTES:
                    error = ToolErrorReply(
                        seq=None,
                        error="too_large",
                        message=(
                            f"the tool's result is {len(reply)} bytes as JSON; a remote kernel receives at most "
                            f"{MAX_ANSWER_BYTES} bytes per result (ask the tool for less)"
                        ),
                    )
                    reply = encode_reply(error)
                self._answer({"id": call_id, "line": reply.decode().rstrip("\n")})
        finally:
            self._calls.pop(call_id, None)
            self._lines.pop(call_id, None)
            self._finish(call_id)
            self._ended.set()
            self._ended = anyio.Event()

    def _finish(self, call_id: str) -> None:
        self._finished[call_id] = None
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)

    async def _round_trip(self, line: bytes) -> bytes:
        """Write the request line to the ToolServer and read its reply line; an error reply if it cannot."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            try:
                await connect_socket(sock, str(self._socket_path))
                view = memoryview(line)
                while view:
                    try:
                        view = view[sock.send(view) :]
                    except BlockingIOError:
                        await anyio.wait_writable(sock)
                buffer = bytearray()
                while not buffer.endswith(b"\n"):
                    if len(buffer) > MAX_REPLY_BYTES + _RECEIVE_CHUNK:
                        raise OSError("the tool server's reply is over its own limit")
                    try:
                        data = sock.recv(_RECEIVE_CHUNK)
                    except BlockingIOError:
                        await anyio.wait_readable(sock)
                        continue
                    if not data:
                        raise OSError("the tool server closed the connection")
                    buffer += data
                return bytes(buffer)
            except OSError as exc:
                logger.warning("a remote kernel's tool call could not reach the tool server: %s", exc)
                error = ToolErrorReply(
                    seq=None, error="internal", message=f"the host's tool server could not be reached ({exc})"
                )
                return encode_reply(error)
        finally:
            sock.close()
