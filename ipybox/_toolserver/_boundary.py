"""The one boundary where foreign errors of a tool call become ipybox's.

Whatever a tool call runs into on the host (the MCP SDK's errors, anyio's broken streams, httpx2 and
OS errors, timeouts, a bug in a built-in tool) passes through `tool_errors` and comes out as a
`ToolCallFailed` that names the call and the kind of failure; the tool server turns it into that
call's error reply and keeps serving. Code that needs to react to one kind (a crashed session, say)
catches `ToolCallFailed` and looks at ``kind``, never at foreign exception types.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import cast

import anyio
import httpx2
from mcp import MCPError
from mcp_types import CONNECTION_CLOSED

from ipybox._exceptions import IpyboxError

from ._channel import ErrorKind, ToolErrorReply

__all__ = ("ToolCallFailed", "tool_errors")

logger = logging.getLogger(__name__)


class ToolCallFailed(IpyboxError):
    """A tool call failed on the host, or was not made; carried to the kernel as an error reply.

    Attributes:
        kind: The reply's `ErrorKind`; the kernel raises the matching ``ipybox_kernel`` error.
        message: Names the call and, where there is one, what to change.
        reason: For ``rejected``: the reason the application gave.
        timeout: For ``timeout``: the limit that was exceeded, in seconds.
        output: For ``server_start`` and ``server_crashed``: the tail of the server's stderr.
        close: The connection is closed after the reply (the request cannot be trusted).
        seq: The request's sequence number, when it is known although the request was refused.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        reason: str | None = None,
        timeout: float | None = None,
        output: str | None = None,
        close: bool = False,
        seq: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.reason = reason
        self.timeout = timeout
        self.output = output
        self.close = close
        self.seq = seq

    def reply(self, seq: int | None) -> ToolErrorReply:
        """The error reply for the request with this sequence number."""
        return ToolErrorReply(
            seq=seq,
            error=self.kind,
            message=self.message,
            reason=self.reason,
            timeout=self.timeout,
            output=self.output,
        )


def tool_errors(what: str) -> AbstractContextManager[None]:
    """Turn any exception raised inside into `ToolCallFailed` whose message starts with ``what``.

    A connection that ended (the server exited, the stream broke) is ``server_crashed``; an error
    the server sent back, an ipybox error or an OS error is ``tool_error``; a timeout is
    ``timeout``; anything else is a bug on the host: ``internal``, logged with its traceback and
    told to the kernel by type only (its text may hold host details).

    Args:
        what: The call or step, e.g. ``"github.search_issues"``; starts every message.
    """
    return _ToolErrors(what)


class _ToolErrors(AbstractContextManager[None]):
    """`tool_errors`: a class rather than a generator, since every tool call enters several (a
    generator's context manager costs a generator and two resumptions each)."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def __exit__(self, kind: type[BaseException] | None, caught: BaseException | None, tb: object) -> bool:
        if caught is None or isinstance(caught, ToolCallFailed) or not isinstance(caught, Exception):
            return False
        exc = _leaf(caught)
        raise _translate(self._what, exc) from exc


def _leaf(exc: Exception) -> BaseException:
    # Task groups of the transports (and of built-in tools) wrap the one error that matters.
    leaf: BaseException = exc
    while isinstance(leaf, BaseExceptionGroup):
        leaf = cast("BaseExceptionGroup[BaseException]", leaf).exceptions[0]
    return leaf


def _translate(what: str, exc: BaseException) -> ToolCallFailed:
    if isinstance(exc, MCPError):
        if exc.code == CONNECTION_CLOSED:
            return ToolCallFailed("server_crashed", f"{what}: the connection to the server ended ({exc.message})")
        return ToolCallFailed("tool_error", f"{what} was refused by the server: {exc.message}")
    if isinstance(exc, anyio.BrokenResourceError | anyio.ClosedResourceError | anyio.EndOfStream):
        return ToolCallFailed("server_crashed", f"{what}: the connection to the server ended")
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        logger.warning("%s timed out on the host", what, exc_info=exc)
        return ToolCallFailed("timeout", f"{what} timed out on the host")
    if isinstance(exc, IpyboxError):
        return ToolCallFailed("tool_error", f"{what} failed: {exc}")
    if isinstance(exc, httpx2.HTTPError):
        return ToolCallFailed("tool_error", f"{what} failed on the host: {type(exc).__name__}: {exc}")
    if isinstance(exc, OSError):
        logger.warning("%s failed on the host", what, exc_info=exc)
        # The message and path can name host files; the error's description cannot.
        return ToolCallFailed("tool_error", f"{what} failed on the host: {exc.strerror or type(exc).__name__}")
    logger.error("%s failed on the host", what, exc_info=exc)
    return ToolCallFailed(
        "internal", f"{what} failed on the host ({type(exc).__name__}); the host's log has the details"
    )
