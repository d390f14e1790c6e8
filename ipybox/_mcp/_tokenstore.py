"""Where OAuth tokens of remote MCP servers live: on the host, readable by the user alone.

A `TokenStore` keeps one record per server URL (its tokens, when they expire, and the OAuth client
registered for it). The default, `FileTokenStore`, writes one 0600 file per server in a 0700
directory under the user's data directory, which the sandbox never mounts: tokens are never in
the tools directory, its manifest, the generated packages or the kernel's environment.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ipybox._exceptions import UsageError
from ipybox._privatefile import replace_private_file

__all__ = ("FileTokenStore", "TokenStore", "default_token_dir", "refuse_token_dir_in")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PRIVATE = 0o077


@runtime_checkable
class TokenStore(Protocol):
    """Keeps the OAuth record of each remote MCP server, by the server's URL.

    A record is a JSON-compatible mapping (tokens, their expiry, the registered client) that only
    ipybox reads and writes. Implementations must keep it where only the user can read it and
    where kernel code cannot reach it (the OS keyring, a secrets manager, a private file).
    Methods are called from the host's event loop and should return quickly.
    """

    def load(self, url: str) -> Mapping[str, Any] | None:
        """The record saved for ``url``, or None."""
        ...

    def save(self, url: str, record: Mapping[str, Any]) -> None:
        """Replace the record of ``url``."""
        ...

    def delete(self, url: str) -> None:
        """Forget the record of ``url`` (no error if there is none)."""
        ...


def default_token_dir() -> Path:
    """``$XDG_DATA_HOME/ipybox/oauth``, or ``~/.local/share/ipybox/oauth``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "ipybox" / "oauth"


class FileTokenStore:
    """One private JSON file per server URL in a private directory of the user's.

    The directory is created 0700 and each file 0600, written atomically, opened without following
    symlinks. A directory or file of another user's, one that others can write, or a file others
    can read is refused with an error that names it: its tokens may have been read or planted.

    Args:
        directory: Where the files go; default `default_token_dir` (resolved when used).
    """

    def __init__(self, directory: Path | str | None = None) -> None:
        self._directory = Path(directory) if directory is not None else None

    @property
    def directory(self) -> Path:
        """The directory the files are in."""
        return self._directory if self._directory is not None else default_token_dir()

    def path(self, url: str) -> Path:
        """The file that holds the record of ``url``."""
        return self.directory / _file_name(url)

    def load(self, url: str) -> Mapping[str, Any] | None:
        directory = self._open_dir(create=False)
        if directory is None:
            return None
        try:
            try:
                fd = os.open(
                    _file_name(url), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory
                )
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UsageError(self._refusal(url, "is a symlink")) from None
                raise
        finally:
            os.close(directory)
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(self._refusal(url, "is not a regular file"))
            if info.st_uid != os.getuid():
                raise UsageError(self._refusal(url, f"belongs to uid {info.st_uid}"))
            if info.st_mode & _PRIVATE:
                raise UsageError(
                    self._refusal(
                        url, f"has mode {oct(stat.S_IMODE(info.st_mode))}, not 0600, so others may have read it"
                    )
                )
            raw = file.read()
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict) or record.get("url") != url:  # pyright: ignore[reportUnknownMemberType]
            # Unreadable, or written for another URL: nothing to use; the next flow replaces it.
            return None
        return record  # pyright: ignore[reportUnknownVariableType]

    def save(self, url: str, record: Mapping[str, Any]) -> None:
        text = json.dumps({**record, "url": url}, sort_keys=True)
        directory = self._open_dir(create=True)
        assert directory is not None
        try:
            replace_private_file(directory, _file_name(url), text)
        finally:
            os.close(directory)

    def delete(self, url: str) -> None:
        directory = self._open_dir(create=False)
        if directory is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_file_name(url), dir_fd=directory)
        finally:
            os.close(directory)

    def _open_dir(self, *, create: bool) -> int | None:
        path = self.directory
        if create:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UsageError(
                    f"the OAuth token directory {str(path)!r} is a symlink or not a directory; ipybox does not "
                    "follow links there: remove it (the next authorization creates it again)"
                ) from None
            raise
        info = os.fstat(fd)
        problem = None
        if info.st_uid != os.getuid():
            problem = f"belongs to uid {info.st_uid}, not to this process (uid {os.getuid()})"
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"can be written by others (mode {oct(stat.S_IMODE(info.st_mode))}), who could plant tokens"
        if problem is not None:
            os.close(fd)
            raise UsageError(
                f"the OAuth token directory {str(path)!r} {problem}; remove it (the next authorization "
                "creates it again, private)"
            )
        if info.st_mode & _PRIVATE:
            os.fchmod(fd, 0o700)  # mkdir's mode went through the umask, or the directory predates us
        return fd

    def _refusal(self, url: str, problem: str) -> str:
        return (
            f"the OAuth token file {str(self.path(url))!r} of {url} {problem}; ipybox will not use it. Revoke the "
            "server's tokens if they may have leaked, delete the file, and authorize again"
        )


def _file_name(url: str) -> str:
    # A digest, not the URL: a file name from a URL could hold '/' or '..'.
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:40] + ".json"


def refuse_token_dir_in(store: TokenStore, visible: Sequence[Path | str]) -> None:
    """Refuse a sandbox that would mount the token store's directory, or ipybox's data directory
    (the MCP server's token files), into the kernel: a workspace or sandbox path that contains it.

    The kernel could read every token there (it runs as the host's user), or plant a record of its
    own for a server URL (its files pass every check of `FileTokenStore`). A mount over the
    directory would not do: kernel code can rename a writable parent away and the host would then
    write new tokens where the kernel reads them.

    Raises:
        UsageError: Naming the path and the fix.
    """
    private = [default_token_dir().parent]
    if isinstance(store, FileTokenStore):
        private.append(store.directory)
    for path in visible:
        shown = os.path.realpath(path)
        for directory in private:
            if Path(os.path.realpath(directory)).is_relative_to(shown):
                raise UsageError(
                    f"the kernel would see {str(directory)!r} (OAuth tokens and server tokens of ipybox, kept from "
                    f"kernel code) through {str(path)!r}, which the sandbox mounts: use a workspace and sandbox "
                    "paths that do not contain it, or give OAuth(store=FileTokenStore(directory=...)) elsewhere "
                    "and set XDG_DATA_HOME"
                )
