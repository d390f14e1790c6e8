"""Reading and writing files in the workspace from the host, safely.

The kernel can write anything into its workspace, including symlinks that point at host files
(``ln -s /root/.ssh/id_rsa out.txt``). Every host-side access therefore walks the path one
component at a time relative to the workspace with ``O_NOFOLLOW``, so it can never leave it.

It can also make a file of any size (``os.truncate(f, 100 * 2**30)`` makes a sparse one at once)
and keep growing it while the host reads. Reads are therefore capped, checked against the size
before reading and enforced while reading, and copies go in chunks, never through memory whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Generator
from pathlib import Path, PurePosixPath

from ._exceptions import UsageError

__all__ = ("FileTooLarge", "copy_file", "read_file", "write_file")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Bytes moved per system call when copying: few calls, and nothing large held at once.
_CHUNK = 1024 * 1024


class FileTooLarge(UsageError):
    """A workspace file is larger than the caller's cap (or grew past it while it was read).

    Attributes:
        size: Its size when it was refused, in bytes (at least this much if it grew).
        limit: The cap, in bytes.
    """

    def __init__(self, path: str | os.PathLike[str], size: int, limit: int, *, grew: bool, fix: str) -> None:
        how = (
            f"grew past {limit} bytes while it was read (the kernel may still be writing it)"
            if grew
            else f"is {size} bytes, more than the limit of {limit} bytes"
        )
        super().__init__(f"{str(path)!r} in the workspace {how}; {fix}")
        self.size = size
        self.limit = limit


def _parts(relative: str | os.PathLike[str]) -> list[str]:
    path = PurePosixPath(os.fspath(relative))
    if path.is_absolute():
        # Absolute paths are accepted when they point into the workspace; see _relative().
        raise UsageError(f"workspace path {str(relative)!r} must be relative to the workspace")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UsageError(f"workspace path {str(relative)!r} must name a file inside the workspace")
    return parts


def _relative(workspace: Path, path: str | os.PathLike[str]) -> list[str]:
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(workspace)
        except ValueError:
            raise UsageError(
                f"path {str(path)!r} is outside the workspace {str(workspace)!r}; give a path relative to the workspace"
            ) from None
    return _parts(p)


@contextlib.contextmanager
def _open_parent(workspace: Path, parts: list[str], *, create: bool) -> Generator[int]:
    fd = os.open(workspace, _DIR_FLAGS)
    try:
        for name in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UsageError(
                        f"{name!r} in the workspace is a symlink or not a directory; "
                        "ipybox does not follow links out of the workspace"
                    ) from None
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def write_file(workspace: Path, path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a file in the workspace (replacing it), creating parent directories."""
    parts = _relative(workspace, path)
    with _open_parent(workspace, parts, create=True) as parent:
        tmp = f".{parts[-1]}.ipybox-tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            # rename() replaces a symlink itself, never the file it points to.
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
    return workspace.joinpath(*parts)


@contextlib.contextmanager
def _open_regular(workspace: Path, path: str | os.PathLike[str]) -> Generator[int]:
    """A descriptor of a regular file in the workspace, refusing symlinks and special files."""
    parts = _relative(workspace, path)
    with _open_parent(workspace, parts, create=False) as parent:
        try:
            # O_NONBLOCK: opening a FIFO the kernel planted must not wait for a writer.
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageError(f"{str(path)!r} in the workspace is a symlink; ipybox does not follow it") from None
            raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{str(path)!r} in the workspace is not a regular file")
        yield fd
    finally:
        os.close(fd)


def read_file(workspace: Path, path: str | os.PathLike[str], *, max_bytes: int, fix: str) -> bytes:
    """Read a regular file from the workspace, refusing symlinks and special files.

    Raises:
        FileTooLarge: It has more than ``max_bytes`` (its message ends with ``fix``).
    """
    with _open_regular(workspace, path) as fd:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise FileTooLarge(path, size, max_bytes, grew=False, fix=fix)
        chunks: list[bytes] = []
        read = 0
        # One byte past the cap tells a file that grew since fstat from one that is exactly full.
        while chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - read)):
            chunks.append(chunk)
            read += len(chunk)
            if read > max_bytes:
                raise FileTooLarge(path, read, max_bytes, grew=True, fix=fix)
        return b"".join(chunks)


def copy_file(
    workspace: Path, path: str | os.PathLike[str], destination: Path, *, max_bytes: int | None, fix: str
) -> int:
    """Copy a regular file from the workspace to a host path in chunks; returns the bytes copied.

    The copy goes to a new file next to ``destination`` that replaces it only once complete, so a
    refused or failed copy leaves ``destination`` as it was.

    Raises:
        FileTooLarge: It has more than ``max_bytes`` (None: no cap), before or while it is copied.
    """
    with _open_regular(workspace, path) as fd:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise FileTooLarge(path, size, max_bytes, grew=False, fix=fix)
        partial = destination.with_name(f".{destination.name}.ipybox-{secrets.token_hex(4)}")
        out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            try:
                copied = 0
                while True:
                    room = _CHUNK if max_bytes is None else min(_CHUNK, max_bytes + 1 - copied)
                    sent = os.sendfile(out, fd, None, room)
                    if sent == 0:
                        break
                    copied += sent
                    if max_bytes is not None and copied > max_bytes:
                        raise FileTooLarge(path, copied, max_bytes, grew=True, fix=fix)
            finally:
                os.close(out)
            os.replace(partial, destination)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        return copied
