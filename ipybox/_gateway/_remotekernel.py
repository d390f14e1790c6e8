"""A kernel on a Jupyter Kernel Gateway or Enterprise Gateway, behind the executor's `KernelHandle`.

Started with ``POST /api/kernels``, driven over ``/api/kernels/{id}/channels`` (one websocket that
carries shell, iopub and control messages as JSON with a ``channel`` field), deleted with ``DELETE``
when the executor stops or replaces it: a kernel is never left running on the gateway by a client
that ended normally (the gateway's culling covers clients that crashed).

Everything that arrives on the websocket is attacker-controlled (kernel code can publish any
message), and is held to the same bounds as a local kernel's (`ipybox._kernel._messages`): the
websocket refuses a message larger than `message_limit` (the connection ends and the kernel is
treated as lost, as a local kernel that breaks its channel is killed), a large message's JSON is
checked for its number of values before it is parsed, only the message kinds the host reads are
kept, output beyond an execution's budget is dropped, and each request's queue is bounded.

A lost websocket (a proxy's idle timeout, a load balancer, a network blip) is opened again to the
same kernel with the same session (`ipybox._gateway._link`), the gateway replays what the kernel sent
meanwhile, and the running execution goes on once the kernel is checked (`ipybox._gateway._recovery`).
A kernel that died, that the gateway no longer has, that restarted, whose reply was lost in flight,
or that cannot be reached within `GatewayKernel.reconnect_timeout` is lost for the executor: the
running execution fails with `KernelConnectionLost`, the remote kernel is deleted, and the next
execution gets a fresh one.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidHandshake, InvalidStatus

from ipybox._exceptions import KernelConnectionLost, KernelStartError
from ipybox._gateway._bridge import ToolBridge
from ipybox._gateway._gatewaykernel import GatewayKernel
from ipybox._gateway._held import HeldCall, HeldKernel, HeldLost
from ipybox._gateway._isolationcheck import check_expression, refusal
from ipybox._gateway._link import Link
from ipybox._gateway._recovery import Recovery
from ipybox._kernel._messages import (
    OUTPUT_TYPES,
    READ_TYPES,
    Error,
    Inbox,
    KernelEvent,
    Reply,
    message_limit,
)
from ipybox._kernel._requests import ChannelName, Requests
from ipybox._settings import Limits
from ipybox._toolserver._channel import MAX_JSON_VALUES
from ipybox._toolserver._parse import shape_problem
from ipybox_kernel._protocol import COMM_ID, HOLD_REPLY_TYPE, HOLD_TYPE, REPLY_TYPE

__all__ = ("RemoteKernel",)

logger = logging.getLogger(__name__)

# Room beyond `message_limit` for what the websocket's JSON adds to a Jupyter message (the channel
# name, a buffers list) and for a tool request, whose line the kernel bounds by the same limit.
_ENVELOPE_BYTES = 64 * 1024
# Messages smaller than this cannot hold enough JSON values to matter; larger ones are checked.
_SHAPE_CHECK_FROM = 64 * 1024
# The envelope adds a few levels (message, content, data) to what a tool request may nest.
_MAX_DEPTH = 64 + 8
# How long a kernel_info request goes unanswered before it is sent again (the gateway may still be
# connecting to the kernel's channels).
_READY_RETRY = 1.0
# Deleting a kernel normally takes a fraction of a second (the gateway asks it to shut down first).
_DELETE_TIMEOUT = 10.0
# The first wait before asking again to delete a kernel the gateway could not delete yet (doubling).
_DELETE_RETRY = 0.1


class RemoteKernel:
    """One kernel on a gateway. Create with ``async with RemoteKernel.start(...)``."""

    unseen = True

    def __init__(
        self,
        config: GatewayKernel,
        kernel_id: str,
        http: httpx.AsyncClient,
        limits: Limits,
        session: str | None = None,
    ) -> None:
        self.config = config
        self.kernel_id = kernel_id
        self._http = http
        self._message_limit = message_limit(limits.output_chars)
        self._bridge: ToolBridge | None = None
        self._deleted: anyio.Event | None = None
        # Set when a suspended execution leaves the kernel blocked for another host: nothing more is
        # sent to it, and it is not deleted.
        self._detached = False
        # Not deleted on exit: a held kernel this host has not (yet) taken over.
        self._kept = False
        self.exit_code: int | None = None
        self.stop_reason: str | None = None
        """Why the kernel is gone for the host, once it is."""
        self.exited = anyio.Event()
        self.closed = anyio.Event()
        """Set once the websocket is closed and the kernel deleted (or, held, left to the gateway)."""
        self._requests = Requests(
            self,
            budget=self._message_limit,
            exited=self.exited,
            lost=self.lost_error,
            new_msg_id=self.new_msg_id,
            forget=self._forget_answers,
        )
        self._waiters = self._requests.waiters
        self.link = Link(
            config,
            kernel_id,
            session or uuid.uuid4().hex,
            frame_limit=self.frame_limit,
            route=self._route,
            stopped=self.exited,
        )
        self._recovery = Recovery(
            self._waiters,
            budget=self._message_limit,
            message=self._message,
            queued=self.link.queued_ids,
            lose=self._lose,
            new_id=self.new_msg_id,
        )

    @property
    def frame_limit(self) -> int:
        """The largest websocket message the host takes from this kernel."""
        return self._message_limit + _ENVELOPE_BYTES

    def new_msg_id(self) -> str:
        return uuid.uuid4().hex

    def cpu_seconds(self) -> None:
        """None: the gateway's machine is out of the host's sight."""
        return None

    def live_tasks(self) -> None:
        """None: the gateway's machine is out of the host's sight."""
        return None

    def execute(self, code: str, *, msg_id: str | None = None, silent: bool = False) -> AsyncGenerator[KernelEvent]:
        """Run code and yield its events until the kernel is idle again.

        Raises:
            KernelConnectionLost: The websocket closed, or the kernel died, before the execution completed.
        """
        return self._requests.execute(code, msg_id=msg_id, silent=silent)

    async def evaluate(self, expressions: dict[str, str]) -> dict[str, object] | None:
        """Evaluate expressions in the kernel by a silent execute request without code, and return
        its reply's content unchecked (see `Requests.evaluate`; ipybox._gateway._transfer runs uploads
        and downloads with it).

        Raises:
            KernelConnectionLost: The kernel was lost before it replied.
        """
        return await self._requests.evaluate(expressions)

    def _forget_answers(self) -> None:
        # No request waits any more: the tool answers kept for a reconnection go with the last.
        self._recovery.forget_answers()

    def lost_error(self) -> KernelConnectionLost:
        return KernelConnectionLost(
            self.config.base, self.kernel_id, self.stop_reason or "the connection to the gateway ended"
        )

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running code (by a control message, as
        for a local kernel; the gateway passes it on)."""
        self._requests.interrupt()

    async def kill_and_wait(self) -> None:
        """Delete the kernel on the gateway (stopping whatever it runs) and mark it gone."""
        self._lose("the host stopped it")
        with anyio.CancelScope(shield=True):
            await self.delete()

    async def delete(self) -> None:
        """``DELETE`` the kernel on the gateway, once; failures are logged, not raised. A second caller
        waits for the first's request: `start` closes the HTTP client after this returns, and must not
        cut a deletion a transfer's `kill_and_wait` has under way."""
        if self._detached or self._kept:
            return
        if self._deleted is not None:
            await self._deleted.wait()
            return
        self._deleted = anyio.Event()
        url = f"{self.config.base}/api/kernels/{self.kernel_id}"
        try:
            with anyio.fail_after(_DELETE_TIMEOUT):
                response = await self._http.delete(url)
                wait = _DELETE_RETRY
                while response.status_code >= 500:
                    # The gateway refuses to delete a kernel it is restarting (its process died) with a
                    # 500; once restarted it would idle there until culled. Asked again, it goes.
                    await anyio.sleep(wait)
                    wait = min(wait * 2, _READY_RETRY)
                    response = await self._http.delete(url)
            if response.status_code not in (204, 404):
                logger.warning(
                    "deleting kernel %s on %s: HTTP %s", self.kernel_id, self.config.base, response.status_code
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            logger.warning("deleting kernel %s on %s failed: %r", self.kernel_id, self.config.base, exc)
        finally:
            self._deleted.set()

    # -- suspension (ipybox._gateway._held) ---------------------------------------------------------

    @property
    def kernel_session(self) -> str | None:
        """The kernel process's own session id (from its kernel_info_reply)."""
        session = self._recovery.kernel_session
        return session if isinstance(session, str) else None

    def in_flight(self) -> list[HeldCall]:
        """The tool calls of this kernel in flight on the host, as the kernel sent them."""
        return [] if self._bridge is None else [HeldCall(i, line) for i, line in self._bridge.in_flight()]

    def call_end(self) -> anyio.Event:
        """Set when a tool call of this kernel in flight on the host next ends (never without a bridge)."""
        return anyio.Event() if self._bridge is None else self._bridge.call_end()

    def follow(self, msg_id: str) -> AsyncGenerator[KernelEvent]:
        """The events of the execute request ``msg_id``, which an earlier host sent (see `attach`).

        Raises:
            KernelConnectionLost: The kernel was lost before the execution completed.
        """
        return self._requests.follow(msg_id)

    def feed(self, call: HeldCall) -> None:
        """Carry a call the kernel made to an earlier host as if it had just arrived here."""
        if self._bridge is not None:
            self._bridge.receive({"id": call.call_id, "line": call.line})

    async def hold(self, ttl: float) -> None:
        """Put the kernel under a hold that ends its process after ``ttl`` seconds unless a pending call
        is answered first (a suspended execution's handover; `let_go` then gives it up, or `unhold`
        takes the hold back).

        Raises:
            HeldLost: The kernel refused the hold or was lost meanwhile (it is then deleted as usual).
        """
        if not await self._hold_request({"op": "hold", "ttl": ttl}):
            raise HeldLost("the kernel did not take the hold (is its ipybox_kernel older than the host's?)")

    async def unhold(self) -> None:
        """Take a hold back (the suspension did not happen)."""
        await self._hold_request({"op": "drop"})

    def let_go(self) -> None:
        """Give a held kernel up for this host: nothing more is sent to it (no answer, no interrupt),
        its websocket closes, and it is not deleted: the gateway keeps it for the resuming host."""
        self._detached = True
        self._lose("its execution was suspended; the kernel is left to the host that resumes it")

    async def _hold_request(self, content: dict[str, Any]) -> bool:
        """Send a hold request on the control channel and wait for its reply; whether it succeeded."""
        msg_id = self.new_msg_id()
        inbox = self._requests.open(msg_id)
        try:
            self._send("control", HOLD_TYPE, content, msg_id)
            async for raw in inbox:
                if raw["header"]["msg_type"] == HOLD_REPLY_TYPE:
                    return raw["content"].get("ok") is True
        finally:
            self._requests.done(msg_id, inbox)
        raise HeldLost(
            f"the kernel was lost while it was asked to {content['op']} a suspended execution: {self.stop_reason}"
        )

    async def _take_over(self, held: HeldKernel, token: str, where: str) -> None:
        """Check that the held kernel process answers, and take its hold over (see `attach`)."""
        header = await self._control_info()
        if header.get("session") != held.kernel_session:
            raise HeldLost(
                f"{where} was restarted since the execution was suspended (its hold ran out, or its process "
                "died): its state is gone"
            )
        # Once per hold: a second host resuming the same execution is refused here.
        if not await self._hold_request({"op": "release", "token": token}):
            raise HeldLost(f"{where} holds no suspended execution any more: another host resumed it")
        self._recovery.kernel_session = held.kernel_session
        self._kept = False

    async def _control_info(self) -> dict[str, Any]:
        """The header of the kernel's reply to a kernel_info request on the control channel, which it
        answers while a cell runs."""
        msg_id = self.new_msg_id()
        inbox = self._requests.open(msg_id)
        try:
            self._send("control", "kernel_info_request", {}, msg_id)
            async for raw in inbox:
                if raw["header"]["msg_type"] == "kernel_info_reply":
                    return raw["header"]
        finally:
            self._requests.done(msg_id, inbox)
        raise HeldLost(f"the kernel was lost before it answered: {self.stop_reason}")

    # -- the websocket ----------------------------------------------------------------------------

    def _message(self, channel: str, msg_type: str, content: dict[str, Any], msg_id: str | None = None) -> str:
        header = {
            "msg_id": msg_id or self.new_msg_id(),
            "msg_type": msg_type,
            "session": self.link.session,
            "username": "ipybox",
            "version": "5.3",
            "date": "",
        }
        msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel}
        return json.dumps(msg)

    def send(self, channel: ChannelName, msg_type: str, content: dict[str, Any], msg_id: str) -> None:
        """Queue a request for the kernel (the `ChannelTransport` of this kernel's requests)."""
        self._send(channel, msg_type, content, msg_id)

    def _send(self, channel: str, msg_type: str, content: dict[str, Any], msg_id: str | None = None) -> str | None:
        """Queue a message for the kernel (written once the link is up); the message, unless the kernel is gone."""
        if self.exited.is_set() or self._detached:
            return None
        text = self._message(channel, msg_type, content, msg_id)
        refused = self.link.queue(msg_id, text)
        if refused is not None:
            self._lose(refused)
            return None
        return text

    def _answer_tool(self, answer: dict[str, Any]) -> None:
        text = self._send("control", REPLY_TYPE, answer)
        if text is not None and "line" in answer:
            self._recovery.keep_answer(text)

    async def _route(self, raw: str) -> None:
        if len(raw) > _SHAPE_CHECK_FROM and shape_problem(raw.encode(errors="replace"), _MAX_DEPTH, MAX_JSON_VALUES):
            return
        try:
            msg: object = json.loads(raw)
        except (ValueError, RecursionError):
            return
        if not isinstance(msg, dict):
            return
        fields = cast("dict[str, object]", msg)
        header, parent, content = fields.get("header"), fields.get("parent_header"), fields.get("content")
        if not isinstance(header, dict) or not isinstance(parent, dict) or not isinstance(content, dict):
            return
        header = cast("dict[str, object]", header)
        content = cast("dict[str, object]", content)
        kind = header.get("msg_type")
        if fields.get("channel") == "iopub":
            if kind == "comm_msg":
                data = content.get("data")
                if content.get("comm_id") == COMM_ID and isinstance(data, dict) and self._bridge is not None:
                    self._bridge.receive(cast("dict[str, Any]", data))
                return
            state = content.get("execution_state") if kind == "status" else None
            if state in ("restarting", "dead") or (state == "starting" and self.link.resumable):
                # The gateway restarts a kernel process that died; its state is gone all the same.
                self._lose(f"the kernel process on the gateway died or restarted (status {state!r})")
                return
        inbox = self._waiters.get(cast("dict[str, object]", parent).get("msg_id"))  # pyright: ignore[reportArgumentType]
        if inbox is None or (kind not in READ_TYPES and kind != HOLD_REPLY_TYPE):
            return
        size = len(raw)
        if kind in OUTPUT_TYPES:
            if size > inbox.budget:
                inbox.dropped += size
                return
            inbox.budget -= size
        await self._requests.deliver(inbox, {"header": header, "parent_header": parent, "content": content}, size)

    def _lose(self, reason: str) -> None:
        """The kernel is gone for the host: fail what waits on it, stop its tool calls."""
        if self.exited.is_set():
            return
        self.stop_reason = reason
        self.exited.set()
        self._requests.close_all()
        if self._bridge is not None:
            self._bridge.cancel_all()

    async def _wait_ready(self) -> None:
        """Return once the kernel answers a kernel_info request; the caller bounds the wait."""
        inbox = Inbox(self._message_limit)
        sent: list[str] = []
        try:
            while not self.exited.is_set():
                sent.append(self.new_msg_id())
                self._waiters[sent[-1]] = inbox
                self._send("shell", "kernel_info_request", {}, sent[-1])
                with anyio.move_on_after(_READY_RETRY):
                    async for raw in inbox:
                        if raw["header"]["msg_type"] == "kernel_info_reply":
                            self._recovery.kernel_session = raw["header"].get("session")
                            return
        finally:
            for msg_id in sent:
                self._waiters.pop(msg_id, None)
            inbox.close()
        raise KernelStartError(f"the kernel on the gateway was lost during start-up: {self.stop_reason}")

    async def _connect(self, ws: ClientConnection) -> None:
        """Serve the link until it is given up, then mark the kernel lost with the link's reason."""
        self._lose(await self.link.run(ws, self._recovery.resume))

    async def _check_isolation(self) -> None:
        """Refuse a kernel that can see the gateway's other kernels or its token (`_isolation`): before
        the setup cells, which hand it the executor's tool token."""
        refused = refusal(await self.evaluate({"r": check_expression()}), f"the gateway at {self.config.base}")
        if refused is not None:
            raise refused

    async def _run_setup(self, cell: str) -> None:
        # The error's name and value only: its traceback quotes the cell, which holds the tool token.
        errors: list[str] = []
        failed = False
        async for event in self.execute(cell, silent=True):
            if isinstance(event, Error):
                errors.append(f"{event.ename}: {event.evalue}")
            failed = failed or (isinstance(event, Reply) and event.status != "ok")
        if errors or failed:
            where = (
                "pushing ipybox_kernel and the tool modules, or installing the tool transport"
                if self.config.push_sources
                else "with push_sources=False, the kernel's image must provide ipybox_kernel, installed from the "
                "host's ipybox version"
            )
            detail = "; ".join(errors) or "the setup cell did not complete"
            raise KernelStartError(f"preparing the kernel on the gateway failed ({where}): {detail[:4000]}")

    # -- start-up -----------------------------------------------------------------------------------

    async def _close(self) -> None:
        """Give the kernel up and delete it (unless held for another host); then `closed` is set."""
        self._lose("the executor stopped or replaced it")
        with anyio.CancelScope(shield=True):
            await self.delete()
        self.closed.set()

    @asynccontextmanager
    async def _serving(
        self,
        ws: ClientConnection,
        tool_socket: Path,
        prepare: Callable[[], Awaitable[None]],
        *,
        deadline: float,
        late: KernelStartError,
    ) -> AsyncGenerator[None]:
        """Serve the websocket and the kernel's tool calls; run ``prepare`` by ``deadline`` (else raise
        ``late``), then hold the kernel ready while the block runs.

        Raises:
            KernelStartError: ``prepare`` raised it, or ``late``.
        """
        failure: KernelStartError | None = None
        async with ws, anyio.create_task_group() as tg:
            self._bridge = ToolBridge(tool_socket, self._answer_tool, tg)
            tg.start_soon(self._connect, ws)
            try:
                with anyio.fail_at(deadline):
                    await prepare()
            except TimeoutError:
                failure = late
            except KernelStartError as exc:
                failure = exc
            if failure is None:
                # From here on a lost connection is reopened (before, the start fails instead).
                self.link.resumable = True
                try:
                    yield
                finally:
                    self._lose("the executor stopped or replaced it")
                    tg.cancel_scope.cancel()
            else:
                self._lose("it did not start")
                tg.cancel_scope.cancel()
        # Raised out here: inside the task group it would come wrapped in a group.
        if failure is not None:
            raise failure

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        config: GatewayKernel,
        *,
        limits: Limits,
        start_timeout: float,
        tool_socket: Path,
        setup: Sequence[str],
    ) -> AsyncGenerator[RemoteKernel]:
        """Start a kernel on the gateway, prepare it with the ``setup`` cells, and delete it on exit.

        Raises:
            KernelStartError: The gateway refused or failed to start the kernel, the websocket could
                not be opened, or the kernel was not ready (setup included) within ``start_timeout``.
        """
        http_client = httpx.AsyncClient(headers=config.http_headers(), timeout=config.request_timeout, verify=_tls())
        async with http_client as http:
            # One deadline for the whole start: the request, the websocket, readiness and setup.
            deadline = anyio.current_time() + start_timeout
            kernel_id = await _create(http, config, start_timeout, deadline)
            kernel = cls(config, kernel_id, http, limits)
            try:
                try:
                    with anyio.fail_at(deadline):
                        ws = await kernel.link.open()
                except (OSError, InvalidHandshake, TimeoutError) as exc:
                    detail = (
                        f"HTTP {exc.response.status_code}" if isinstance(exc, InvalidStatus) else str(exc) or "timeout"
                    )
                    raise KernelStartError(
                        f"the gateway's websocket for kernel {kernel_id} could not be opened: {detail} (a gateway "
                        "that starts many kernels at once may need a longer Timeouts.start)"
                    ) from None

                async def prepare() -> None:
                    await kernel._wait_ready()
                    if not config.allow_unisolated_kernel:
                        await kernel._check_isolation()
                    for cell in setup:
                        await kernel._run_setup(cell)

                late = KernelStartError(f"the kernel on the gateway did not become ready within {start_timeout:g} s")
                async with kernel._serving(ws, tool_socket, prepare, deadline=deadline, late=late):
                    yield kernel
            finally:
                await kernel._close()

    @classmethod
    @asynccontextmanager
    async def attach(
        cls,
        config: GatewayKernel,
        held: HeldKernel,
        *,
        limits: Limits,
        attach_timeout: float,
        tool_socket: Path,
        token: str,
    ) -> AsyncGenerator[RemoteKernel]:
        """Re-attach to a kernel a suspended execution left blocked (`HeldKernel`), and release its hold.

        The execution's messages (those the gateway kept since the suspending host left, then live
        ones) go to `follow` ``held.msg_id``; ``token`` becomes the kernel's tool token. On exit the
        kernel is deleted, as one this host started. Each step is bounded by ``attach_timeout``.

        Raises:
            HeldLost: The gateway no longer has the kernel, another kernel process answers (it was
                restarted: its hold ran out, or the gateway restarted it), its hold was released
                already (another host resumed it), or it did not answer in time.
        """
        where = f"kernel {held.kernel_id} on {config.base}"
        http_client = httpx.AsyncClient(headers=config.http_headers(), timeout=config.request_timeout, verify=_tls())
        async with http_client as http:
            kernel = cls(config, held.kernel_id, http, limits, session=held.session)
            # Until its hold is released to this host, the kernel is not this host's to delete (another
            # host may have resumed it).
            kernel._kept = True
            # Before the websocket opens: the gateway replays what it kept for the session at once.
            kernel._requests.open(held.msg_id)
            try:
                try:
                    with anyio.fail_after(attach_timeout):
                        ws = await kernel.link.open()
                except InvalidStatus as exc:
                    status = exc.response.status_code
                    why = "it was deleted, culled, or lost by a gateway that restarted" if status == 404 else "refused"
                    raise HeldLost(f"{where} cannot be opened (HTTP {status}: {why})") from None
                except (OSError, InvalidHandshake, TimeoutError) as exc:
                    raise HeldLost(f"{where} cannot be reached: {exc or 'timeout'}") from None
                late = HeldLost(f"{where} did not answer within {attach_timeout:g} s")
                deadline = anyio.current_time() + attach_timeout
                async with kernel._serving(
                    ws, tool_socket, partial(kernel._take_over, held, token, where), deadline=deadline, late=late
                ):
                    yield kernel
            finally:
                await kernel._close()


async def _create(http: httpx.AsyncClient, config: GatewayKernel, start_timeout: float, deadline: float) -> str:
    body: dict[str, Any] = {"name": config.kernel_name}
    if config.env:
        body["env"] = dict(config.env)
    where = f"the gateway at {config.base}"
    try:
        with anyio.fail_at(deadline):
            response = await http.post(f"{config.base}/api/kernels", json=body)
    except TimeoutError:
        raise KernelStartError(f"{where} did not start a kernel within {start_timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise KernelStartError(f"{where} cannot be reached: {exc or type(exc).__name__}") from None
    if response.status_code in (401, 403):
        raise KernelStartError(f"{where} refused to start a kernel (HTTP {response.status_code}): check the token")
    if response.status_code != 201 and response.status_code != 200:
        raise KernelStartError(
            f"{where} failed to start a {config.kernel_name!r} kernel (HTTP {response.status_code})",
            output=response.text[:2000],
        )
    try:
        kernel_id = response.json()["id"]
    except (ValueError, KeyError, TypeError):
        kernel_id = None
    if not isinstance(kernel_id, str) or not kernel_id or len(kernel_id) > 128 or "/" in kernel_id:
        raise KernelStartError(
            f"{where} answered the kernel start without a usable kernel id", output=response.text[:2000]
        )
    return kernel_id


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as set at
    the first call), built once per process: httpx would load the whole CA bundle for every client,
    that is every kernel start, costing tens of ms and fragmenting the host's heap (docs/remote.md)."""
    return httpx.create_ssl_context()
