"""What a cell printed before a tool call reaches the host before the call's approval request.

Output leaves the kernel on IOPub: the streams buffer what is printed and ipykernel's IOPub thread
sends it (``display()`` hands its message to that thread at once), and output written to file
descriptors 1 and 2 first waits in a pipe for a watcher thread. A tool request leaves on the tool
socket (on a remote kernel, as a comm message the host passes on to that socket). The host reads
the two independently, so without more it could show a call's ``ApprovalRequest`` before the text
printed to explain it; in a loop of ``print`` + call it did so nearly every time.

So before a request is sent, `OutputMarks.before_call`

1. moves what waits in the fd 1/2 pipes into the streams (local kernels: ``ipybox_kernel._stream``),
2. queues what both streams buffer as messages on the IOPub thread,
3. queues an ``ipybox_mark`` message ``{"mark": n}`` with the cell's parent header behind them,

and the request carries ``"mark": n``. IOPub keeps the order in which messages were queued, so once
the host has taken in mark n for the cell, it has taken in everything the cell sent before the call.
The host shows the call only then, or after a short deadline (``ipybox._engine._outputmarks``).

No new mark is sent when it cannot change anything. The streams and ``display()`` count every output
message they send; when none has been sent since the cell began, nothing of the cell can be on its
way and the request carries no mark; when none has been sent since the cell's last mark, that mark
already follows all of the cell's output and the request carries it again. A loop of calls that
prints nothing costs a flush check and a lock per call, not a message.

Not covered: calls from forked children and subprocesses (they have no IOPub thread of the kernel's;
their requests carry no mark); what a forked Python child prints, which ipykernel relays to the
IOPub thread over a socket of its own, outside this order; and output written to fd 1/2 in a remote
kernel, whose streams are ipykernel's own: their pipe watcher cannot be drained on demand.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from ._protocol import MARK_TYPE

__all__ = ("OutputMarks",)

# The messages that make up a cell's output, whose order against an approval request matters.
_OUTPUT_TYPES = frozenset({"stream", "display_data", "update_display_data", "execute_result", "clear_output", "error"})


class OutputMarks:
    """Marks the kernel's IOPub output before each tool request (see the module doc).

    Wraps ``session.send`` to count output messages; install it before anything that may drop
    messages on their way (the output guard), so that only messages really sent are counted.

    Args:
        kernel: The running ipykernel.
        session: Its session, whose ``send`` every IOPub message goes through.
        streams: ``sys.stdout`` and ``sys.stderr``, whose buffered output is queued before each mark.
        drain: Moves what waits in the fd 1/2 pipes into the streams; None where it cannot.
    """

    def __init__(self, kernel: Any, session: Any, streams: Sequence[Any], drain: Callable[[], None] | None) -> None:
        self._kernel = kernel
        self._iopub = kernel.iopub_socket
        self._send: Callable[..., Any] = session.send
        # ipybox's streams queue their output without waiting for the IOPub thread; others are flushed.
        self._send_output = [getattr(stream, "send_buffered", stream.flush) for stream in streams]
        self._drain = drain
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._marks = itertools.count(1)
        # The number of the last output message sent. Taken from a counter, never incremented in
        # place: two threads' ``+= 1`` can lose one, and a lost count would let a stale mark pass.
        self._outputs = itertools.count(1)
        self._last_output = 0
        # The cell, its latest mark (None: the cell's start) and the last output message sent before it.
        self._latest: tuple[str | None, int | None, int] = (None, None, 0)
        session.send = self._send_counted

    def _send_counted(self, stream: Any, msg_or_type: Any, *args: Any, **kwargs: Any) -> Any:
        sent = self._send(stream, msg_or_type, *args, **kwargs)
        if isinstance(msg_or_type, str):
            kind: object = msg_or_type
        else:
            kind = cast("dict[str, Any]", msg_or_type).get("header", {}).get("msg_type")
        if kind in _OUTPUT_TYPES:
            # Counted once queued: a mark taken before this reads the old number, so the next call
            # sends a new mark rather than one this message may have overtaken.
            self._last_output = next(self._outputs)
        return sent

    def begin(self) -> None:
        """A cell begins; none of its output is on its way yet (a pre_execute hook)."""
        with self._lock:
            self._latest = (_cell(self._kernel.get_parent()), None, self._last_output)

    def before_call(self, execution: str | None) -> int | None:
        """Queue the cell's output so far on IOPub and return the mark the request must carry
        (None: no mark).

        ``execution`` is the cell the request names; in a thread, the cell that started it.
        """
        if execution is None or os.getpid() != self._pid:
            return None  # a forked child's output and IOPub are not the kernel's
        parent = self._kernel.get_parent()
        if _cell(parent) != execution:
            return None
        if self._drain is not None:
            self._drain()
        for send in self._send_output:
            send()
        with self._lock:
            cell, mark, last_output = self._latest
            if cell == execution and last_output == self._last_output:
                return mark
            mark = next(self._marks)
            self._latest = (execution, mark, self._last_output)
            # The unwrapped send: a mark is not output, and must not count as such.
            self._send(self._iopub, MARK_TYPE, {"mark": mark}, parent=parent, ident=MARK_TYPE.encode())
        return mark


def _cell(parent: Any) -> str | None:
    """The msg_id of the execute request a parent header belongs to."""
    try:
        msg_id: object = parent["header"]["msg_id"]
    except (KeyError, TypeError):
        return None
    return msg_id if isinstance(msg_id, str) else None
