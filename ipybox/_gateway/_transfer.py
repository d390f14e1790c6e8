"""`CodeExecutor.upload` and ``download`` for a kernel on a gateway, over the kernel protocol itself.

The gateways have no files API, and the kernel gets no network path to the host, so a transfer is
a series of silent execute requests whose ``user_expressions`` call ``ipybox_kernel._files.serve``
(see there): open the file, then one request per chunk, then commit or close. The host sends an
upload's data in the requests (1 MiB per request, far below the 10 MiB tornado takes from a
client) and reads a download's from the replies, each chunk small enough that its reply stays
within the message limit the host holds the kernel to. Only one chunk is in flight, so the host
holds one chunk at a time whatever the file's size.

Every answer comes from kernel code, which can replace ``serve``: it must have the one form ipybox
sends (ASCII words in quotes), a chunk must be at the offset asked for and no longer than asked for,
a file is capped by ``max_bytes`` whatever size the kernel announced, a request is answered within
`GatewayKernel.transfer_timeout` (then the kernel is interrupted, and restarted if it does not stop
within the executor's interrupt grace), and a request for which the kernel sends more than a few
other messages is given up. A download is written to a temporary file next to its destination that
replaces it only once complete.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import re
import secrets
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

import anyio

from ipybox._exceptions import FileTransferError, IpyboxError, UsageError
from ipybox._kernel._supervisor import KernelSupervisor
from ipybox._workspace import FileTooLarge

if TYPE_CHECKING:
    from ipybox._gateway._remotekernel import RemoteKernel

__all__ = ("RemoteFiles", "remote_parts")

logger = logging.getLogger(__name__)

# Bytes of an upload per request: fewer round trips, while the request (as base64, in JSON) stays
# far below the 10 MiB tornado accepts from a client.
_UPLOAD_CHUNK = 1024 * 1024
# Bytes of a download per request, at most; less when the kernel's message limit is lower.
_DOWNLOAD_CHUNK = 1024 * 1024
# What a reply carries beyond its chunk's base64: the message's header, JSON, the repr's quotes.
_REPLY_ROOM = 128 * 1024
# The one form of an answer (see ipybox_kernel._files), as IPython's plain-text repr of the str.
_ANSWER = re.compile(r"'([A-Za-z0-9+/= ]*)'")
# Characters of an exception the kernel reports kept in an error message.
_ERROR_CHARS = 300
_REFUSALS = {
    "missing": "does not exist",
    "notdir": "is not reachable: a directory on its way is a symlink or not a directory, and ipybox does not "
    "follow links",
    "symlink": "is a symlink; ipybox does not follow it",
    "special": "is not a regular file",
}


def remote_parts(path: str | os.PathLike[str]) -> list[str]:
    """The components of a path in a remote kernel's working directory, checked.

    Raises:
        UsageError: It is absolute, leaves the directory, or names nothing.
    """
    text = os.fspath(path)
    if not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"a path in the kernel's working directory must be a str, got {path!r}")
    pure = PurePosixPath(text)
    if pure.is_absolute():
        raise UsageError(
            f"path {text!r} is absolute; a file of a kernel on a gateway is named relative to the kernel's "
            "working directory"
        )
    parts = [part for part in pure.parts if part != "."]
    if not parts or ".." in parts or "\0" in text:
        raise UsageError(f"path {text!r} must name a file inside the kernel's working directory")
    return parts


class RemoteFiles:
    """Copies files to and from an executor's kernel on a gateway.

    Args:
        kernels: The executor's kernel supervisor (a transfer uses its kernel, starting one if needed).
        lock: The executor's execution lock.
        grace: Seconds an interrupted kernel gets to stop before it is restarted.
    """

    def __init__(self, kernels: KernelSupervisor, lock: anyio.Lock, grace: float) -> None:
        self._kernels = kernels
        self._lock = lock
        self._grace = grace

    async def _kernel(self) -> RemoteKernel:
        from ipybox._gateway._remotekernel import RemoteKernel

        kernel = await self._kernels.get()
        assert isinstance(kernel, RemoteKernel)
        return kernel

    async def upload(self, src: Path | str, dst: str | os.PathLike[str]) -> Path:
        """Copy a host file into the kernel's working directory; returns ``dst`` relative to it."""
        parts = remote_parts(dst)
        # Under the executor's lock, as an execution: the kernel's shell runs one request at a time
        # anyway, so a transfer sent during a running code action would only queue behind it in the
        # kernel while its deadline ran, and an execution's timeout (an interrupt) could land in a
        # transfer's request, or a transfer's in the code action. Taking turns keeps the two apart:
        # a code action before the transfer sees the old file, one after it the new one.
        async with await anyio.open_file(src, "rb") as source, self._lock:
            kernel = await self._kernel()
            steps = _Steps(kernel, "/".join(parts), kernel.config.transfer_timeout, self._grace)
            await steps.call("open_write", parts)
            try:
                sent = 0
                while chunk := await source.read(_UPLOAD_CHUNK):
                    answer = await steps.call("write", sent, base64.b64encode(chunk).decode("ascii"))
                    sent += len(chunk)
                    if steps.numbers(answer, 1) != [sent]:
                        raise steps.broken(f"it reported {answer} bytes written where {sent} were sent")
                await steps.call("commit")
            except BaseException:
                await steps.close()  # the kernel removes the temporary file
                raise
        return Path(*parts)

    async def download(self, src: str | os.PathLike[str], dst: Path, *, max_bytes: int | None, fix: str) -> int:
        """Copy a file from the kernel's working directory to ``dst`` on the host; returns its size.

        Raises:
            FileTooLarge: It has more than ``max_bytes``, as announced or as sent.
        """
        parts = remote_parts(src)
        path = "/".join(parts)
        async with self._lock:  # see upload
            kernel = await self._kernel()
            chunk = min(_DOWNLOAD_CHUNK, (kernel.frame_limit - _REPLY_ROOM) // 4 * 3)
            steps = _Steps(kernel, path, kernel.config.transfer_timeout, self._grace)
            opened = await steps.call("open_read", parts)
            try:
                [size] = steps.numbers(opened, 1)
                if max_bytes is not None and size > max_bytes:
                    raise FileTooLarge(path, size, max_bytes, grew=False, fix=fix)
                partial = dst.with_name(f".{dst.name}.ipybox-{secrets.token_hex(4)}")
                try:
                    async with await anyio.open_file(partial, "xb") as out:
                        received = 0
                        while True:
                            # One byte past the cap tells a file that grew from one that is exactly full.
                            want = chunk if max_bytes is None else min(chunk, max_bytes + 1 - received)
                            data = steps.chunk(await steps.call("read", received, want), received, want)
                            await out.write(data)
                            received += len(data)
                            if max_bytes is not None and received > max_bytes:
                                raise FileTooLarge(path, received, max_bytes, grew=True, fix=fix)
                            if len(data) < want:
                                break
                    await anyio.to_thread.run_sync(os.replace, partial, dst)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(partial)
                    raise
            finally:
                await steps.close()
        return received


class _Steps:
    """The requests of one transfer, and the checks of their answers."""

    def __init__(self, kernel: RemoteKernel, path: str, timeout: float, grace: float) -> None:
        self._kernel = kernel
        self._path = path
        self._timeout = timeout
        self._grace = grace
        self._tid = secrets.token_hex(16)
        self._usable = True

    async def call(self, op: str, *args: object) -> list[str]:
        """Run one step in the kernel and return the values of its ``ok`` answer.

        Raises:
            UsageError: The kernel refused the path (a symlink, a missing or special file).
            FileTransferError: The kernel failed the step, answered in a wrong form, or not in time.
            KernelConnectionLost: The kernel was lost.
        """
        arguments = "".join(f", {arg!r}" for arg in (self._tid, *args))
        expression = f"__import__('ipybox_kernel._files')._files.serve({op!r}{arguments})"
        flooded = False
        with anyio.move_on_after(self._timeout):
            try:
                content = await self._kernel.evaluate({"r": expression})
            except IpyboxError:
                self._usable = False
                raise
            if content is not None:
                return self._answer(content)
            flooded = True
        # Either way the request may still run in the kernel, ahead of everything sent after it.
        restarted = await self._unstick()
        self._usable = False
        if flooded:
            reason = self.broken("it sent many messages for one request instead of its reply").reason
        else:
            reason = f"the kernel did not answer a request within {self._timeout:g} s (GatewayKernel.transfer_timeout)"
        raise FileTransferError(self._path, reason, restarted=restarted)

    def _answer(self, content: dict[str, object]) -> list[str]:
        answer = _field(content.get("user_expressions"), "r")
        if answer.get("status") == "error":
            raised = f"{answer.get('ename')}: {answer.get('evalue')}"[:_ERROR_CHARS]
            raise self.broken(f"it raised {raised!r}")
        text = _field(answer, "data").get("text/plain")
        match = _ANSWER.fullmatch(text) if isinstance(text, str) else None
        if content.get("status") != "ok" or answer.get("status") != "ok" or match is None:
            raise self.broken("its answer does not have the form ipybox_kernel._files sends")
        words = match[1].split(" ")
        if words[0] == "ok":
            return words[1:]
        if words[0] == "refused" and len(words) == 2 and words[1] in _REFUSALS:
            raise UsageError(f"{self._path!r} in the kernel's working directory {_REFUSALS[words[1]]}")
        if words[0] == "failed" and len(words) == 2 and words[1].isdigit() and len(words[1]) <= 5:
            number = int(words[1])
            reason = f"the kernel's file system failed: {os.strerror(number)} (errno {number})"
            raise FileTransferError(self._path, reason)
        raise self.broken("its answer does not have the form ipybox_kernel._files sends")

    def numbers(self, values: list[str], count: int) -> list[int]:
        """``count`` non-negative integers, or the transfer is broken."""
        if len(values) != count or not all(v.isdigit() and len(v) <= 20 for v in values):
            raise self.broken(f"it answered {' '.join(values)[:100]!r} where {count} number(s) were expected")
        return [int(v) for v in values]

    def chunk(self, values: list[str], offset: int, want: int) -> bytes:
        """The data of a ``read`` answer, which must be at ``offset`` and at most ``want`` bytes."""
        if len(values) != 2:
            raise self.broken("its answer to a read has no data")
        [at] = self.numbers(values[:1], 1)
        if at != offset:
            raise self.broken(f"it sent the chunk at offset {at} when the one at {offset} was asked for")
        try:
            # At most the websocket's message limit: decoded whole, then measured.
            data = base64.b64decode(values[1], validate=True)
        except binascii.Error:
            raise self.broken("its chunk is not base64") from None
        if len(data) > want:
            raise self.broken(f"it sent more than the {want} bytes asked for")
        return data

    def broken(self, what: str) -> FileTransferError:
        return FileTransferError(self._path, f"the kernel broke the transfer's protocol: {what}")

    async def close(self) -> None:
        """Close the transfer in the kernel (a write not committed is removed); best effort."""
        if not self._usable or self._kernel.exited.is_set():
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.call("close")
            except IpyboxError as exc:
                logger.warning("closing the transfer of %r in the kernel on the gateway failed: %s", self._path, exc)

    async def _unstick(self) -> bool:
        """Interrupt a kernel that did not answer; restart it if it does not answer a probe within
        the grace. Returns whether it was restarted."""
        self._kernel.interrupt()
        with anyio.move_on_after(self._grace):
            # The shell runs requests in turn: the probe's reply means the stuck request has ended.
            with contextlib.suppress(IpyboxError):
                await self._kernel.evaluate({})
            return self._kernel.exited.is_set()
        await self._kernel.kill_and_wait()
        return True


def _field(mapping: object, key: str) -> dict[str, Any]:
    """``mapping[key]`` if both are dicts (parsed JSON from the kernel), else an empty dict."""
    value: object = cast("dict[str, Any]", mapping).get(key) if isinstance(mapping, dict) else None
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}
