"""Reading and writing files in the workspace from the host, safely.

The kernel can write anything into its workspace, including symlinks that point at host files
(``ln -s /root/.ssh/id_rsa out.txt``). Every host-side access therefore walks the path one
component at a time relative to the workspace with ``O_NOFOLLOW``, so it can never leave it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator
from pathlib import Path, PurePosixPath

from ._exceptions import UsageError

__all__ = ("read_file", "write_file")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def read_file(workspace: Path, path: str | os.PathLike[str]) -> bytes:
    """Read a regular file from the workspace, refusing symlinks and special files."""
    parts = _relative(workspace, path)
    with _open_parent(workspace, parts, create=False) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageError(f"{str(path)!r} in the workspace is a symlink; ipybox does not follow it") from None
            raise
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UsageError(f"{str(path)!r} in the workspace is not a regular file")
            return f.read()
