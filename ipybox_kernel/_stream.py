"""The kernel's stdout/stderr: ipykernel's stream with a flush that returns at once when empty.

ipykernel flushes both streams after every execution, and each flush waits for two hand-offs to
the IOPub thread even when nothing was written. For a cell like ``1+1`` that is most of a
millisecond per execution. Installed through ``IPKernelApp.outstream_class``.
"""

from __future__ import annotations

from io import StringIO
from typing import cast

from ipykernel.iostream import OutStream


class QuickFlushStream(OutStream):
    # Set by the IOPub thread while a flush it runs is between taking the buffers and queueing the
    # message: an empty buffer does not mean "sent" then, and returning early could let the
    # execution's idle status be queued ahead of this output.
    _ipybox_flushing = False

    def flush(self) -> None:
        # The order of the reads matters: a write fills the buffer and then sets _flush_pending; the
        # IOPub thread sets _ipybox_flushing, then clears _flush_pending, then takes the buffers.
        try:
            empty = not self._flush_pending and not self._ipybox_flushing and not self._buffered()
        except AttributeError:  # an ipykernel without these internals: flush the way it does
            empty = False
        if not empty:
            super().flush()

    def _flush(self) -> None:
        self._ipybox_flushing = True
        try:
            super()._flush()
        finally:
            self._ipybox_flushing = False

    def _buffered(self) -> bool:
        with self._buffer_lock:
            buffers = cast("dict[object, StringIO]", self._buffers)  # pyright: ignore[reportUnknownMemberType]
            return any(buffer.tell() for buffer in buffers.values())
