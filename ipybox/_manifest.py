"""The host-side manifest of MCP servers whose packages were generated under a tools directory.

``<root_dir>/.ipybox/servers.json`` maps each server name to its parameters, exactly as given
(``${VAR}`` placeholders stay unresolved). It is the only place parameters are written: generated
code names a server, and the host looks its parameters up here, so code in the sandbox can neither
read nor change what the host runs. The directory is private to the owner (0700, file 0600), the
sandbox hides it, and every write replaces the file atomically under a lock. Every access opens
the directory and the file without following symlinks and checks that they are this uid's and
private before anything is read: the host runs what the file says (`ipybox._tooldir` says what these
checks cannot tell).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

from ._exceptions import UsageError
from ._mcp._servers import HttpServer, StdioServer, parse_server_params
from ._privatefile import replace_private_file

__all__ = (
    "MANIFEST_DIR",
    "MANIFEST_FILE",
    "ensure_manifest_dir",
    "load_manifest",
    "manifest_lock",
    "save_manifest_entry",
)

MANIFEST_DIR = ".ipybox"
MANIFEST_FILE = "servers.json"
_LOCK_FILE = "servers.lock"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Group and other bits: the manifest holds commands the host runs and maybe secrets.
_FOREIGN = 0o077
_REGENERATE = (
    "if you did not make it so, kernel code may have planted it (from a run without the sandbox): delete "
    "{path!r} and generate the server packages again"
)


def _open_dir(path: Path, what: str, *, dir_fd: int | None = None) -> int:
    """Open a directory without following a symlink at its last component (``path`` relative to
    ``dir_fd`` when given, but named in full in errors)."""
    try:
        return os.open(path.name if dir_fd is not None else path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UsageError(
                f"{what} {str(path)!r} is a symlink or not a directory; ipybox does not follow links there. "
                + _REGENERATE.format(path=str(path))
            ) from None
        raise


def _check_owned(info: os.stat_result, path: Path, what: str) -> None:
    if info.st_uid != os.getuid():
        raise UsageError(
            f"{what} {str(path)!r} belongs to uid {info.st_uid}, not to this process (uid {os.getuid()}); "
            + _REGENERATE.format(path=str(path))
        )


@contextmanager
def _manifest_dir(root_dir: Path, *, create: bool) -> Generator[int | None]:
    """A descriptor of ``root_dir/.ipybox`` once it is checked (None if missing and not created).

    It must be a directory (not a symlink) owned by this uid that others cannot write; one that
    others can only read (an older ipybox or a plain ``mkdir`` made it) is made 0700.
    """
    path = root_dir / MANIFEST_DIR
    root = _open_dir(root_dir, "the tools directory")
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(MANIFEST_DIR, 0o700, dir_fd=root)
        try:
            fd = _open_dir(path, "the MCP server manifest directory", dir_fd=root)
        except FileNotFoundError:
            fd = None
    finally:
        os.close(root)
    if fd is None:
        yield None
        return
    try:
        info = os.fstat(fd)
        _check_owned(info, path, "the MCP server manifest directory")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UsageError(
                f"the MCP server manifest directory {str(path)!r} can be written by others (mode "
                f"{oct(stat.S_IMODE(info.st_mode))}), who could plant commands the host would run; "
                + _REGENERATE.format(path=str(path))
            )
        if info.st_mode & _FOREIGN:
            # mkdir's mode is filtered by the umask, and the directory may predate us.
            os.fchmod(fd, 0o700)
        yield fd
    finally:
        os.close(fd)


def ensure_manifest_dir(root_dir: Path) -> None:
    """Create ``root_dir/.ipybox`` (0700) if it is missing, and check it.

    Raises:
        UsageError: It is a symlink, not a directory, not this uid's, or writable by others.
    """
    with _manifest_dir(root_dir, create=True):
        pass


@contextmanager
def manifest_lock(root_dir: Path) -> Generator[None]:
    """Hold an exclusive lock on the manifest of `root_dir` (blocking; call from a worker thread)."""
    with _manifest_dir(root_dir, create=True) as directory:
        assert directory is not None
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(_LOCK_FILE, flags, 0o600, dir_fd=directory)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(root_dir: Path) -> dict[str, object]:
    path = root_dir / MANIFEST_DIR / MANIFEST_FILE
    with _manifest_dir(root_dir, create=False) as directory:
        if directory is None:
            return {}
        try:
            # O_NONBLOCK: a planted FIFO must not hang the host; it is refused below.
            fd = os.open(MANIFEST_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UsageError(
                    f"the MCP server manifest {str(path)!r} is a symlink; " + _REGENERATE.format(path=str(path))
                ) from None
            raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(
                f"the MCP server manifest {str(path)!r} is not a regular file; " + _REGENERATE.format(path=str(path))
            )
        _check_owned(info, path, "the MCP server manifest")
        if info.st_mode & _FOREIGN:
            raise UsageError(
                f"the MCP server manifest {str(path)!r} has mode {oct(stat.S_IMODE(info.st_mode))}, not 0600; "
                + _REGENERATE.format(path=str(path))
            )
        raw = file.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"the MCP server manifest {str(path)!r} is not valid JSON ({exc}); delete it and generate the "
            "server packages again"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"the MCP server manifest {str(path)!r} is not a JSON object; delete it and generate the "
            "server packages again"
        )
    return data  # pyright: ignore[reportUnknownVariableType]


def load_manifest(root_dir: Path | str) -> dict[str, StdioServer | HttpServer]:
    """Read the parameters of every server generated under `root_dir`, by server name.

    Returns:
        An empty dict when nothing was generated there yet.

    Raises:
        UsageError: The manifest exists but is damaged, or is not the host's own (a symlink, another
            owner, readable or writable by others); the message names the file.
    """
    root = Path(root_dir)
    if not root.exists():
        return {}
    servers: dict[str, StdioServer | HttpServer] = {}
    for name, params in sorted(_read(root).items()):
        if not isinstance(params, dict):
            raise UsageError(f"the MCP server manifest under {str(root)!r} has no parameters for {name!r}")
        try:
            servers[name] = parse_server_params(params)  # pyright: ignore[reportUnknownArgumentType]
        except UsageError as exc:
            raise UsageError(f"the MCP server manifest under {str(root)!r}, server {name!r}: {exc}") from None
    return servers


def save_manifest_entry(root_dir: Path, server_name: str, params: StdioServer | HttpServer) -> None:
    """Record (or replace) the parameters of one server; call with `manifest_lock` held."""
    data = _read(root_dir)
    data[server_name] = params.model_dump(mode="json")
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    with _manifest_dir(root_dir, create=True) as directory:
        assert directory is not None
        replace_private_file(directory, MANIFEST_FILE, text)
