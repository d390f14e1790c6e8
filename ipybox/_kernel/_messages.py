"""The Jupyter messages the host reads from a kernel, checked and parsed into typed events.

Everything here comes from kernel code's reach (it holds the kernel's key), so each check is made
before the work it saves: whom a message is for and what it is (two small frames), then the
execution's output budget, and only then the signature and the content.
"""

from __future__ import annotations

import hmac
import json
import re
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio

from ipybox_kernel._protocol import MARK_TYPE

__all__ = (
    "OUTPUT_TYPES",
    "READ_TYPES",
    "Display",
    "Dropped",
    "Error",
    "Inbox",
    "KernelEvent",
    "Mark",
    "Reply",
    "Stream",
    "decode",
    "execution_events",
    "message_limit",
    "parse",
    "strip_ansi",
)

# Messages waiting for one request's consumer before the reader waits for it: by count (small
# messages) and by bytes as received (large ones; a single message always fits).
_QUEUE_MESSAGES = 1024
_QUEUE_BYTES = 8 * 1024 * 1024
# ipykernel encodes JSON with ensure_ascii=False, so one character takes at most 6 bytes (a control
# character escaped as \u001f).
_JSON_BYTES_PER_CHAR = 6
# Room in one message beyond its output: headers, metadata, field names, a trimmed traceback's markers.
_MESSAGE_OVERHEAD = 256 * 1024
# Header and parent header are a few hundred bytes; larger ones are not parsed.
_MAX_HEADER_BYTES = 64 * 1024
# Output messages: counted against the execution's byte budget, and dropped beyond it.
OUTPUT_TYPES = frozenset({"stream", "display_data", "execute_result"})
# A mark's content is ``{"mark": <int>}``; one larger was not made by ipybox_kernel and is not parsed.
_MAX_MARK_BYTES = 64
# Everything the host reads; other messages (execute_input, comms, ...) are dropped unparsed.
READ_TYPES = OUTPUT_TYPES | {"error", "execute_reply", "status", "kernel_info_reply", MARK_TYPE}
# Separates ZMQ routing identities from the signed parts of a Jupyter message.
_DELIMITER = b"<IDS|MSG>"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class Stream:
    name: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True, slots=True)
class Display:
    kind: Literal["execute_result", "display_data"]
    data: Mapping[str, Any]
    metadata: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Error:
    ename: str
    evalue: str
    traceback: list[str]


@dataclass(frozen=True, slots=True)
class Reply:
    status: Literal["ok", "error", "aborted"]
    execution_count: int | None


@dataclass(frozen=True, slots=True)
class Dropped:
    """Output the host dropped unread because the execution's messages exceeded their budget.

    Attributes:
        size: How much, in bytes as the kernel sent it (JSON).
    """

    size: int


@dataclass(frozen=True, slots=True)
class Mark:
    """The kernel's mark behind the output a cell sent before a tool call (ipybox._engine._outputmarks).

    Attributes:
        id: The mark's number, which the tool request names.
    """

    id: int


KernelEvent = Stream | Display | Error | Reply | Dropped | Mark


def message_limit(output_chars: int) -> int:
    """The largest message (all its frames) the host takes from a kernel with this output limit,
    and the bytes of output messages it takes per execution.

    The kernel trims what it sends to fit (ipybox_kernel._launch: output, errors, echoed code);
    past this, a message can only come from code that forged it.
    """
    return _JSON_BYTES_PER_CHAR * output_chars + _MESSAGE_OVERHEAD


