"""The host's network proxy for one executor: the sandboxed kernel's only way out.

The kernel keeps its empty network namespace. A forwarder thread in the kernel
(``ipybox_kernel._netproxy``) listens on the sandbox's own loopback, where ``HTTP_PROXY`` and its
siblings point, and hands every connection to this proxy over a unix socket in the executor's
private directory (mounted read-only into the sandbox, like the tool socket). Per connection the
proxy

1. checks the executor's token (the connection's first line) and that a code action is running,
2. reads one HTTP/1.1 request head with h11 (`._head`): ``CONNECT host:port`` (a tunnel: TLS
   stays end-to-end, nothing is intercepted) or an absolute-form ``GET http://host/...``,
3. decides: listed in `Network.allow`, allowed for the executor by an earlier answer, or else
   denied or asked (a `NetworkRequest` through the executor's approval machinery),
4. resolves the name on the host and checks every address (`Network.refusal`), then connects to
   a checked address itself, so a second resolution can never lead elsewhere (no DNS rebinding),
5. relays bytes both ways, within the byte budget of the execution and the idle timeout, and
   closes the connection when its execution ends.

Everything on the socket comes from kernel code: a bad token, a malformed or oversized request head
or a refused destination ends that connection only (with a 4xx/5xx reply whose reason phrase says
why, which clients show in their errors), never the proxy.
"""

from __future__ import annotations

import hmac
import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from ipybox._approval._decisions import ApprovalDecision
from ipybox._exceptions import UsageError
from ipybox._unixsocket import ServedSocket

from ._head import Refused, Target, error_reply, read_head
from ._policy import IPAddress, Network, NetworkEvent, parse_ip
from ._quota import LogQuota

__all__ = ("Asker", "NetworkProxy")

logger = logging.getLogger("ipybox.network")

# What one read of the relay moves.
_CHUNK = 64 * 1024
# Connections over max_connections still served, to be told why they are refused (HTTP 503).
_PENDING_EXTRA = 32
_STRAY = (
    "no code action of this executor is running; connections are only made for the running code "
    "action (threads or tasks left running after theirs ended cannot connect)"
)
_LEVELS = {"allowed": logging.INFO, "closed": logging.DEBUG, "asked": logging.INFO, "answered": logging.INFO}


Asker = Callable[[str, int, str, "int | None"], Awaitable[ApprovalDecision]]
"""Decides a connection to an unlisted ``host``, ``port`` for an execution (policy, callback or event),
given the line of the code action the kernel says made it (None: it said none; kernel code's word,
see `_check_token`)."""
# What may follow the token on the first line: the calling line, a decimal of at most 9 digits.
_LINE = re.compile(rb"[1-9][0-9]{0,8}")


@dataclass
class _Usage:
    """One execution's connections and bytes."""

    bytes: int = 0
    over: bool = False
    scopes: set[anyio.CancelScope] = field(default_factory=set[anyio.CancelScope])
    rejected: dict[tuple[str, int], str] = field(default_factory=dict[tuple[str, int], str])
    """Destinations the application rejected during the execution, and its reason."""

    def take(self, wanted: int, limit: float) -> int:
        """Count up to ``wanted`` bytes against ``limit`` before they are sent; how many fit."""
        granted = int(min(wanted, max(0, limit - self.bytes)))
        self.bytes += granted
        return granted


