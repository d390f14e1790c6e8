"""Replacing a file only its owner may read (the server manifest, OAuth tokens) inside a directory
the caller holds open, so that no path component is followed again."""

from __future__ import annotations

import contextlib
import os
import secrets

__all__ = ("replace_private_file",)


def replace_private_file(directory: int, name: str, text: str) -> None:
    """Write ``text`` to ``name`` in the open ``directory`` as a new 0600 file renamed into place.

    Readers see the old file or the whole new one, never a part; the mode is 0600 from the start,
    so what it holds is never readable by others, not even for a moment; ``rename`` replaces a
    symlink planted at ``name`` itself, never what it points to.
    """
    tmp = f".{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise
