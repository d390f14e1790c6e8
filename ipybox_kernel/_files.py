"""Files copied between the host and a kernel on a remote gateway, over the kernel protocol itself.

The gateways have no files API and the kernel has no network path to the host, so the host's
`CodeExecutor.upload` and ``download`` call `serve` in the ``user_expressions`` of silent execute
requests, one request per chunk of at most a few hundred KiB to 1 MiB (ipybox._gateway._transfer).
ipykernel runs them on the shell thread like any cell, and returns the plain-text repr of each
answer in the ``execute_reply``.

An answer is ASCII words separated by spaces, with data as base64, so that its repr is the text in
quotes and nothing else: ``ok [values...]``, ``refused <why>`` (a caller's mistake: a symlink, a
missing or special file) or ``failed <errno>``. The host checks every answer: kernel code can
replace this module's functions.

Paths are relative to the kernel's working directory when the host set it up (recorded at import,
which ``_remote.install`` does before any user code runs) and are walked one component at a time
with ``O_NOFOLLOW``, as the host walks a local workspace: no symlink is followed.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ("WORKSPACE", "serve")

WORKSPACE = os.getcwd()
# Open transfers kept at once: the host runs one at a time and closes it; more are left over from a
# host that was cancelled or lost, and the oldest is closed.
_KEPT = 8
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Refused(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class _Open:
    fd: int
    # A file being written: its directory and temporary name, renamed to ``name`` at commit.
    parent: int | None = None
    temp: str = ""
    name: str = ""
    written: int = 0


_open: dict[str, _Open] = {}


def serve(op: str, tid: str, *args: object) -> str:
    """Run one step of a transfer for the host and return the answer (see the module docstring)."""
    try:
        values = _OPS[op](tid, *args)
    except _Refused as exc:
        return f"refused {exc.why}"
    except OSError as exc:
        return f"failed {exc.errno or 0}"
    return " ".join(["ok", *map(str, values)])


def _walk(parts: list[str], *, create: bool) -> int:
    """A descriptor of the directory that holds ``parts[-1]``, reached without following symlinks."""
    fd = os.open(WORKSPACE, _DIR)
    for name in parts[:-1]:
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, _DIR, dir_fd=fd)
        except OSError as exc:
            raise _refusal(exc, last=False) from None
        finally:
            os.close(fd)
        fd = child
    return fd


def _refusal(exc: OSError, *, last: bool) -> Exception:
    """What to raise for an error opening a path component: a refusal for the caller's mistakes."""
    if exc.errno == errno.ENOENT:
        return _Refused("missing")
    if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and not last):
        return _Refused("symlink" if last else "notdir")
    return exc


def _keep(tid: str, entry: _Open) -> None:
    _open[tid] = entry
    while len(_open) > _KEPT:
        _close(next(iter(_open)))


def _open_read(tid: str, parts: list[str]) -> tuple[int]:
    parent = _walk(parts, create=False)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
    except OSError as exc:
        raise _refusal(exc, last=True) from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _Refused("special")
    _keep(tid, _Open(fd))
    return (info.st_size,)


def _read(tid: str, offset: int, size: int) -> tuple[int, str]:
    fd = _get(tid).fd
    chunks: list[bytes] = []
    got = 0
    # A regular file reads short only at its end, but keep asking until it says so.
    while got < size and (chunk := os.pread(fd, size - got, offset + got)):
        chunks.append(chunk)
        got += len(chunk)
    return offset, base64.b64encode(b"".join(chunks)).decode("ascii")


def _open_write(tid: str, parts: list[str]) -> tuple[()]:
    parent = _walk(parts, create=True)
    temp = f".{parts[-1]}.ipybox-{tid[:8]}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
    except BaseException:
        os.close(parent)
        raise
    _keep(tid, _Open(fd, parent, temp, parts[-1]))
    return ()


def _write(tid: str, offset: int, data: str) -> tuple[int]:
    entry = _get(tid)
    if offset != entry.written:
        raise _Refused("order")
    raw = base64.b64decode(data, validate=True)
    view = memoryview(raw)
    while view:
        view = view[os.write(entry.fd, view) :]
    entry.written += len(raw)
    return (entry.written,)


def _commit(tid: str) -> tuple[()]:
    entry = _get(tid)
    # rename() replaces a symlink at the destination itself, never the file it points to.
    os.rename(entry.temp, entry.name, src_dir_fd=entry.parent, dst_dir_fd=entry.parent)
    entry.temp = ""
    _close(tid)
    return ()


def _finish(tid: str) -> tuple[()]:
    _close(tid)
    return ()


def _get(tid: str) -> _Open:
    entry = _open.get(tid)
    if entry is None:
        raise _Refused("unknown")
    return entry


def _close(tid: str) -> None:
    """Close a transfer; a write that was not committed leaves nothing behind."""
    entry = _open.pop(tid, None)
    if entry is None:
        return
    os.close(entry.fd)
    if entry.parent is not None:
        if entry.temp:
            with contextlib.suppress(OSError):
                os.unlink(entry.temp, dir_fd=entry.parent)
        os.close(entry.parent)


_OPS: dict[str, Callable[..., tuple[object, ...]]] = {
    "open_read": _open_read,
    "read": _read,
    "open_write": _open_write,
    "write": _write,
    "commit": _commit,
    "close": _finish,
}