class NetworkProxy:
    """Serves one executor's kernel: HTTP forward proxying within a `Network` policy.

    Args:
        network: The policy and limits.
        socket_path: Where to bind the unix socket (mode 0600) the kernel's forwarder connects to.
        token: The secret the forwarder sends first on every connection.
        running: The id of the execution running now (None between executions).
        ask: Decides connections to unlisted destinations when the policy asks.
        listener: A listening socket already bound at ``socket_path`` (a pooled kernel's, bound before
            the kernel started so that its sandbox could mount it), served instead of binding one.
            The proxy owns it from then on.
        observe: Told of every `NetworkEvent` before ``Network.on_event`` (the executor's account
            and span of the running code action); must not raise.
    """

    def __init__(
        self,
        network: Network,
        *,
        socket_path: Path,
        token: str,
        running: Callable[[], str | None],
        ask: Asker,
        listener: socket.socket | None = None,
        observe: Callable[[NetworkEvent], None] | None = None,
    ) -> None:
        self.network = network
        self._observe = observe
        self._token = token.encode()
        self._running = running
        self._ask = ask
        self._usage: dict[str, _Usage] = {}
        self._quota = LogQuota(logger)
        self._remembered: set[tuple[str, int]] = set()
        self._open = 0
        self._socket = ServedSocket(socket_path, self._serve_socket, listener=listener, what="network")

    @property
    def socket_path(self) -> Path:
        return self._socket.path

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; ready once the socket accepts connections."""
        self._socket.bind()
        try:
            async with anyio.create_task_group() as tg:
                self._socket.start(tg)
                task_status.started()
        finally:
            self._quota.flush()
            self._socket.stop()

    def rebind(self) -> None:
        """Bind the socket file again if it is gone (see `ToolServer.rebind`)."""
        self._socket.rebind()

    # -- following the kernel (a pooled kernel comes with its own socket and token) ------------

    def move(self, socket_path: Path, token: str, *, listener: socket.socket | None = None) -> None:
        """Serve at ``socket_path`` with ``token`` from now on, for a kernel started with them, and
        stop listening where the proxy listened before (see `ToolServer.move`).

        Connections already past the token check stay until their execution ends; new ones must
        bring ``token``. ``listener``, if given, is already bound there and is owned by the proxy.

        Raises:
            UsageError: The proxy is not running, or the socket path is unusable.
            OSError: The socket could not be bound, or its file is gone.
        """
        if not self._socket.serving:
            raise UsageError("move() needs a running NetworkProxy ('await task_group.start(proxy.run)')")
        self._socket.move(socket_path, listener=listener)
        self._token = token.encode()

    def bytes_moved(self, execution_id: str) -> int:
        """Bytes the execution's connections moved so far, both ways (0 once it ended)."""
        usage = self._usage.get(execution_id)
        return 0 if usage is None else usage.bytes

    def end_execution(self, execution_id: str) -> None:
        """Close the execution's connections and forget its byte count."""
        usage = self._usage.pop(execution_id, None)
        if usage is not None:
            for scope in usage.scopes:
                scope.cancel()
        self._quota.flush()

    async def _serve_socket(self, sock: socket.socket) -> None:
        if self._open >= self.network.max_connections + _PENDING_EXTRA:
            # Past the limit even the 503 reply waits its turn: a flood of connections that send
            # nothing would otherwise hold a task each until its connect timeout.
            sock.close()
            return
        self._open += 1
        try:
            stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
        except BaseException:
            self._open -= 1
            raise
        await self._serve(stream)

    # -- one connection ------------------------------------------------------------------------

    async def _serve(self, stream: anyio.abc.UNIXSocketStream) -> None:
        target: Target | None = None
        execution: str | None = None
        try:
            async with stream:
                try:
                    with anyio.fail_after(self.network.connect_timeout):
                        buffered, line = await self._check_token(stream)
                        target, rest = await read_head(stream, buffered)
                    execution = self._running()
                    if execution is None:
                        raise Refused(403, _STRAY)
                    usage = self._usage.setdefault(execution, _Usage())
                    if self._open > self.network.max_connections:
                        raise Refused(
                            503,
                            f"the executor has {self.network.max_connections} network connections open, its "
                            "limit (Network.max_connections); close some first",
                            kind="limit",
                        )
                    if usage.over:
                        raise Refused(403, self._over_reason(), kind="limit")
                    with anyio.CancelScope() as scope:
                        usage.scopes.add(scope)
                        try:
                            await self._open_and_relay(stream, target, rest, execution, usage, line)
                        finally:
                            usage.scopes.discard(scope)
                except Refused as refused:
                    if target is not None:
                        self._emit(refused.kind, target, execution, reason=refused.reason)
                    elif self._quota.allow():
                        logger.warning("network connection refused before its request: %s", refused.reason)
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        await stream.send(error_reply(refused.status, refused.reason))
                except TimeoutError:
                    reason = f"no answer within {self.network.connect_timeout:g} s (Network.connect_timeout)"
                    if target is not None:
                        self._emit("limit", target, execution, reason=reason)
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        await stream.send(error_reply(504, reason))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
            pass  # the kernel hung up; nothing to tell it
        except Exception:  # a task of the proxy's group: one connection's fault must not end the proxy
            if self._quota.allow():
                logger.exception("serving a network connection from the kernel failed; it was closed")
        finally:
            self._open -= 1

    async def _check_token(self, stream: anyio.abc.SocketStream) -> tuple[bytes, int | None]:
        """The bytes after the first line, and the line of the code action the forwarder says opened
        the connection (``token LINE``; ipybox_kernel._netproxy). The line is kernel code's word,
        anything but a plain number is none; the host shows it only as a line of its own copy of
        the running code (ipybox._engine._callsite)."""
        data = b""
        while b"\n" not in data:
            if len(data) > 256:
                raise Refused(400, "the connection did not start with the forwarder's token")
            data += await stream.receive(256)
        first, rest = data.split(b"\n", 1)
        token, _, said = first.strip().partition(b" ")
        if not hmac.compare_digest(token, self._token):
            raise Refused(403, "wrong or missing token: connect through HTTP_PROXY, not to the proxy socket")
        return rest, int(said) if _LINE.fullmatch(said) else None

    async def _open_and_relay(
        self,
        stream: anyio.abc.SocketStream,
        target: Target,
        rest: bytes,
        execution: str,
        usage: _Usage,
        line: int | None,
    ) -> None:
        # Not under the connect timeout: an asked destination waits for a person, as long as the
        # executor's approval timeout allows.
        await self._decide(target, execution, usage, line)
        with anyio.fail_after(self.network.connect_timeout):
            upstream, address = await self._connect(target)
        self._emit("allowed", target, execution, address=str(address))
        moved = [0]
        async with upstream:
            if target.connect:
                await stream.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                # What came with the head is forwarded like any other bytes: counted first.
                await self._relay(stream, upstream, target.head + rest, target, execution, usage, moved)
            finally:
                self._emit("closed", target, execution, address=str(address), moved=moved[0])

    async def _decide(self, target: Target, execution: str, usage: _Usage, line: int | None) -> None:
        host, port = target.host, target.port
        if self.network.listed(host, port) or (host, port) in self._remembered:
            return
        if self.network.unlisted == "deny":
            raise Refused(
                403,
                f"{host}:{port} is not in this executor's network allowlist (Network.allow); the "
                "application must list it",
            )
        if (host, port) in usage.rejected:
            # Code that retries a rejected destination in a loop (or a client's own retries) would
            # otherwise put the same question to a person again and again.
            raise Refused(
                403,
                f"the application rejected the connection to {host}:{port} earlier in this code action"
                f"{usage.rejected[host, port]}; it is asked again in the next code action",
            )
        self._emit("asked", target, execution)
        decision = await self._ask(host, port, execution, line)
        self._emit("answered", target, execution, reason=decision.reason or ("approved" if decision.approved else None))
        if not decision.approved:
            why = f": {decision.reason}" if decision.reason else ""
            usage.rejected[host, port] = why
            raise Refused(403, f"the application rejected the connection to {host}:{port}{why}")
        if decision.remember:
            self._remembered.add((host, port))

    async def _connect(self, target: Target) -> tuple[anyio.abc.SocketStream, IPAddress]:
        host, port = target.host, target.port
        literal = parse_ip(host) or self.network.pinned.get(host)
        if literal is not None:
            addresses: list[IPAddress | None] = [literal]
        else:
            try:
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise Refused(502, f"the host cannot resolve {host} ({exc.strerror or exc})") from None
            addresses = list(dict.fromkeys(parse_ip(str(info[4][0]).split("%")[0]) for info in infos))
        refused: list[str] = []
        failed: list[str] = []
        for address in addresses:
            if address is None:
                continue
            problem = self.network.refusal(address, port)
            if problem is not None:
                refused.append(problem)
                continue
            try:
                return await anyio.connect_tcp(str(address), port), address
            except OSError as exc:
                failed.append(f"connecting to {address} failed ({exc.strerror or exc})")
        if refused and not failed:
            raise Refused(403, f"{host} leads only to non-public addresses ({'; '.join(refused)})")
        raise Refused(502, f"cannot connect to {host}:{port}: {'; '.join(failed + refused) or 'no address'}")

    async def _relay(
        self,
        client: anyio.abc.SocketStream,
        upstream: anyio.abc.SocketStream,
        first: bytes,
        target: Target,
        execution: str,
        usage: _Usage,
        moved: list[int],
    ) -> None:
        """Move bytes both ways, starting with ``first`` (from the client); ``moved[0]`` counts them.

        Every byte is counted against the execution's budget before it is sent: past it only the
        part that fits goes out, and the execution's connections are closed.
        """
        idle = self.network.idle_timeout
        limit = math.inf if self.network.max_bytes is None else self.network.max_bytes
        # Every chunk moves the deadline on: it expires only when both directions were quiet.
        with anyio.CancelScope(deadline=anyio.current_time() + idle) as quiet:
            async with anyio.create_task_group() as tg:
                finished = 0

                async def pump(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream, data: bytes) -> None:
                    nonlocal finished
                    with suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        while True:
                            fits = usage.take(len(data), limit)
                            if fits:
                                moved[0] += fits
                                await dst.send(data[:fits])
                                quiet.deadline = anyio.current_time() + idle
                            if fits < len(data):
                                self._over(usage, target, execution, moved[0])
                                return
                            data = await src.receive(_CHUNK)
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        await dst.send_eof()
                    finished += 1
                    if finished == 2:
                        tg.cancel_scope.cancel()

                tg.start_soon(pump, client, upstream, first)
                tg.start_soon(pump, upstream, client, b"")
        if quiet.cancelled_caught:
            self._emit("limit", target, execution, reason=f"idle for {idle:g} s (Network.idle_timeout)", moved=moved[0])

    def _over(self, usage: _Usage, target: Target, execution: str, moved: int) -> None:
        if not usage.over:
            usage.over = True
            self._emit("limit", target, execution, reason=self._over_reason(), moved=moved)
        for scope in usage.scopes:
            scope.cancel()

    def _over_reason(self) -> str:
        return (
            f"this code action moved more than {self.network.max_bytes} bytes through the network "
            "(Network.max_bytes); its connections were closed"
        )

    def _emit(
        self,
        kind: Any,
        target: Target,
        execution: str | None,
        *,
        address: str | None = None,
        reason: str | None = None,
        moved: int = 0,
    ) -> None:
        event = NetworkEvent(
            kind=kind,
            host=target.host,
            port=target.port,
            execution_id=execution,
            address=address,
            reason=reason,
            bytes=moved,
        )
        level = _LEVELS.get(kind, logging.WARNING)
        if level < logging.WARNING or self._quota.allow():
            logger.log(
                level,
                "network %s %s:%s%s",
                kind,
                f"[{target.host}]" if ":" in target.host else target.host,
                target.port,
                f" ({reason})" if reason else "",
                extra={"network_event": asdict(event)},
            )
        if self._observe is not None:
            self._observe(event)
        callback: Callable[[NetworkEvent], object] | None = self.network.on_event
        if callback is not None:
            try:
                callback(event)
            except Exception:  # the application's callback: logged, and the decision stands
                if self._quota.allow():
                    logger.exception("Network.on_event failed")