class Inbox:
    """The messages for one request, waiting for its consumer; bounded in count and bytes.

    Also the request's output budget: output messages beyond it are dropped before they are queued
    (or even parsed) and counted in ``dropped``.
    """

    def __init__(self, budget: int) -> None:
        self._queue: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._closed = False
        self._wakeup: anyio.Event | None = None
        self.budget = budget
        self.dropped = 0
        self.ended = False
        """Set by `execution_events` once the execution's end has arrived."""
        self.replied = False
        """Set once the request's reply has been delivered (``ipybox._kernel._requests``)."""
        self.idle = False
        """Set once the kernel's idle status after the request has been delivered."""

    @property
    def complete(self) -> bool:
        """The request's reply and its idle status have both been delivered."""
        return self.replied and self.idle

    def _notify(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def _wait(self) -> None:
        if self._wakeup is None:
            self._wakeup = anyio.Event()
        await self._wakeup.wait()

    def _full(self, size: int) -> bool:
        return bool(self._queue) and (len(self._queue) >= _QUEUE_MESSAGES or self._bytes + size > _QUEUE_BYTES)

    async def put(self, msg: dict[str, Any], size: int) -> None:
        """Queue a message, waiting while the queue is full; dropped if the inbox is closed."""
        while self._full(size) and not self._closed:
            await self._wait()
        if not self._closed:
            self._queue.append((msg, size))
            self._bytes += size
            self._notify()

    def close(self) -> None:
        self._closed = True
        self._notify()

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._wait()
        msg, size = self._queue.popleft()
        self._bytes -= size
        self._notify()
        return msg


async def execution_events(inbox: Inbox) -> AsyncGenerator[KernelEvent]:
    """The events of one execute request's messages, until the kernel is idle again.

    Sets ``inbox.ended`` once the execution has ended; returning without it means the inbox was
    closed first (the kernel, or the connection to it, is gone).
    """
    replied = idle = False
    async for raw in inbox:
        if raw["header"]["msg_type"] == "status":
            idle = raw["content"].get("execution_state") == "idle"
        else:
            event = parse(raw)
            if event is not None:
                replied = replied or isinstance(event, Reply)
                yield event
        # Output can still arrive on iopub after execute_reply; idle is the end of it.
        if replied and idle:
            if inbox.dropped:
                yield Dropped(inbox.dropped)
            inbox.ended = True
            return


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse(msg: dict[str, Any]) -> KernelEvent | None:
    kind = msg["header"]["msg_type"]
    content: dict[str, Any] = msg["content"]
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return Stream(name, str(content.get("text", "")))
    if kind in ("execute_result", "display_data"):
        return Display(kind, content.get("data") or {}, content.get("metadata") or {})
    if kind == "error":
        return Error(
            str(content.get("ename", "")),
            str(content.get("evalue", "")),
            [str(line) for line in content.get("traceback", [])],
        )
    if kind == "execute_reply":
        status = content.get("status")
        return Reply(
            status if status in ("ok", "error", "aborted") else "error",
            content.get("execution_count"),
        )
    if kind == MARK_TYPE:
        mark = content.get("mark")
        # bool is an int too; the bounds are ToolRequest.mark's.
        if type(mark) is int and 1 <= mark < 2**63:
            return Mark(mark)
    return None


def decode(
    frames: list[bytes], signer: hmac.HMAC, waiters: Mapping[str, Inbox]
) -> tuple[Inbox, dict[str, Any], int] | None:
    """The message in ``frames``, the inbox it goes to and its size; None if it is not wanted.

    ``signer`` is the kernel's key as an HMAC to copy; ``waiters`` maps request ids to their inboxes.

    Cheapest checks first: whom it is for and what it is (two small frames), then the budget,
    and only then the signature and the content. Output beyond the budget is counted, never
    parsed. jupyter_client's ``Session.deserialize`` also parses every date in the headers and
    keeps a history of signatures; neither is needed here, and skipping them halves the host's
    share of an execution's round trip.
    """
    try:
        start = frames.index(_DELIMITER) + 1
    except ValueError:
        return None
    if len(frames) < start + 5:
        return None
    signature, header, parent, metadata, content = frames[start : start + 5]
    if len(header) > _MAX_HEADER_BYTES or len(parent) > _MAX_HEADER_BYTES:
        return None
    try:
        parent_header: object = json.loads(parent)
        header_fields: object = json.loads(header)
    except ValueError:
        return None
    if not isinstance(parent_header, dict) or not isinstance(header_fields, dict):
        return None
    inbox = waiters.get(cast("dict[str, object]", parent_header).get("msg_id"))  # pyright: ignore[reportArgumentType]
    kind = cast("dict[str, object]", header_fields).get("msg_type")
    if inbox is None or kind not in READ_TYPES or (kind == MARK_TYPE and len(content) > _MAX_MARK_BYTES):
        return None
    size = sum(map(len, frames))
    output = kind in OUTPUT_TYPES
    if output and size > inbox.budget:
        inbox.dropped += len(content)
        return None
    mac = signer.copy()
    for part in (header, parent, metadata, content):
        mac.update(part)
    if not hmac.compare_digest(signature, mac.hexdigest().encode()):
        # Unsigned or tampered with: not from our kernel.
        return None
    try:
        body: object = json.loads(content)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if output:
        inbox.budget -= size
    return inbox, {"header": header_fields, "parent_header": parent_header, "content": body}, size
